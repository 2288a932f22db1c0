"""Auto replayed on recorded answers (specchat.tools.judging): no model, made-up answers whose every guess's
fate is known."""

from __future__ import annotations

import numpy as np

from specchat.decoding.policy import CostCurve, Priors
from specchat.tools.judging import auto_for
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
