"""The cost-aware controller: pure functions, and the auto guesser's choices on given costs."""

from __future__ import annotations

import numpy as np
import pytest

from app.controller import Acceptance, CostCurve, best_k, expected_tokens, keep_drafting
from app.guessers import AutoGuesser, _match
from app.sampling import SamplingConfig

# Shapes measured on this project's machines: a 2-core CPU, where verifying 5 positions costs
# about 3.6 single steps, and a GPU-like curve that is nearly flat.
CPU = CostCurve([0.0276, 0.0437, 0.0578, 0.072, 0.100, 0.104, 0.113, 0.121, 0.135, 0.149, 0.152, 0.156,
                 0.154, 0.152, 0.150, 0.149], draft_s=0.0148)
GPU = CostCurve([0.010 + 0.0002 * n for n in range(16)], draft_s=0.001)


def test_expected_tokens_matches_simulation():
    rng = np.random.default_rng(0)
    for alpha, k in [(0.6, 2), (0.8, 4), (0.9, 8)]:
        acc = rng.random((200_000, k)) < alpha
        run = np.where(acc.all(1), k, acc.argmin(1))
        assert float(expected_tokens(alpha, k)) == pytest.approx((run + 1).mean(), abs=0.02)
    assert float(expected_tokens(1.0, 4)) == 5


def test_cpu_curve_rules_out_the_draft_and_gpu_curve_drafts_long():
    k_cpu, _ = best_k(0.8, 16, CPU, CPU.draft_s)
    k_gpu, _ = best_k(0.8, 16, GPU, GPU.draft_s)
    assert k_cpu == 0
    assert k_gpu >= 4
    # Free guesses (lookup) that land almost always are worth a long proposal even on the CPU.
    assert best_k(0.95, 16, CPU, 0.0)[0] >= 8


def test_curve_extrapolates_and_learns():
    curve = CostCurve([0.01, 0.02, 0.03])
    assert float(curve.verify(5)) == pytest.approx(0.05)
    curve.observe_verify(2, 0.04)
    assert curve.verify_s[1] == pytest.approx(0.022)
    curve.observe_draft(4, 0.08)
    assert curve.draft_s == pytest.approx(0.002)


def test_draft_stops_when_its_confidence_drops():
    assert keep_drafting([0.95], GPU)
    assert not keep_drafting([0.95, 0.1], GPU)
    assert not keep_drafting([0.99], CPU)


def test_acceptance_estimate_learns_and_relaxes():
    est = Acceptance()
    for _ in range(50):
        est.observe(4, False)
    assert est.alpha > 0.95
    low = Acceptance()
    for _ in range(50):
        low.observe(0, True)
    before = low.optimistic
    for _ in range(200):
        low.relax()
    assert low.optimistic > before


def test_auto_uses_lookup_when_copying_and_plain_when_nothing_matches():
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    copy = [5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 5, 6, 7]
    proposal = auto.propose(copy, 8, greedy, rng)
    assert proposal.source == "lookup" and proposal.tokens[:2] == [8, 9]
    assert auto.propose([1, 2, 3, 4], 8, greedy, rng).source == "none"


def test_auto_learns_to_stop_guessing_what_is_always_rejected():
    auto = AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    ctx = [1, 2, 3, 9, 9, 1, 2, 3]
    tried = 0
    for _ in range(40):
        proposal = auto.propose(ctx, 8, greedy, rng)
        if proposal.tokens:
            tried += 1
            auto.observe(len(proposal.tokens), 0, 0.0, float(CPU.verify(len(proposal.tokens) + 1)))
        else:
            auto.observe(0, 0, 0.0, float(CPU.verify(1)))
    assert 0 < tried < 10


def test_lookup_prefers_the_passage_being_copied_over_the_latest_occurrence():
    context = [1, 2, 3, 7, 7, 1, 2, 4, 8, 1, 2]
    assert _match(context, 3) == (7, 2, False)  # the latest "1 2" continues with 4
    assert _match(context, 3, cursor=2) == (2, 2, True)  # the copy was at the first: it continues with 3


def test_auto_guesses_a_substitution_after_an_edit_inside_a_copy():
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    passage = [10, 11, 12, 40, 13, 14, 15, 16, 17]  # 40: an identifier the answer renames to 41
    answer = passage + [99] + [10, 11]
    auto.prepare(answer)
    first = auto.propose(answer, 8, greedy, rng)
    assert first.tokens[:3] == [12, 40, 13]
    auto.observe(len(first.tokens), 1, 0.0, 0.01)  # 12 accepted; the target said 41, not 40
    resumed = auto.propose(answer + [12, 41], 8, greedy, rng)
    assert resumed.source == "lookup" and resumed.tokens[:3] == [13, 14, 15]  # copying on after 40
    # A miss at the very first guessed token may only mean the wrong occurrence: no substitution then.
    auto.prepare(answer)
    auto.propose(answer, 8, greedy, rng)
    auto.observe(len(first.tokens), 0, 0.0, 0.01)
    assert auto.propose(answer + [77], 8, greedy, rng).source == "none"
