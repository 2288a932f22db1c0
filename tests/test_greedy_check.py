"""The greedy-equivalence check can fail: on SmolLM2 (real), with an engine whose batched logits are
corrupted, and with one whose verification reads the wrong row, it reports a divergence that is not
a near-tie; on the engine as it is, it passes."""

from __future__ import annotations

import numpy as np
import pytest
from greedy import compare

from specchat.llama.session import Session
from specchat.spec.engine import Engine
from specchat.spec.guessers import LookupGuesser
from specchat.spec.verify import verify_greedy

pytestmark = pytest.mark.real
TEXT = "Repeat this exactly, twice: the quick brown fox jumps over the lazy dog, and the lazy dog sleeps on."


def prompt(smol) -> list[int]:
    return smol.tokenize(f"<|im_start|>user\n{TEXT}<|im_end|>\n<|im_start|>assistant\n", add_bos=False)


def test_the_engine_as_it_is_passes(smol, smol_path):
    compare(smol, smol_path, prompt(smol), LookupGuesser, 40)


def test_corrupted_batched_logits_fail_it(smol, smol_path, monkeypatch):
    """A kernel bug that shows only in batches: a fixed pattern added to every row of a multi-token
    decode, single-token rows left alone (so plain decoding is untouched)."""
    decode = Session.decode
    pattern = np.where(np.arange(smol.n_vocab) % 97 == 0, 4.0, 0.0).astype(np.float32)

    def corrupted(self, tokens, logits="last"):
        rows = decode(self, tokens, logits)
        return rows + pattern if logits == "all" and len(tokens) > 1 else rows

    monkeypatch.setattr(Session, "decode", corrupted)
    with pytest.raises(AssertionError, match="the engine is wrong: NOT a near-tie"):
        compare(smol, smol_path, prompt(smol), LookupGuesser, 40)


def test_a_verification_that_reads_the_wrong_row_fails_it(smol, smol_path, monkeypatch):
    def off_by_one(self, pending, draft, draft_probs, sampling, rng):
        logits = np.array(self.target.session.decode([pending, *draft], "all"))
        if draft:  # each guess judged by the row after its own
            logits = np.roll(logits, -1, axis=0)
        return verify_greedy(draft, logits.argmax(-1))

    monkeypatch.setattr(Engine, "_verify", off_by_one)
    with pytest.raises(AssertionError, match="the engine is wrong: NOT a near-tie"):
        compare(smol, smol_path, prompt(smol), LookupGuesser, 40)
