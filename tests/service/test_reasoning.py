"""A reasoning model's thinking told apart from its answer: the splitter, and the formats read from real
templates (tests/templates/, llama.cpp's copies of this year's reasoning models' templates)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from specchat.llama.template import ChatTemplate
from specchat.service.reasoning import RESPONSE, Format, Reasoning, Splitter, reasoning_of, split

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
HARMONY = Reasoning(Format.HARMONY)
SEED = Reasoning(open="<seed:think>", close="</seed:think>")
APRIEL = Reasoning(starts_open=True, open="", close="[BEGIN FINAL RESPONSE]")
GRANITE = Reasoning(wrap=RESPONSE)

CASES = [  # (text, how the template opened it, thinking, answer)
    ("<think>\nAdd them: 2 + 2 = 4.\n</think>\n\nThe answer is 4.", Reasoning(), "Add them: 2 + 2 = 4.\n",
     "The answer is 4."),
    ("Add them.\n</think>\n\nFour.", Reasoning(starts_open=True), "Add them.\n", "Four."),
    ("  indented code stays as written", Reasoning(), "", "  indented code stays as written"),
    ("<thinking> is not the tag", Reasoning(), "", "<thinking> is not the tag"),
    ("The tag later <think>is the answer's</think> text", Reasoning(), "",
     "The tag later <think>is the answer's</think> text"),
    ("<|channel|>analysis<|message|>User wants 2+2.<|start|>assistant<|channel|>final<|message|>4", HARMONY,
     "User wants 2+2.", "4"),
    ("<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>commentary<|message|>Two."
     "<|start|>assistant<|channel|>final<|message|>Done.", HARMONY, "One.\n\nTwo.", "Done."),
    ("no channels at all", HARMONY, "", "no channels at all"),
    ("<seed:think>Hmm.</seed:think>Four.", SEED, "Hmm.", "Four."),
    ("<think>not Seed's tag</think> so answer", SEED, "", "<think>not Seed's tag</think> so answer"),
    ("Add them.\n[BEGIN FINAL RESPONSE]\nFour.", APRIEL, "Add them.\n", "Four."),
    ("<think>Let me see.</think>\n<response>Four.</response>", GRANITE, "Let me see.", "Four."),
    ("<response>Just four.</response>", GRANITE, "", "Just four."),
    ("Four, not wrapped.", GRANITE, "", "Four, not wrapped."),
]


@pytest.mark.parametrize("text, reasoning, thinking, answer", CASES)
def test_thinking_and_answer_come_apart(text, reasoning, thinking, answer):
    assert split(text, reasoning) == (thinking, answer)


@pytest.mark.parametrize("text, reasoning, thinking, answer", CASES)
def test_any_split_into_pieces_gives_the_same_parts(text, reasoning, thinking, answer):
    """Text arrives a step at a time, a marker often split across steps (a speculative step brings several
    tokens): every way of cutting the text gives the same thinking and answer, and no piece of a marker."""
    rng = random.Random(0)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        splitter = Splitter(reasoning)
        out = [splitter.push(p) for p in pieces] + [splitter.flush()]
        assert ("".join(t for t, _ in out), "".join(a for _, a in out)) == (thinking, answer), pieces


def test_an_answer_that_ends_inside_its_thinking_keeps_it_as_thinking():
    splitter = Splitter()
    parts = [splitter.push("<think>\nStill weighing it"), splitter.flush()]
    assert "".join(t for t, _ in parts) == "Still weighing it" and not any(a for _, a in parts)
    assert splitter.unclosed
    finished = Splitter()
    finished.push("<think>x</think>y")
    assert not finished.unclosed and not Splitter().unclosed


def test_the_splitter_says_while_it_is_inside_the_thinking():
    splitter = Splitter()
    assert not splitter.thinking
    splitter.push("<think>hm")
    assert splitter.thinking
    splitter.push("</think>ok")
    assert not splitter.thinking


def template(name: str) -> ChatTemplate:
    return ChatTemplate((TEMPLATES / f"{name}.jinja").read_text(), name, "<s>", "</s>")


def test_the_format_and_the_opened_tag_are_read_from_real_templates():
    qwen3, r1, gpt_oss = template("Qwen-Qwen3-0.6B"), template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"), \
        template("openai-gpt-oss-120b")
    assert reasoning_of(qwen3) == Reasoning(Format.TAGS, starts_open=False)  # Qwen3 opens the tag itself
    # DeepSeek R1's generation prompt ends in "<think>\n": the answer starts inside its thinking; with the
    # switch off the template closes it, and the answer is all answer.
    assert reasoning_of(r1, r1.variables(True)) == Reasoning(Format.TAGS, starts_open=True)
    assert reasoning_of(r1, r1.variables(False)) == Reasoning(Format.TAGS, starts_open=False)
    assert reasoning_of(gpt_oss) == HARMONY
    # The markers, read off how each template writes an earlier answer's thinking (llama.cpp's
    # chat-diff-analyzer does the same), and Granite 3.3's answer wrapper, off its system prompt.
    assert reasoning_of(template("ByteDance-Seed-OSS")) == SEED
    assert reasoning_of(template("Apriel-1.6-15b-Thinker-fixed")) == APRIEL  # its prompt opens it in words
    granite = template("ibm-granite-granite-3.3-2B-Instruct")
    assert reasoning_of(granite, granite.variables(True)) == GRANITE


def test_a_template_that_refuses_a_written_answer_thinks_in_the_default_tags():
    # Some templates raise on conversations they do not expect; the markers then stay <think>…</think>.
    picky = ChatTemplate("{% for m in messages %}{% if m.role == 'assistant' %}{{ raise_exception('no') }}{% endif %}"
                         "{{ m.content }}{% endfor %}", "picky", "<s>", "</s>")
    assert reasoning_of(picky) == Reasoning()
