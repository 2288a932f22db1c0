"""A GGUF file's vocabulary read without its weights (specchat.llama.vocab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specchat.llama.model import Model
from specchat.llama.vocab import VocabFile

pytestmark = pytest.mark.real


def test_a_vocabulary_alone_gives_every_tokens_bytes_as_the_loaded_model_does(smol_path: Path, smol: Model):
    """What the corpus replay gives auto in place of the loaded target's `piece`."""
    with VocabFile(smol_path) as vocab:
        pieces = [vocab.piece(token) for token in range(vocab.n_vocab)]
    assert pieces == [smol.piece(token) for token in range(smol.n_vocab)]
    assert sum(len(p) > 8 for p in pieces) > 100  # long pieces too, not only short ones
