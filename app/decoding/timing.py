"""Costs that hold when the machine is busy: robust estimates from repeated timings, and a curve
learned from real steps.

A timing taken while something else runs is slow, never fast: the machine's own cost is near the
low end of what was seen, and a median or an average of the same timings is the interference. So a
figure is a low quantile of a window of recent timings, and the curve through them is fitted so that
it cannot go down as positions go up (verifying more never costs less).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from specchat.decoding.policy import CostCurve

WINDOW = 24  # recent timings kept per figure
QUANTILE = 0.25  # low enough to leave out the steps that something else slowed down
MIN_SEEN = 3  # timings a figure needs before it is trusted over the calibration


def low(values: list[float] | deque[float], quantile: float = QUANTILE) -> float:
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


@dataclass
class StepTimes:
    """Timings of real steps: per number of positions verified, and per drafted token of each drafting
    model. `curve(prior)` is the prior (a calibration) corrected by what the steps showed."""

    verify: dict[int, deque[float]] = field(default_factory=dict)
    token: dict[str, deque[float]] = field(default_factory=dict)
    steps: int = 0

    def add_verify(self, n: int, seconds: float) -> None:
        if n >= 1 and seconds > 0:
            self.verify.setdefault(n, deque(maxlen=WINDOW)).append(seconds)
            self.steps += 1

    def add_token(self, drafter: str, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.token.setdefault(drafter, deque(maxlen=WINDOW)).append(seconds / tokens)

    def seen(self) -> dict[int, float]:
        """The robust figure of every n seen often enough."""
        return {n: low(times) for n, times in self.verify.items() if len(times) >= MIN_SEEN}

    def curve(self, prior: CostCurve) -> CostCurve:
        """The prior where no steps were seen, the steps where they were. Points not seen move with
        the seen ones (a machine that is slower than its calibration is slower at every n), then the
        whole is made non-decreasing."""
        seen = self.seen()
        size = len(prior.verify_s)
        points = np.asarray(prior.verify_s, dtype=np.float64)
        if seen:
            scale = float(np.median([t / points[n - 1] for n, t in seen.items() if n <= size]))
            points = points * scale
            for n, t in seen.items():
                if n <= size:
                    points[n - 1] = t
        tokens = {name: low(times) for name, times in self.token.items() if len(times) >= MIN_SEEN}
        return CostCurve(non_decreasing(points).tolist(), tokens.get("draft", prior.draft_s),
                         mtp_s=tokens.get("mtp", prior.mtp_s), rollback=prior.rollback)

    def to_json(self) -> dict:
        return {"verify": {str(n): list(t) for n, t in self.verify.items()},
                "token": {name: list(t) for name, t in self.token.items()}, "steps": self.steps}

    @classmethod
    def from_json(cls, data: dict) -> StepTimes:
        times = cls(steps=int(data.get("steps", 0)))
        for n, values in (data.get("verify") or {}).items():
            times.verify[int(n)] = deque((float(v) for v in values), maxlen=WINDOW)
        for name, values in (data.get("token") or {}).items():
            times.token[str(name)] = deque((float(v) for v in values), maxlen=WINDOW)
        return times
