"""Auto's priors fitted on recorded answers (specchat.tools.fitting)."""

from __future__ import annotations

import numpy as np

from specchat.decoding.policy import CostCurve, Priors
from specchat.tools.fitting import fit_priors
from specchat.tools.judging import judge
from specchat.tools.recorded import Answer

CPU = CostCurve([1.0, 1.57, 2.07, 2.7, 3.22, 3.55, 3.97, 4.4, 4.77, 4.97, 5.04, 5.11, 5.14, 5.18, 5.21, 5.26], 0.54)


def test_fitting_the_priors_finds_that_copies_hold_on_text_that_copies():
    rng = np.random.default_rng(2)
    answers = []
    for n in range(4):  # edits: a passage copied with one word changed in every 40 tokens
        passage = rng.integers(100, 900, 160).tolist()
        copy = [t if i % 40 != 39 else t + 1 for i, t in enumerate(passage)]
        answers.append(Answer("edit", "fit", 0.0, tuple([1, *passage, 2]), tuple(copy)))
    start = Priors()
    fitted = fit_priors(answers, [CPU], start, ["long"], rounds=1)
    assert fitted.match[3] > start.match[3]
    assert judge(answers, CPU, fitted, bound=False).auto > judge(answers, CPU, start, bound=False).auto
