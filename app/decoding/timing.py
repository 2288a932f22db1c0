"""Costs that a busy moment cannot teach: what real steps say verifying n positions costs, learned answer
by answer on top of a calibration.

A timing taken while something else runs is slow, never fast, so each answer gives one figure per size
it verified often enough: a low quantile of its own steps of that size. An answer the service judged busy
gives none. One answer, or a few close together, may move a figure only a little from the calibration
(MOVE): a busy moment that the judgement missed lasts one answer, or a few, and would otherwise own the
figure and every later process that reads it. Only answers that agree, AGREE of them over at least
AGREE_S, move it further (a machine that really is slower or faster than its calibration, a laptop on
battery), and then to their median, which one stray answer cannot decide.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from specchat.decoding.policy import CostCurve

WINDOW = 8  # answers kept per figure
QUANTILE = 0.25  # of an answer's timings of one size: low enough to leave out the steps something slowed
MIN_SEEN = 3  # timings of one size an answer needs to say what that size costs
MOVE = 1.25  # the most a figure moves from the calibration until answers agree
AGREE = 3  # answers that may move a figure further: their median, once they span AGREE_S
AGREE_S = 300.0

Seen = deque[tuple[float, float]]  # (when, seconds) of each answer that gave the figure, oldest first


def low(values: Sequence[float], quantile: float = QUANTILE) -> float:
    """A robust low estimate of the machine's own cost among timings that interference can only slow."""
    return float(np.quantile(np.asarray(values, dtype=np.float64), quantile))


def non_decreasing(values: np.ndarray) -> np.ndarray:
    """The closest non-decreasing sequence in least squares (pool adjacent violators): a curve through
    noisy points that never says more positions cost less."""
    blocks: list[list[float]] = []  # [sum, count] of each pooled run
    for v in np.asarray(values, dtype=np.float64):
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return np.concatenate([np.full(int(c), s / c) for s, c in blocks])


def settled(prior: float, seen: Seen) -> float:
    """What the answers say a figure is: their median, held within MOVE of the prior until AGREE answers
    spanning AGREE_S say otherwise."""
    if not seen:
        return prior
    median = statistics.median(seconds for _, seconds in seen)
    whens = [when for when, _ in seen]
    if len(seen) >= AGREE and max(whens) - min(whens) >= AGREE_S:
        return median
    return min(max(median, prior / MOVE), prior * MOVE)


@dataclass
class StepTimes:
    """What quiet answers' real steps showed: per number of positions verified, and per drafted token of
    each drafting model, one figure an answer. `curve(prior)` is the prior (a calibration) corrected by them."""

    verify: dict[int, Seen] = field(default_factory=dict)
    token: dict[str, Seen] = field(default_factory=dict)
    answers: int = 0

    def add_answer(self, verify: Mapping[int, Sequence[float]], token: Mapping[str, Sequence[float]],
                   when: float) -> None:
        """One answer's timings (seconds per step by positions; seconds per drafted token by drafter)."""
        for table, timings in ((self.verify, verify), (self.token, token)):
            for key, times in timings.items():
                times = [t for t in times if t > 0]
                if len(times) >= MIN_SEEN:
                    table.setdefault(key, deque(maxlen=WINDOW)).append((when, low(times)))  # type: ignore[index]
        self.answers += 1

    def seen(self) -> dict[int, int]:
        """How many answers gave each size's figure."""
        return {n: len(seen) for n, seen in self.verify.items() if seen}

    def curve(self, prior: CostCurve) -> CostCurve:
        """The prior where no answer gave a figure, the answers' figures where they did. Points not seen move
        with the seen ones (a machine slower than its calibration is slower at every n), then the whole is
        made non-decreasing."""
        size = len(prior.verify_s)
        points = np.asarray(prior.verify_s, dtype=np.float64)
        figures = {n: settled(float(points[n - 1]), seen) for n, seen in self.verify.items() if n <= size and seen}
        if figures:
            points = points * float(np.median([t / points[n - 1] for n, t in figures.items()]))
            for n, t in figures.items():
                points[n - 1] = t
        return CostCurve(non_decreasing(points).tolist(), settled(prior.draft_s, self.token.get("draft", deque())),
                         mtp_s=settled(prior.mtp_s, self.token.get("mtp", deque())), rollback=prior.rollback)

    def to_json(self) -> dict:
        return {"verify": {str(n): [list(x) for x in seen] for n, seen in self.verify.items()},
                "token": {name: [list(x) for x in seen] for name, seen in self.token.items()}, "answers": self.answers}

    @classmethod
    def from_json(cls, data: dict) -> StepTimes:
        times = cls(answers=int(data.get("answers", 0)))
        for table, stored, key in ((times.verify, data.get("verify"), int), (times.token, data.get("token"), str)):
            for name, values in (stored or {}).items():
                table[key(name)] = deque(((float(w), float(s)) for w, s in values), maxlen=WINDOW)  # type: ignore[index]
        return times
