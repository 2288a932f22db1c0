"""Auto replayed on recorded answers (specchat.tools.judging): no model, made-up answers whose every guess's
fate is known."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.policy import CostCurve, Priors
from specchat.tools.judging import auto_for, fixed_speedups, judge
from specchat.tools.recorded import Answer
from specchat.tools.replay import replay

FLAT = CostCurve([1.0 + 0.02 * n for n in range(16)], 0.1)


def test_replay_follows_the_recorded_draft_and_auto_learns_to_use_it():
    rng = np.random.default_rng(1)
    answer = rng.integers(100, 900, 200).tolist()
    a = Answer("open", "fit", 0.0, (1, 2, 3), tuple(answer), tuple(answer), (0.95,) * 200)  # a perfect draft
    seconds, steps = replay(a, FLAT, auto_for(a, FLAT, Priors(drafter=0.8)))
    assert steps < 200 / 3 and len(answer) * 1.0 / seconds > 2.0
    # The same answer with a draft that is always wrong: auto stops drafting within its loss budget.
    wrong = Answer("open", "fit", 0.0, (1, 2, 3), tuple(answer), tuple(t + 1 for t in answer), (0.95,) * 200)
    seconds, _ = replay(wrong, FLAT, auto_for(wrong, FLAT, Priors(drafter=0.8)))
    assert len(answer) / seconds > 0.95


def test_fixed_choices_send_their_length_every_step_and_the_draft_only_where_recorded():
    """The choices auto's regret is judged against: on an answer that copies its prompt whole, lookup sending 16
    at a time beats sending 1, both beat plain (1 by definition), and a perfect recorded draft at k=4 makes 5
    tokens a step; on a sampled answer, which records no draft, the draft is left out."""
    rng = np.random.default_rng(2)
    prompt = tuple(rng.integers(100, 900, 120).tolist())
    copied = Answer("rewrite", "held-out", 0.0, prompt, prompt, prompt, (0.95,) * len(prompt))
    fixed = fixed_speedups([copied], FLAT)
    assert fixed["plain"] == 1.0 and fixed["lookup k=16"] > fixed["lookup k=1"] > 1.0
    # A perfect draft at k=4: 5 tokens for 4 draft tokens and a 5-position check (1.08 + 0.4), less catching up.
    assert fixed["draft k=4"] == pytest.approx(5 / 1.48, rel=0.05)
    sampled = Answer("rewrite", "held-out", 0.7, prompt, prompt)
    assert not any(name.startswith("draft") for name in fixed_speedups([sampled], FLAT))


def test_judge_builds_auto_with_the_targets_token_bytes_where_given():
    """As the live registry does: after a fixed typo (" avail" "ble" written as " available"), a copy resumes after
    the text the target replaced, by the tokens' bytes, and one step sooner than without them."""
    pieces = {10: b" The", 11: b" app", 12: b" is", 13: b" avail", 14: b"ble", 15: b" for", 16: b" download", 17: b" available"}
    rng = np.random.default_rng(3)
    passage = [10, 11, 12, 13, 14, 15, 16, *rng.integers(100, 900, 60).tolist()]
    fixed = [10, 11, 12, 17, *passage[5:]]
    answer = Answer("edit", "held-out", 0.0, tuple([1, *passage, 2]), tuple(fixed))
    asked: list[int] = []

    def piece(token: int) -> bytes:
        asked.append(token)
        return pieces.get(token, b" word")

    with_bytes, without = judge([answer], FLAT, bound=False, piece=piece), judge([answer], FLAT, bound=False)
    assert asked and with_bytes.auto > without.auto
