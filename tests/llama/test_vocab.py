"""A GGUF file's vocabulary read without its weights (specchat.llama.vocab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.decoding.guessers.sources import Passage
from specchat.llama.model import Model
from specchat.llama.template import ChatPrompter, Message
from specchat.llama.vocab import VocabFile

pytestmark = pytest.mark.real


def test_a_vocabulary_alone_gives_every_tokens_bytes_as_the_loaded_model_does(smol_path: Path, smol: Model):
    """What the corpus replay gives auto in place of the loaded target's `piece`."""
    with VocabFile(smol_path) as vocab:
        pieces = [vocab.piece(token) for token in range(vocab.n_vocab)]
    assert pieces == [smol.piece(token) for token in range(smol.n_vocab)]
    assert sum(len(p) > 8 for p in pieces) > 100  # long pieces too, not only short ones


def test_a_real_chat_templates_header_gives_no_long_match_at_a_second_answers_start(smol: Model):
    """Auto's copies stop at the tokens llama.cpp gives no text (`Passage.reach`): that holds only while the loaded
    model's `piece` gives a chat template's control tokens none. SmolLM2's ChatML, two turns that both end in "?"."""
    tokens = ChatPrompter(smol).tokens([Message("user", "What is a list?"), Message("assistant", "A list holds items."),
                                        Message("user", "And a tuple?")])
    assert Passage().find(tokens).m >= 6  # "?<|im_end|>\n<|im_start|>assistant\n", as before the first answer
    structured = Passage(piece=smol.piece)
    structured.restart(len(tokens))
    assert structured.find(tokens).m == 1
