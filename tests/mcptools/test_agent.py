"""The agent loop over a scripted answerer and fake tools: no model, no server."""

from __future__ import annotations

from dataclasses import dataclass, field

from specchat.llama.template import Message, ToolCall
from specchat.mcptools.agent import REFUSED, Added, Choice, RoundsSpent, ToolRan, agent_loop
from specchat.mcptools.results import ToolResult


@dataclass(frozen=True)
class Done:
    """What the engine's Done will carry: the answer's text and its calls."""

    text: str
    calls: tuple[ToolCall, ...] = ()
    reason: str = "eog"


@dataclass
class Script:
    """Answers with the next of its replies each time, after a text event; records what it was asked."""

    replies: list[Done]
    asked: list[list[Message]] = field(default_factory=list)
    offered: list[bool] = field(default_factory=list)  # whether each answer was given the tools

    def __call__(self, messages, tools):
        self.asked.append(list(messages))
        self.offered.append(tools)
        reply = self.replies[min(len(self.asked), len(self.replies)) - 1]
        yield f"text of answer {len(self.asked)}"
        yield reply


@dataclass
class Tools:
    ran: list[tuple[str, str]] = field(default_factory=list)

    def __call__(self, name, arguments):
        self.ran.append((name, arguments))
        return ToolResult(f"{name} says {arguments}")


def call(n: int, name: str = "read") -> ToolCall:
    return ToolCall(name, f'{{"n": {n}}}', f"call_{n}")


USER = [Message("user", "read my notes")]


def added(events):
    return [e.message for e in events if isinstance(e, Added)]


def test_a_call_runs_and_its_result_goes_back_to_the_model_until_it_answers():
    script, tools = Script([Done("", (call(1),)), Done("Your notes say hello.")]), Tools()
    events = list(agent_loop(script, USER, tools, lambda c: Choice.ONCE, max_rounds=4))
    tool_message = Message("tool", 'read says {"n": 1}', tool_call_id="call_1")
    assert added(events) == [Message("assistant", "", tool_calls=(call(1),)), tool_message,
                             Message("assistant", "Your notes say hello.")]
    assert tools.ran == [("read", '{"n": 1}')]
    assert script.asked[1] == USER + added(events)[:2]  # the second answer sees the call and its result
    # The answer's own events pass through, in order, with the loop's between the answers.
    assert [type(e).__name__ if not isinstance(e, str) else e for e in events] == [
        "text of answer 1", "Done", "Added", "ToolRan", "Added", "text of answer 2", "Done", "Added"]


def test_a_refused_call_is_not_run_and_the_model_is_told():
    script, tools = Script([Done("", (call(1), call(2, "write"))), Done("I could not write.")]), Tools()
    events = list(agent_loop(script, USER, tools, lambda c: Choice.REFUSE if c.name == "write" else Choice.ONCE, 4))
    assert tools.ran == [("read", '{"n": 1}')]
    assert Message("tool", REFUSED, tool_call_id="call_2") in added(events)
    assert [e.refused for e in events if isinstance(e, ToolRan)] == [False, True]


def test_always_asks_once_per_tool_and_the_set_outlives_the_loop():
    script, tools = Script([Done("", (call(1),)), Done("", (call(2),)), Done("", (call(3, "write"),)), Done("ok")]), Tools()
    asked, always = [], set()

    def confirm(c):
        asked.append(c.name)
        return Choice.ALWAYS

    list(agent_loop(script, USER, tools, confirm, 10, always=always))
    assert asked == ["read", "write"] and always == {"read", "write"} and len(tools.ran) == 3


def test_the_bound_on_rounds_ends_the_loop_and_every_call_still_gets_a_tool_message():
    script, tools = Script([Done("", (call(1),))]), Tools()  # it never stops calling
    events = list(agent_loop(script, USER, tools, lambda c: Choice.ONCE, max_rounds=2))
    assert len(tools.ran) == 2 and len(script.asked) == 3
    assert script.offered == [True, True, False]  # the last answer is asked without the tools
    assert events[-1] == RoundsSpent(2)
    assert added(events)[-1] == Message("tool", "not run: the answer reached the bound of 2 rounds of tool calls",
                                        tool_call_id="call_1")


def test_a_cancelled_answer_runs_none_of_its_calls():
    script, tools = Script([Done("", (call(1),), reason="cancelled")]), Tools()
    events = list(agent_loop(script, USER, tools, lambda c: Choice.ONCE, 4))
    assert tools.ran == [] and added(events) == []


def test_an_answer_with_no_final_event_ends_the_loop():
    def broken(messages, tools):
        yield "some text"

    assert list(agent_loop(broken, USER, Tools(), lambda c: Choice.ONCE, 4)) == ["some text"]


def test_a_failed_call_goes_to_the_model_as_its_line():
    script = Script([Done("", (call(1),)), Done("It timed out.")])
    events = list(agent_loop(script, USER, lambda n, a: ToolResult.failed("read timed out after 1 s"),
                             lambda c: Choice.ONCE, 4))
    assert Message("tool", "read timed out after 1 s", tool_call_id="call_1") in script.asked[1]
    assert added(events)[-1] == Message("assistant", "It timed out.")
