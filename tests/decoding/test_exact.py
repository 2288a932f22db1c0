"""Exactness end to end, with a draft that really differs from the target: the joint distribution of
the first three tokens at T=1, with chains of 2 to 4 drafted tokens (so that a second guess's fate
depends on the first), against the exact one. On scripted models (six tokens, fast, many samples),
where the rejection branch is counted and a planted bug (the correction drawn from p instead of the
residual) must make the test fail."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fakes import ScriptedModel
from pooled import chi_square

import specchat.decoding.verify as verify_module
from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import DraftGuesser, LookupGuesser, Proposal
from specchat.decoding.sampling import SamplingConfig, logits_to_probs
from specchat.decoding.verify import Tree

V = ScriptedModel().n_vocab  # six tokens
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # lookup proposes 3, 1, 2, ... here
T1 = SamplingConfig(1.0)


def exact_first_three(target: ScriptedModel) -> dict[tuple[int, ...], float]:
    joint = {}
    for seq in itertools.product(range(V), repeat=3):
        p, context = 1.0, list(PROMPT)
        for t in seq:
            p *= logits_to_probs(target.logits(context), T1)[t]
            context.append(t)
        joint[seq] = p
    return joint


def sample_first_three(target, guesser, k: int, n: int, seed0: int = 0) -> tuple[np.ndarray, int, int]:
    """Counts over the 216 cells, and how often a guess was rejected (the residual sampled) and accepted."""
    engine = Engine(target, guesser)
    counts, rejected, accepted = np.zeros(V ** 3), 0, 0
    for seed in range(seed0, seed0 + n):
        done = final(engine.generate(PROMPT, GenerationConfig(SamplingConfig(1.0, seed=seed), max_tokens=5,
                                                               draft_length=k)))
        a, b, c = done.token_ids[:3]
        counts[(a * V + b) * V + c] += 1
        rejected += done.stats.rejections
        accepted += done.stats.accepted
    return counts, rejected, accepted


def p_value(counts: np.ndarray, joint: dict[tuple[int, ...], float]) -> float:
    return chi_square(counts, np.array([joint[s] for s in itertools.product(range(V), repeat=3)]))


TARGET_SEED, DRAFT_SEED = 11, 12


@pytest.mark.parametrize("k", [2, 3, 4])
def test_a_mismatched_draft_gives_the_targets_distribution(k):
    target, draft = ScriptedModel(TARGET_SEED, 1.5), ScriptedModel(DRAFT_SEED, 1.0)  # q differs from p
    counts, rejected, accepted = sample_first_three(target, DraftGuesser(draft), k, 20_000)
    assert rejected > 4000 and accepted > 4000, (rejected, accepted)  # both branches, often
    assert p_value(counts, exact_first_three(target)) > 1e-3


def test_lookup_gives_the_targets_distribution():
    target = ScriptedModel(TARGET_SEED, 1.5)
    counts, rejected, accepted = sample_first_three(target, LookupGuesser(), 4, 20_000)
    assert rejected > 4000 and accepted > 1000, (rejected, accepted)
    assert p_value(counts, exact_first_three(target)) > 1e-3


def test_a_correction_drawn_from_p_instead_of_the_residual_is_caught(monkeypatch):
    """The control: the test above must fail on a verifier that is wrong in the rejection branch."""
    monkeypatch.setattr(verify_module, "_residual", lambda p, q, x: p)
    target, draft = ScriptedModel(TARGET_SEED, 1.5), ScriptedModel(DRAFT_SEED, 1.0)
    counts, _, _ = sample_first_three(target, DraftGuesser(draft), 3, 20_000)
    assert p_value(counts, exact_first_three(target)) < 1e-6


class TreeGuesser:
    """Two independent draws from the draft at the root, each followed by one more, and beside them
    lookup's continuation (deterministic): a mixed tree through the engine's tree step."""

    name, default_draft_length = "tree", 2

    def __init__(self, draft: ScriptedModel) -> None:
        self.draft = draft

    def prepare(self, context) -> None:
        pass

    def propose(self, context, k, sampling, rng) -> Proposal:
        if k < 2:
            return Proposal.empty()
        tokens, parents, drafts = [], [], []
        copy = LookupGuesser().propose(context, 2, sampling, rng).tokens
        if copy:
            tokens, parents, drafts = list(copy), list(range(-1, len(copy) - 1)), [None] * len(copy)
        for _ in range(2):
            q = logits_to_probs(self.draft.logits(list(context)), sampling)
            x = int(rng.choice(V, p=q))
            q2 = logits_to_probs(self.draft.logits([*context, x]), sampling)
            tokens += [x, int(rng.choice(V, p=q2))]
            parents += [-1, len(tokens) - 2]
            drafts += [q, q2]
        return Proposal(tokens, None, "tree", tree=Tree(tuple(tokens), tuple(parents), tuple(drafts)))

    def observe(self, *args) -> None:
        pass


def test_a_tree_of_sampled_and_copied_branches_gives_the_targets_distribution():
    target, draft = ScriptedModel(TARGET_SEED, 1.5), ScriptedModel(DRAFT_SEED, 1.0)
    counts, rejected, accepted = sample_first_three(target, TreeGuesser(draft), 2, 20_000)
    assert rejected > 2000 and accepted > 4000, (rejected, accepted)
    assert p_value(counts, exact_first_three(target)) > 1e-3
