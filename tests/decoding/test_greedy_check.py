"""The greedy-equivalence check can fail: on SmolLM2 (real), with an engine whose batched logits are
corrupted (by whole logits, or by 0.3 of one, which moves no argmax here), and with one whose
verification reads the wrong row, it reports the engine wrong; on the engine as it is, it passes, with
guesses kept, rejected and kept in part, and every row to the bit (SmolLM2's batch noise is 0 here)."""

from __future__ import annotations

import numpy as np
import pytest
from greedy import compare

from specchat.decoding.engine import Engine
from specchat.decoding.guessers import AutoGuesser, LookupGuesser
from specchat.decoding.policy import CostCurve
from specchat.decoding.verify import verify_tree_greedy
from specchat.llama.model import Model
from specchat.llama.session import Session

pytestmark = pytest.mark.real
TEXT = "Repeat this exactly, twice: the quick brown fox jumps over the lazy dog, and the lazy dog sleeps on."


# Places to copy from that disagree ("the red" goes on " cat", " dog" and " bird"): auto on a flat curve
# sends them as trees (7 steps verified one and 22 guesses were kept, 2026-12-03).
LIST = "Copy this list exactly: the red cat, the red dog, the blue cat, the blue dog, the red bird, the blue bird."
FLAT = CostCurve([0.01] * 16)


def prompt(smol, text: str = TEXT) -> list[int]:
    return smol.tokenize(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_bos=False)


@pytest.fixture(scope="module")
def smol_trees(smol_path):
    model = Model(smol_path, n_ctx=1024, tree_branches=4)  # by default only where a GPU takes the model
    yield model
    model.close()


def trees(model: Model, path) -> object:
    return compare(model, path, prompt(model, LIST), lambda: AutoGuesser(FLAT, tree_branches=4), 40)


def test_trees_as_they_are_pass_it(smol_trees, smol_path):
    found = trees(smol_trees, smol_path)
    assert found.trees > 0 and found.accepted > 0 and not found.ties


def test_a_tree_path_kept_from_the_wrong_sequence_fails_it(smol_trees, smol_path, monkeypatch):
    """After a tree, the cells kept as seq 0 come from a leaf not under the path kept: right tokens,
    another branch's cache."""
    under = Session._under
    monkeypatch.setattr(Session, "_under", staticmethod(lambda leaf, node, parents: not under(leaf, node, parents)))
    with pytest.raises(AssertionError, match="the engine is wrong"):
        trees(smol_trees, smol_path)


def test_the_engine_as_it_is_passes(smol, smol_path):
    found = compare(smol, smol_path, prompt(smol), LookupGuesser, 40)
    found.exercised()
    assert found.rows >= 40 and not found.ties


@pytest.mark.parametrize("size, where", [(4.0, "every model"), (0.3, "the session under test")])
def test_corrupted_batched_logits_fail_it(smol, smol_path, monkeypatch, size, where):
    """A fixed pattern (+size and -size on every 97th token) added to every row of a multi-token decode,
    in llama.cpp's own buffer; single-token rows are left alone, so plain decoding is untouched.
    Everywhere, it is a kernel bug: the fresh model measures it as batch noise too, so only the near-tie
    ceiling can catch it, and 4 logits do. In the session under test alone, it is the engine's bug, and
    0.3 of a logit, which moves no argmax here, is caught by the rows against noise measured apart."""
    decode = Session.decode
    ids = np.arange(smol.n_vocab)
    pattern = np.where(ids % 97 == 0, np.where(ids % 194 == 0, size, -size), 0.0).astype(np.float32)

    def corrupted(self, tokens, logits="last"):
        rows = decode(self, tokens, logits)
        if logits == "all" and len(tokens) > 1 and (where == "every model" or self is smol.session):
            rows += pattern
        return rows

    monkeypatch.setattr(Session, "decode", corrupted)
    with pytest.raises(AssertionError, match="the engine is wrong"):
        compare(smol, smol_path, prompt(smol), LookupGuesser, 40)


def test_a_verification_that_reads_the_wrong_row_fails_it(smol, smol_path, monkeypatch):
    def off_by_one(self, pending, tree, sampling, rng, matcher=None):  # lookup's guesses: a chain
        logits = np.array(self.target.session.decode_guesses(pending, tree.tokens, tree.parents))
        if tree.tokens:  # each guess judged by the row after its own
            logits = np.roll(logits, -1, axis=0)
        verdict = verify_tree_greedy(tree, logits.argmax(-1))
        return verdict.path, verdict.token

    monkeypatch.setattr(Engine, "_verify", off_by_one)
    with pytest.raises(AssertionError, match="the engine is wrong: NOT a near-tie"):
        compare(smol, smol_path, prompt(smol), LookupGuesser, 40)
