"""The boundary between the engine's events and the service's: the engine's Step and Done carry only what the
engine knows, and what the service learns (thinking, tool calls, the answer against plain decoding, a busy
machine) rides on its own Said and Answered, which are what every front end receives."""

from __future__ import annotations

from dataclasses import fields

import pytest
from fakes import ScriptedModel

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Source, Stats, Step, Token
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig
from specchat.llama.template import Message, ToolCall
from specchat.service.chat import ChatService
from specchat.service.events import Answered, Said
from specchat.service.pair import LoadedPair

SAID = {"thinking", "calls"}  # what the service tells of a step
ANSWERED = {"plain_s", "slowdown", "contention", "thinking", "thinking_tokens", "thinking_s", "calls", "figures"}
JUDGED = {"speedup", "busy", "busy_why", "thinking_tokens_per_s"}  # read off what the service told
SEEDED = GenerationConfig(max_tokens=12, sampling=SamplingConfig(seed=1))  # a seeded answer teaches no curve


def names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def test_the_engines_events_carry_nothing_only_the_service_knows():
    assert not names(Step) & SAID and not names(Done) & ANSWERED
    assert not any(hasattr(Done, name) for name in JUDGED)
    # The service's carry it all, and are the engine's besides: a consumer of the engine's facts reads them as ever.
    assert names(Said) == names(Step) | SAID and names(Answered) == names(Done) | ANSWERED
    assert all(hasattr(Answered, name) for name in JUDGED)
    assert issubclass(Said, Step) and issubclass(Answered, Done)


def test_a_service_event_is_built_from_the_engines_and_keeps_what_was_told_before():
    step = Step((Token(7, "Hi", Source.DRAFT),), "Hi", 2, 1, 0.01, 0.02, "lookup", span_s=0.04)
    said = Said.of(step, thinking="hm")
    assert (said.tokens, said.text, said.guesser, said.span_s, said.thinking, said.calls) == \
        (step.tokens, "Hi", "lookup", 0.04, "hm", ())
    call = ToolCall("read", "{}", "id1")
    # The thinking split after the tool split: the calls stay, the text is the thinking's split of it.
    answered = Answered.of(Answered.of(Done("eog", "<think>x</think>Hi", (7,), Stats(n_tokens=1)), calls=(call,),
                                       reason="tool_calls"), text="Hi", thinking="x")
    assert (answered.reason, answered.text, answered.token_ids, answered.calls, answered.thinking) == \
        ("tool_calls", "Hi", (7,), (call,), "x")


def service() -> ChatService:
    return ChatService(LoadedPair(ScriptedModel(seed=1, sharpness=3.0, text=True, order=1, name="target"), None))


@pytest.mark.parametrize("judged", [False, True])
def test_every_step_and_end_the_service_passes_on_is_its_own(monkeypatch, judged):
    """Chat turns and raw completions, with a cost curve to judge the answer by and without one (plain
    decoding never needed one): no engine Step or Done reaches a front end, which reads the service's facts."""
    chat = service()
    if judged:
        chat.pair.costs.assume(CostCurve([0.01 * n for n in range(1, 17)]))
        monkeypatch.setattr(chat.pair.costs, "save", lambda: None)  # nothing of a scripted model's in the cache
    events = [*chat.chat([Message("user", "Name a colour.")], SEEDED, "lookup"),
              *chat.complete("Once upon a time", SEEDED, "lookup")]
    steps, ends = [e for e in events if isinstance(e, Step)], [e for e in events if isinstance(e, Done)]
    assert steps and len(ends) == 2
    assert all(type(e) is Said for e in steps) and all(type(e) is Answered for e in ends)
    assert all(e.plain_s > 0 for e in ends) == judged  # judged against plain decoding where a curve was there
