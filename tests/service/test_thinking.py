"""A reasoning model's thinking, split out of the service's events: the figures it gets, and a real
tiny GGUF that carries DeepSeek R1's chat template, switched on and off."""

from __future__ import annotations

import pytest

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Source, Stats, Step, Token
from specchat.decoding.reasoning import Reasoning
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.events import Notice
from specchat.service.loader import load_pair
from specchat.service.thinking import ThinkingSplit


def step(text: str, n: int, seconds: float = 0.1) -> Step:
    tokens = tuple(Token(i, "", Source.PLAIN) for i in range(n))
    return Step(tokens, text, 0, 0, 0.0, seconds)


def run(texts: list[tuple[str, int]], reasoning: Reasoning = Reasoning()) -> list:
    steps = [step(t, n) for t, n in texts]
    stats = Stats(n_tokens=sum(n for _, n in texts), steps=len(steps), verify_s=0.1 * len(steps))
    done = Done("eog", "".join(t for t, _ in texts), (), stats)
    split = ThinkingSplit(reasoning)
    return [out for event in [*steps, done] for out in split(event)]


def test_thinking_gets_its_own_text_tokens_and_seconds_and_the_stats_still_count_it_all():
    events = run([("<think>\nFirst", 3), (" I add.", 2), ("\n</think>\n\nIt is", 4), (" 4.", 1)])
    steps, done = events[:-1], events[-1]
    assert [(s.thinking, s.text) for s in steps] == [("First", ""), (" I add.", ""), ("\n", "It is"), ("", " 4.")]
    assert (done.text, done.thinking) == ("It is 4.", "First I add.")
    # The step that closes the thinking and starts the answer counts as answer: 5 tokens were thought.
    assert (done.thinking_tokens, done.thinking_s) == (5, pytest.approx(0.2))
    assert done.stats.n_tokens == 10 and done.thinking_tokens_per_s == pytest.approx(25.0)


def test_an_answer_without_thinking_passes_through_unchanged():
    events = run([("  Plain", 2), (" answer.", 2)])
    assert [(s.thinking, s.text) for s in events[:-1]] == [("", "  Plain"), ("", " answer.")]
    assert (events[-1].text, events[-1].thinking, events[-1].thinking_tokens) == ("  Plain answer.", "", 0)


def test_an_answer_cut_inside_its_thinking_says_so_and_keeps_the_thinking():
    events = run([("<think>Still", 2), (" going", 2)])
    notice, done = events[-2:]
    assert isinstance(notice, Notice) and "ended inside its thinking" in notice.text
    assert (done.text, done.thinking, done.thinking_tokens) == ("", "Still going", 4)


# --- a real GGUF with DeepSeek R1's template ----------------------------------------------------------


@pytest.fixture(scope="module")
def service(thinker_path):
    service = ChatService(load_pair(ModelChoice(target=thinker_path, n_ctx=1024, threads=1)))
    yield service
    service.close()


ASK = [Message("user", "Why is the sky blue?")]
CONFIG = GenerationConfig(max_tokens=12)


@pytest.mark.real
def test_r1s_template_opens_the_thinking_and_the_switch_closes_it(service):
    assert service.thinking_switch == "enable_thinking"
    events = list(service.chat(ASK, CONFIG, "none", variables=service.template_variables(None)))
    done = events[-1]
    # The generation prompt ends in "<think>\n": all the random model writes is thinking, never closed.
    assert done.text == "" and done.thinking and done.thinking_tokens == done.stats.n_tokens == 12
    assert any(isinstance(e, Notice) and "inside its thinking" in e.text for e in events)
    assert "".join(e.thinking for e in events if isinstance(e, Step)).strip() == done.thinking
    off = list(service.chat(ASK, CONFIG, "none", variables=service.template_variables(False)))[-1]
    assert off.text and not off.thinking and off.thinking_tokens == 0


@pytest.mark.real
def test_the_next_prompt_leaves_the_thinking_out_where_the_template_does(service):
    done = list(service.chat(ASK, CONFIG, "none"))[-1]
    turns = [*ASK, Message("assistant", "Rayleigh scattering.", done.thinking), Message("user", "Why red at dusk?")]
    prompt = service.prompter.render(turns)
    assert "Rayleigh scattering." in prompt and done.thinking not in prompt


@pytest.mark.real
def test_a_switch_asked_of_a_template_without_one_is_refused_in_one_line(smol_path):
    service = ChatService(load_pair(ModelChoice(target=smol_path, n_ctx=512, threads=1)))
    try:
        assert service.thinking_switch is None
        assert service.template_variables(None) == {}
        with pytest.raises(SpecchatError, match="no switch for thinking"):
            service.template_variables(True)
    finally:
        service.close()
