"""Choosing how much to guess: pure functions over a cost model and acceptance estimates.

A step that verifies n positions costs verify(n); drafting costs draft_s per token (zero for
prompt lookup). With per-position acceptance alpha, k guesses yield (1 - alpha^(k+1)) / (1 - alpha)
tokens, so the rate is that over (k * draft_s + verify(k + 1)). On a GPU verify() is nearly flat
and long drafts win; on a small CPU it climbs steeply and short drafts, or none, win.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def expected_tokens(alpha: float, k: np.ndarray | int) -> np.ndarray:
    """Expected tokens per step with k guesses, each accepted i.i.d. with probability alpha."""
    k = np.asarray(k, dtype=np.float64)
    if alpha >= 1.0:
        return k + 1
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass
class CostCurve:
    """Seconds to verify n positions (n = 1..len), kept current from real steps."""

    verify_s: list[float]  # verify_s[n - 1] is the cost of n positions
    draft_s: float = 0.0  # one draft-model token
    smoothing: float = 0.1

    def verify(self, n: np.ndarray | int) -> np.ndarray:
        n = np.asarray(n)
        table = np.asarray(self.verify_s)
        last = len(table)
        # Beyond the table, extend by the slope of its last two points.
        slope = table[-1] - table[-2] if last > 1 else table[-1]
        inside = table[np.clip(n, 1, last) - 1]
        return np.where(n <= last, inside, table[-1] + (n - last) * slope)

    def observe_verify(self, n: int, seconds: float) -> None:
        if 1 <= n <= len(self.verify_s) and seconds > 0:
            self.verify_s[n - 1] += self.smoothing * (seconds - self.verify_s[n - 1])

    def observe_draft(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            self.draft_s += self.smoothing * (seconds / tokens - self.draft_s)


def best_k(alpha: float, k_max: int, cost: CostCurve, draft_s: float) -> tuple[int, float]:
    """The number of guesses (0..k_max) that maximizes expected tokens per second, and that rate."""
    ks = np.arange(0, max(0, k_max) + 1)
    rate = expected_tokens(alpha, ks) / (ks * draft_s + cost.verify(ks + 1))
    best = int(rate.argmax())
    return best, float(rate[best])


def keep_drafting(confidences: list[float], cost: CostCurve) -> bool:
    """After drafting len(confidences) tokens whose draft probabilities were `confidences`: is
    one more worth its cost? The draft's own probability is a free estimate of acceptance, so
    the expected tokens so far are 1 + q1 + q1 q2 + ..., and the next guess adds about
    prod(q) * q_last more."""
    k = len(confidences)
    reach = np.cumprod(confidences)
    now = (1 + reach.sum()) / (k * cost.draft_s + float(cost.verify(k + 1)))
    more = (1 + reach.sum() + reach[-1] * confidences[-1]) / ((k + 1) * cost.draft_s + float(cost.verify(k + 2)))
    return bool(more > now)


@dataclass
class Acceptance:
    """A running estimate of per-position acceptance that forgets slowly (the text changes)."""

    accepted: float = 1.0  # a weak prior of one accept and one reject
    judged: float = 2.0
    decay: float = 0.98
    history: list[float] = field(default_factory=list, repr=False)

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    @property
    def optimistic(self) -> float:
        """alpha plus an uncertainty bonus that shrinks with evidence (UCB): an option that has
        not been tried enough gets tried, instead of being ruled out by its prior forever."""
        return min(0.99, self.alpha + 0.3 * (1.0 / self.judged) ** 0.5)

    def observe(self, n_accepted: int, rejected: bool) -> None:
        self.accepted = self.accepted * self.decay + n_accepted
        self.judged = self.judged * self.decay + n_accepted + int(rejected)

    def relax(self, weight: float = 0.01) -> None:
        """Drift a little towards the prior, so that an option ruled out is retried now and then."""
        self.accepted += weight * (1.0 - self.accepted)
        self.judged += weight * (2.0 - self.judged)
