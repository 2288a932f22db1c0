"""Auto's priors fitted on recorded answers: the values under which auto decodes them fastest, found by
coordinate descent over a coarse grid (`bench/corpus fit` prints the result as policy.PRIORS).
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Callable, Sequence

from specchat.decoding.policy import CostCurve, Priors
from specchat.tools.judging import judge
from specchat.tools.recorded import Answer

# The values each prior may take while fitting, and which match-length buckets move together (a short
# match, 2 to 3 tokens, and longer): a coarse grid over few values finds what the fold prefers and keeps
# the fit from learning what is only noise in it.
GRID = {"short": (0.1, 0.25, 0.4, 0.55, 0.7, 0.85), "mid": (0.4, 0.55, 0.7, 0.8, 0.9, 0.95),
        "long": (0.7, 0.8, 0.85, 0.9, 0.95, 0.98), "near": (0.3, 0.45, 0.6, 0.75, 0.9),
        "weight": (1.0, 2.0, 4.0, 8.0, 16.0), "drafter": (0.3, 0.5, 0.65, 0.8, 0.9), "decay": (0.9, 0.95, 0.98, 0.995)}
BUCKETS = {"short": (0,), "mid": (1, 2), "long": (3, 4, 5, 6, 7)}


def with_value(p: Priors, name: str, value: float) -> Priors:
    """The priors with one of GRID's values set (a bucket group sets every bucket in it)."""
    if name in BUCKETS:
        return replace(p, match=tuple(value if i in BUCKETS[name] else a for i, a in enumerate(p.match)))
    return replace(p, **{name: value})


def cost(answers: Sequence[Answer], curves: Sequence[CostCurve], p: Priors) -> float:
    """Auto's time on the answers on these priors, as a share of plain decoding's, summed over the curves."""
    return sum(j.auto_s / j.plain_s for j in (judge(answers, c, p, bound=False) for c in curves))


def fit_priors(answers: Sequence[Answer], curves: Sequence[CostCurve], start: Priors, fields: Sequence[str],
               rounds: int = 2, say: Callable[[str], None] = lambda line: None) -> Priors:
    """Coordinate descent over GRID: the priors under which auto decodes `answers` fastest, the time on each
    curve taken as a share of plain decoding's there (so that no curve's seconds outweigh another's). The
    grid's values for one field are tried in parallel, one process a core; each trial carries the answers
    with it (a few hundred kilobytes, nothing beside judging them)."""
    trial_cost = functools.partial(cost, list(answers), list(curves))
    with ProcessPoolExecutor(os.cpu_count()) as pool:
        best = start
        best_cost = trial_cost(start)
        say(f"start {best_cost / len(curves):.4f} of plain")
        for _ in range(rounds):
            changed = False
            for name in fields:
                trials = [with_value(best, name, v) for v in GRID[name]]
                for trial, c in zip(trials, pool.map(trial_cost, trials)):
                    if c < best_cost - 1e-6:
                        best, best_cost, changed = trial, c, True
                say(f"{name}: {best_cost / len(curves):.4f} of plain")
            if not changed:
                break
    return best
