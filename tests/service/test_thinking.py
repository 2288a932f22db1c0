"""A reasoning model's thinking, split out of the service's events: the figures it gets; a real tiny GGUF
that carries DeepSeek R1's chat template, switched on and off; and one that carries Qwen3's, which is given
an earlier answer's thinking and decides where it goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Source, Stats, Step, Token
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.events import Notice
from specchat.service.loader import load_pair
from specchat.service.reasoning import Reasoning
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


# --- a real GGUF with Qwen3's template, which reads an earlier answer's thinking -----------------------


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, smol_path):
    """A tiny random GGUF carrying Qwen3's real template, which writes the thinking of an answer after the last
    question into the prompt (that answer goes on) and leaves it out once another question comes. DeepSeek
    R1's never reads the thinking it is given: a prompt built on it holds none, whatever specchat sends."""
    from tiny_gguf import write

    template = (Path(__file__).parents[1] / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    path = write("llama", tmp_path_factory.mktemp("qwen3") / "tiny-qwen3.gguf", tokenizer_from=smol_path,
                 chat_template=template)
    service = ChatService(load_pair(ModelChoice(target=path, n_ctx=1024, threads=1)))
    yield service
    service.close()


THOUGHT = "Blue light scatters more than red on the air's molecules."


def prompt_tokens(service: ChatService, turns: list[Message]) -> int:
    """The prompt's length as the service gave it to the model (one token is decoded)."""
    return list(service.chat(turns, GenerationConfig(max_tokens=1), "none"))[-1].stats.n_prompt


@pytest.mark.real
def test_the_next_prompt_leaves_the_thinking_out_where_the_template_does(qwen3):
    answer = Message("assistant", "Rayleigh scattering.", THOUGHT)
    going_on, asked_again = [*ASK, answer], [*ASK, answer, Message("user", "Why red at dusk?")]
    # The template is given the thinking: it writes it while its answer goes on...
    assert THOUGHT in qwen3.prompter.render(going_on)
    assert prompt_tokens(qwen3, going_on) > prompt_tokens(qwen3, [*ASK, Message("assistant", answer.content)])
    # ... and leaves it out once the next question comes, so the model is given the answer alone.
    prompt = qwen3.prompter.render(asked_again)
    assert "Rayleigh scattering." in prompt and THOUGHT not in prompt
    assert prompt_tokens(qwen3, asked_again) == prompt_tokens(qwen3, [*ASK, Message("assistant", answer.content),
                                                                      asked_again[-1]])


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
