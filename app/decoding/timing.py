"""Costs that a busy moment cannot teach: what real steps say verifying n positions costs, learned answer
by answer on top of a calibration.

A timing taken while something else runs is slow, never fast, so each answer gives one figure per size
it verified often enough: a low quantile of its own steps of that size. An answer the service judged busy
gives none. The curve is learned as a level and a shape: the level is what one position (a plain step)
costs; the shape is what n positions cost over one, each answer's figure for n over its own plain steps'
figure, timed at the same moments, so that whatever slowed or sped a whole answer cancels (a drafted
token's seconds too are learned over the same answer's plain steps). Learned apart,
a figure for n that a busy answer raised and a plain step's that a quiet one lowered compounded: one
answer's 2 positions at 105.6 ms over others' plain steps at 39.9 ms put them at 2.62 plain steps where
they cost 1.8 (bench/calibration), and every longer copy 33% too dear. One answer, or a few close
together, may move a figure only a little from the calibration (MOVE): a busy moment that the judgement
missed lasts one answer, or a few, and would otherwise own the figure and every later process that reads
it. Only answers that agree, AGREE of them over at least AGREE_S, move it further (a machine that really
is slower or faster than its calibration, a laptop on battery), and then to their median, which one stray
answer cannot decide.
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

Seen = deque[tuple[float, float]]  # (when, figure) of each answer that gave the figure, oldest first


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
    median = statistics.median(figure for _, figure in seen)
    whens = [when for when, _ in seen]
    if len(seen) >= AGREE and max(whens) - min(whens) >= AGREE_S:
        return median
    return min(max(median, prior / MOVE), prior * MOVE)


def _figure(times: Sequence[float]) -> float | None:
    """One answer's figure from its timings of one kind, if it had enough."""
    times = [t for t in times if t > 0]
    return low(times) if len(times) >= MIN_SEEN else None


@dataclass
class StepTimes:
    """What quiet answers' real steps showed: a plain step's seconds (`plain`), what n positions cost over
    one (`shape`, n >= 2) and each drafting model's drafted token over one position (`token`), one figure an
    answer. `curve(prior)` is the prior (a calibration) corrected by them."""

    plain: Seen = field(default_factory=lambda: deque(maxlen=WINDOW))
    shape: dict[int, Seen] = field(default_factory=dict)
    token: dict[str, Seen] = field(default_factory=dict)
    answers: int = 0

    def add_answer(self, verify: Mapping[int, Sequence[float]], token: Mapping[str, Sequence[float]],
                   when: float) -> None:
        """One answer's timings (seconds per step by positions; seconds per drafted token by drafter). Its
        figures other than one position's count only over its own plain steps: without them, they could not
        be told from the moment's."""
        figures = {n: figure for n, times in verify.items() if (figure := _figure(times)) is not None}
        self.answers += 1
        if 1 not in figures:
            return
        plain = figures[1]
        self.plain.append((when, plain))
        for n, seconds in figures.items():
            if n > 1:
                self.shape.setdefault(n, deque(maxlen=WINDOW)).append((when, seconds / plain))
        for name, times in token.items():
            if (figure := _figure(times)) is not None:
                self.token.setdefault(name, deque(maxlen=WINDOW)).append((when, figure / plain))

    def seen(self) -> dict[int, int]:
        """How many answers gave each size's figure."""
        return {n: len(seen) for n, seen in ((1, self.plain), *self.shape.items()) if seen}

    def curve(self, prior: CostCurve) -> CostCurve:
        """The prior where no answer gave a figure, the answers' figures where they did: its plain step's
        seconds scaled to theirs, its shape (n positions over one) moved to theirs at the sizes they saw, and
        at the others by the median of those moves (batching that is dearer than calibrated at some sizes
        is at all), then made non-decreasing."""
        points = np.asarray(prior.verify_s, dtype=np.float64)
        shape = points / points[0]
        figures = {n: settled(float(shape[n - 1]), seen) for n, seen in self.shape.items() if n <= len(points) and seen}
        if figures:
            shape[1:] *= float(np.median([figure / shape[n - 1] for n, figure in figures.items()]))
            for n, figure in figures.items():
                shape[n - 1] = figure
        level = settled(float(points[0]), self.plain)
        draft, mtp = (level * settled(seconds / points[0], self.token.get(name, deque()))
                      for name, seconds in (("draft", prior.draft_s), ("mtp", prior.mtp_s)))
        return CostCurve(non_decreasing(level * shape).tolist(), draft, mtp_s=mtp, rollback=prior.rollback)

    def to_json(self) -> dict:
        return {"plain": [list(x) for x in self.plain],
                "shape": {str(n): [list(x) for x in seen] for n, seen in self.shape.items()},
                "per_token": {name: [list(x) for x in seen] for name, seen in self.token.items()},
                "answers": self.answers}

    @classmethod
    def from_json(cls, data: dict) -> StepTimes:
        """What was saved; from a cache of before the shape (figures of n positions and of drafted tokens in
        seconds, apart), only the plain steps' figures: the others may hold exactly the compounding this class
        prevents."""
        times = cls(answers=int(data.get("answers", 0)))
        plain = data.get("plain", (data.get("verify") or {}).get("1", ()))
        times.plain.extend((float(w), float(s)) for w, s in plain)
        for table, stored, key in ((times.shape, data.get("shape"), int), (times.token, data.get("per_token"), str)):
            for name, values in (stored or {}).items():
                table[key(name)] = deque(((float(w), float(s)) for w, s in values), maxlen=WINDOW)  # type: ignore[index]
        return times
