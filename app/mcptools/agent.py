"""The agent loop: answer, run the calls the answer makes, answer again with their results, until an answer
makes no calls or the bound on rounds is reached.

It is a pure function of what it is given: a function that answers a conversation (streaming events, the last
of which ends it with its `reason` and `calls`: the service's Answered, or any object with those attributes), a
function that runs one call (McpClient.call, or a fake), and a function that asks the user about each call. So the app, `specchat
generate --tools` and the tests run the same loop over a real model, a server, or a script.

Every call an answer makes gets a `tool` message, whatever happens to it: its result, the line saying it
failed, that the user refused it, or that the bound was reached before it ran. A template (and OpenAI's API)
expects an answer for each call, and the model learns why a call gave nothing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, MutableSet, Sequence

from specchat.llama.template import Message, ToolCall
from specchat.mcptools.results import ToolResult

REFUSED = "the user refused this call: it was not run"


class Choice(enum.Enum):
    """The user's answer to "run this call?"."""

    ONCE = "once"  # run this call
    ALWAYS = "always"  # run this call and every later call of this tool without asking
    REFUSE = "refuse"  # do not run it; the model is told so


@dataclass(frozen=True)
class Added:
    """A message the loop added to the conversation: an answer (with its calls, if any) or a call's result.
    The conversation after the loop is the one given plus these, in order."""

    message: Message


@dataclass(frozen=True)
class ToolRan:
    """One call and what came of it (`refused`: the user said no), for showing folded like the thinking."""

    call: ToolCall
    result: ToolResult
    refused: bool = False


@dataclass(frozen=True)
class RoundsSpent:
    """The answer asked for more calls after `rounds` rounds of them: they were not run, and the loop ended."""

    rounds: int


def assistant_message(done: Any) -> Message:
    """The answer as a message: its `content` (its `text` where the event has no content apart), its thinking,
    and its calls."""
    content = getattr(done, "content", None)
    return Message("assistant", content if content is not None else getattr(done, "text", ""),
                   thinking=getattr(done, "thinking", "") or "", tool_calls=tuple(done.calls))


def agent_loop(answer: Callable[[Sequence[Message], bool], Iterable[Any]], messages: Sequence[Message],
               run: Callable[[str, str], ToolResult], confirm: Callable[[ToolCall], Choice], max_rounds: int,
               always: MutableSet[str] | None = None,
               message_of: Callable[[Any], Message] = assistant_message) -> Iterator[Any]:
    """Yield each answer's events as they come, and the loop's own (Added, ToolRan, RoundsSpent) between them.

    `answer(messages, tools)` answers the conversation so far, with the tools offered or (`tools` false: the bound
    is reached) without them, so that the last answer is one in words; `run(name, arguments)` runs one call;
    `confirm(call)` asks the user, unless the tool's name is in `always` (which a Choice.ALWAYS adds to: pass the
    conversation's own set to keep it between turns). At most `max_rounds` rounds of calls run; 0 runs none.
    An answer that ends with no such event, or that was cancelled (`reason == "cancelled"`),
    ends the loop with its calls not run and nothing added."""
    allowed = always if always is not None else set()
    conversation = list(messages)
    rounds = 0
    while True:
        final = None
        for event in answer(list(conversation), rounds < max_rounds):
            yield event
            if hasattr(event, "reason") and hasattr(event, "calls"):  # the answer's end (a Step has no reason)
                final = event
        if final is None or getattr(final, "reason", "") == "cancelled":
            return
        reply = message_of(final)
        conversation.append(reply)
        yield Added(reply)
        if not reply.tool_calls:
            return
        if rounds == max_rounds:
            for call in reply.tool_calls:
                yield from _add(conversation, call, ToolResult.failed(
                    f"not run: the answer reached the bound of {max_rounds} rounds of tool calls"))
            yield RoundsSpent(rounds)
            return
        rounds += 1
        for call in reply.tool_calls:
            choice = Choice.ONCE if call.name in allowed else confirm(call)
            if choice is Choice.REFUSE:
                yield from _add(conversation, call, ToolResult(REFUSED, error=True), refused=True)
                continue
            if choice is Choice.ALWAYS:
                allowed.add(call.name)
            yield from _add(conversation, call, run(call.name, call.arguments))


def _add(conversation: list[Message], call: ToolCall, result: ToolResult, refused: bool = False) -> Iterator[Any]:
    message = Message("tool", result.text, tool_call_id=call.id)
    conversation.append(message)
    yield ToolRan(call, result, refused)
    yield Added(message)
