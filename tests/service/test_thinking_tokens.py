"""A reasoning model whose `<think>` and `</think>` are tokens of their own, as in Qwen3's and DeepSeek R1's
vocabularies, run by the real engine: the thinking and the answer come apart as the app and `generate --think`
show them.

No such model can be fetched here, so tests/helpers/tiny_gguf.py writes one (`write_scripted`): SmolLM2's tokenizer
with the two markers added, a reasoning template, and weights that say one fixed answer whatever the prompt.
A token's text is what `piece` gives without special tokens; llama.cpp gives a user-defined token's (which is
what Qwen3's and R1's converters make of `<think>`) and nothing of a control token's.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest
import tiny_gguf
from commands import specchat

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Step
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.events import Notice
from specchat.service.loader import load_pair

pytestmark = pytest.mark.real  # the tokenizer is copied from SmolLM2's GGUF

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
THOUGHT, ANSWER = ["Two", " and", " two"], ["Four", "!"]
# Qwen3's generation prompt leaves the model to open its thinking; R1's opens it itself ("<think>\n").
SCRIPTS = {"Qwen-Qwen3-0.6B": ["<think>", *THOUGHT, "</think>", *ANSWER],
           "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": [*THOUGHT, "</think>", *ANSWER]}
# Qwen3's and R1's own files make their markers user-defined tokens; a model may make them control tokens,
# whose piece is empty without special tokens (the markers are then shown, as llama.cpp's preserved tokens).
KINDS = [gguf.TokenType.USER_DEFINED, gguf.TokenType.CONTROL]


def scripted(out: Path, template: str, kind: gguf.TokenType, smol_path: Path) -> Path:
    return tiny_gguf.write_scripted(out, SCRIPTS[template], smol_path, added=[("<think>", kind), ("</think>", kind)],
                                    chat_template=(TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8"))


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name.lower())
@pytest.mark.parametrize("template", list(SCRIPTS))
def test_thinking_closed_by_a_marker_token_is_split_from_the_answer(tmp_path, smol_path, template, kind):
    """What the app's backend streams: each step's thinking and answer, and the Done's, without the markers; the
    closing marker came as the one token the vocabulary has for it, never as text."""
    service = ChatService(load_pair(ModelChoice(target=scripted(tmp_path / "m.gguf", template, kind, smol_path),
                                                n_ctx=512, threads=1)))
    try:
        close = service.pair.target.tokenize("</think>", add_bos=False)
        events = list(service.chat([Message("user", "What are two and two?")], GenerationConfig(max_tokens=16),
                                   "none", variables=service.template_variables(True)))
    finally:
        service.close()
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "eog" and len(close) == 1 and close[0] in done.token_ids
    steps = [e for e in events if isinstance(e, Step)]
    assert "".join(s.thinking for s in steps) == "Two and two" and "".join(s.text for s in steps) == "Four!"
    assert (done.thinking, done.text) == ("Two and two", "Four!")
    assert done.thinking_tokens == len(SCRIPTS[template]) - len(ANSWER)  # every step until the answer's first
    assert not any(isinstance(e, Notice) for e in events)


@pytest.mark.parametrize("template", list(SCRIPTS))
def test_generate_think_prints_the_thinking_to_stderr_and_the_answer_alone_to_stdout(tmp_path, smol_path, template):
    path = scripted(tmp_path / "m.gguf", template, gguf.TokenType.USER_DEFINED, smol_path)
    result = specchat("generate", "What are two and two?", "--target", str(path), "--guesser", "none", "--think",
                      "--max-tokens", "16", env={"XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Four!\n"
    assert "thinking:\nTwo and two\n" in result.stderr and "think>" not in result.stderr, result.stderr
