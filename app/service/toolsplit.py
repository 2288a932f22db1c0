"""An answer's tool calls, split out of the engine's events as they stream, where it was asked with tools.

Each Step's text comes back as what is not a call, with the calls it finished beside it (`Said.calls`); the
Done's text is the answer less its calls, its `calls` every call, and its reason "tool_calls" where the answer
made calls and ended as a turn ends (as llama-server says `finish_reason: "tool_calls"` only then). Call text
that is not a call (bad JSON, no name) is never dropped: it stays in the text, and a Notice says so.

The text is read by `specchat.llama.toolcalls.Splitter` in the format the template asks for. For JSON formats
that is the answer after the thinking is split off; Harmony's calls are messages the thinking split would take
for thought, so there the calls come out of the raw text first (`ChatService.chat` orders the two).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from specchat.decoding.events import Done, Event, Step
from specchat.errors import SpecchatError
from specchat.llama.toolcalls import Delta, Splitter, ToolCall, ToolFormat, new_id
from specchat.service.events import Answered, ChatEvent, Notice, Said

ENDED = ("eog", "stop")  # the ways an answer ends as a turn: only those make its reason "tool_calls"


class ToolSplit:
    """One answer's events, each passed on with its tool calls split out (a call per event, as ThinkingSplit is:
    the service's own loop drives it)."""

    def __init__(self, fmt: ToolFormat, ids: Callable[[], str] = new_id, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self.splitter = Splitter(fmt, ids, tools)  # the tools' schemas type Qwen3-Coder's tagged arguments
        self._read = ""  # the text given to the splitter so far
        self._content = ""  # what it released as content
        self._calls: list[ToolCall] = []

    def __call__(self, event: Event | ChatEvent) -> list[ChatEvent]:
        if isinstance(event, Step):
            delta = self._push(event.text)
            return [*self._notices(delta), Said.of(event, text=delta.content, calls=tuple(delta.calls))]
        if isinstance(event, Done):
            # The Done holds the whole text, which may run past the steps' (text held back near a stop string
            # is released at the end): the rest is read, then whatever the splitter still holds.
            rest = event.text[len(self._read):] if event.text.startswith(self._read) else ""
            delta = self._push(rest)
            flushed = self.splitter.flush()
            self._keep(flushed)
            delta.add(flushed)
            calls = tuple(self._calls)
            return [*self._notices(delta), Answered.of(event, text=self._content, calls=calls,
                                                       reason=reason_with(calls, event.reason))]
        return [event]

    def _push(self, text: str) -> Delta:
        self._read += text
        delta = self.splitter.push(text) if text else Delta()
        self._keep(delta)
        return delta

    def _keep(self, delta: Delta) -> None:
        self._content += delta.content
        self._calls += delta.calls

    @staticmethod
    def _notices(delta: Delta) -> list[ChatEvent]:
        return [Notice(error) for error in delta.errors]


def reason_with(calls: Sequence[ToolCall], reason: str) -> str:
    """An answer's reason once its calls are known: "tool_calls" where it made calls and ended as a turn ends (as
    llama-server says `finish_reason: "tool_calls"` only then), else the reason it ended with. The same for this
    machine's answers and a server's."""
    return "tool_calls" if calls and reason in ENDED else reason


def check_tools(tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any] | None) -> None:
    """A one-line error for tools or a tool_choice the template cannot be given: a tool that is not an OpenAI
    function schema, a choice that is none of "auto", "none", "required" or a named function, a named function
    that is not among the tools, or a call required with no tools to call."""
    names = []
    for n, tool in enumerate(tools):
        fn = tool.get("function")
        if tool.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise SpecchatError(f'tools[{n}] is not a function tool: give {{"type": "function", "function": '
                                '{"name": ..., "parameters": {...}}}')
        names.append(fn["name"])
    if choice is None or choice in ("auto", "none"):
        return
    if choice == "required":
        name = None
    elif isinstance(choice, Mapping) and choice.get("type") == "function" and isinstance(choice.get("function"), Mapping) \
            and isinstance(choice["function"].get("name"), str):
        name = choice["function"]["name"]
    else:
        raise SpecchatError(f'tool_choice must be "auto", "none", "required" or {{"type": "function", "function": '
                            f'{{"name": ...}}}}, not {choice!r}')
    if not tools:
        raise SpecchatError("tool_choice asks for a call, but no tools were given: give tools, or leave tool_choice out")
    if name is not None and name not in names:
        raise SpecchatError(f"tool_choice names the function {name!r}, which is not among the tools "
                            f"({', '.join(names)})")


def schemas(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tools as templates are given them: as llama.cpp's common_chat_tools_to_json_oaicompat writes them, every
    function with its name, a description ("" where none was given) and parameters ({} where none), since
    templates read them unguarded (gpt-oss's fails on a tool with no description)."""
    return [{"type": "function", "function": {"name": t["function"]["name"],
                                              "description": t["function"].get("description") or "",
                                              "parameters": t["function"].get("parameters") or {}}} for t in tools]


def tool_constraint(tools: Sequence[Mapping[str, Any]], choice: str | Mapping[str, Any] | None,
                    fmt: ToolFormat, model: Any, parallel: bool = True) -> Any:
    """The grammar that makes the answer a call where `choice` asks for one ("required": a call to any of `tools`,
    several in a row if `parallel`; a named function: a call to it), written in `fmt`, over `model`'s vocabulary
    (`specchat.decoding.toolgrammar`); None where the answer is free ("auto", or no choice). What cannot be
    enforced is a one-line SpecchatError."""
    name = choice if choice == "required" else (choice.get("function") or {}).get("name") \
        if isinstance(choice, Mapping) else None
    if name is None:
        return None
    from specchat.decoding.toolgrammar import tool_constraint as grammar  # llguidance, only when a call is forced

    model.show([*fmt.markers, fmt.end])  # the grammar's markers as text, where they are special tokens
    return grammar(tools, name, fmt, model, parallel)
