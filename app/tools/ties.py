"""Telling a floating-point near-tie from a broken engine, where two greedy answers part.

llama.cpp's CPU kernels round differently when a position is evaluated alone or in a batch, so at a
near-tie speculative and plain greedy decoding can pick different tokens. A divergence is excused
only if each run's token is at the top of its own logits, and each leads the other by no more than
the noise allows and never more than a fixed ceiling. The noise (how much the two ways of evaluating
that position differ) is measured on a fresh model that neither run touched; the leads are the runs'
own when they were recorded (the greedy-equivalence test records them), else those of the fresh
evaluations (the endurance check compares with another process, whose logits it never saw). The
ceiling is the part that cannot be argued with: a tolerance measured by comparing the two
evaluations grows with a kernel that corrupts batched logits, and would excuse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from specchat.llama.model import Model

# On good builds every parting was at a lead of at most 0.36 logits: 0.005 to 0.36 on this project's
# 2-core Intel Xeon (the default pair, 2026-12-01, tests/decoding/test_greedy_qwen.py), 0.05 to 0.06 on its AMD
# EPYC, up to 0.16 when evaluated anew on a fresh model. A kernel or a rule that is wrong moves logits
# by whole units (tests/decoding/test_greedy_check.py plants both).
CEILING = 0.5


@dataclass(frozen=True)
class Parting:
    """Where two greedy answers part, and whether that is a near-tie."""

    position: int  # of the answer
    ours: int
    theirs: int
    leads: tuple[float, float]  # each run's token's lead over the other's, in its own (or fresh) logits
    noise: float  # the largest difference between the two evaluations of that position, on a fresh model
    tie: bool

    def report(self) -> str:
        verdict = "a near-tie" if self.tie else "NOT a near-tie"
        return (f"{verdict}: the answers agree on {self.position} tokens, then give {self.ours} and {self.theirs}, "
                f"which lead by {self.leads[0]:.3f} and {self.leads[1]:.3f} in the logits that chose them; the two "
                f"evaluations of that position differ by up to {self.noise:.3f} on a fresh model, and the ceiling "
                f"is {CEILING}")


def parting(path: Path, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int], n_ctx: int = 4096,
            threads: int | None = None, rows: tuple[np.ndarray, np.ndarray] | None = None) -> Parting | None:
    """Judge where `ours` and `theirs` (two greedy answers to `prompt`) first differ; None if they do not.
    `rows`: the logits each run chose its token at that position from, if they were recorded. One
    answer that stops where the other goes on is never a tie."""
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if i is None:
        if len(ours) == len(theirs):
            return None
        i = min(len(ours), len(theirs))
        return Parting(i, -1, -1, (float("inf"), float("inf")), 0.0, False)
    x, y = int(ours[i]), int(theirs[i])
    batched, single = both_ways(path, tuple(prompt), tuple(ours[:i]), n_ctx, threads)
    noise = float(np.abs(batched - single).max())
    mine, other = rows if rows is not None else (batched, single)
    # Each run must have emitted the top of the logits it chose from, and lead the other's token by little.
    tops = int(mine.argmax()) == x and int(other.argmax()) == y if rows is not None else \
        all(max(row[x], row[y]) >= row.max() - 2 * noise for row in (mine, other))
    leads = (abs(float(mine[x] - mine[y])), abs(float(other[y] - other[x])))
    tie = tops and max(leads) <= min(2 * noise, CEILING)
    return Parting(i, x, y, leads, noise, tie)


# A fresh model gives the same logits for the same tokens, and the greedy tests judge the same parting
# once for each guesser that meets it (a model load and a token-at-a-time pass over the answer each).
@lru_cache(maxsize=4)
def both_ways(path: Path, prompt: tuple[int, ...], answer: tuple[int, ...], n_ctx: int,
              threads: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The logits after prompt + answer on a fresh model: with everything before the last token in one
    batch, and with the answer one token at a time after the prompt (as plain decoding does)."""
    prefix = list(prompt + answer)
    model = Model(path, n_ctx=n_ctx, n_threads=threads)
    try:
        session = model.session
        session.prefill(prefix)
        batched = np.array(session.decode([prefix[-1]], "last")[0])
        session.clear()
        session.prefill(list(prompt))
        for token in prefix[len(prompt) - 1:-1]:
            session.decode([token], "none")
        single = np.array(session.decode([prefix[-1]], "last")[0])
    finally:
        model.close()
    batched.flags.writeable = single.flags.writeable = False  # shared by every caller of the cache
    return batched, single
