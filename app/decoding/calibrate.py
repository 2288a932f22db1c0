"""Measuring a model's decode cost curve on this machine, and checking the measurement (the service
caches it per model file, backend and thread count, with what the checks found).

A laptop is seldom quiet, and one unlucky measurement must not decide for weeks: each point is timed
several times and the lowest kept (interference only ever slows a timing); the curve is fitted so that
it cannot go down; and the result is checked against itself and against what else the machine was
doing. A measurement that fails is not trusted: auto then decides on `conservative`, which never
guesses, until a measurement passes.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

from specchat.decoding.policy import CostCurve, Rollback
from specchat.decoding.timing import non_decreasing
from specchat.llama.cores import FITTER, mark, others_between
from specchat.llama.model import Model
from specchat.llama.mtp import MtpHead
from specchat.llama.session import Memory

MAX_POSITIONS = 32
REPEATS = 5  # tries per point; the lowest is kept
# From this many positions on, a try takes several plain steps' time and varies less from try to try: fewer tries
# do. Fewer tries can only keep a higher lowest, a dearer curve, never a cheaper one than the machine's.
FEWER_FROM, FEWER = 5, 3
# A measurement is not trusted when other programs took more than this many cores that llama.cpp's
# threads needed, when its tries differ by more than this from one another, or when one position
# differs by more than this from a plain step timed on its own.
MAX_CONTENTION = 0.25
MAX_SPREAD = 1.25
MAX_MISMATCH = 0.3
# Every n up to 17 is timed: CPU kernels batch rows in fours and eights, so the curve is not smooth
# there (on the 2-core test machine 16 positions cost 150 ms and 15 cost 200). Beyond, CPU curves
# run straight (bench/curves.json): 24 and 32 are timed and the rest interpolated.
_MEASURED = (*range(1, 18), 24, 32)
_CONTEXT = 128  # timings are taken at this position, a typical early-answer depth


@dataclass(frozen=True)
class Calibration:
    """A measured curve and what its checks found."""

    curve: CostCurve
    trusted: bool
    problem: str = ""  # why it is not trusted, in words for the user
    contention: float | None = None  # cores other programs took from llama.cpp's threads (None: unknown)
    spread: float = 1.0  # the median, over points, of a point's typical try against its lowest
    measured_at: float = 0.0  # time.time()


def conservative(plain_s: float, rollback: Rollback | None = None) -> CostCurve:
    """The curve auto decides on while no measurement is trusted: every position verified costs a plain
    step and every drafted token another, so no guess can pay, and auto decodes plainly: never slower
    than plain decoding, whatever the machine really costs."""
    return CostCurve([plain_s * n for n in range(1, MAX_POSITIONS + 1)], plain_s, mtp_s=plain_s, rollback=rollback)


class OtherLoad:
    """What other programs took of the CPU during a block, in cores, beyond those llama.cpp's threads
    leave free (Linux's /proc/stat, less this process's own time; None where that cannot be read)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.contention: float | None = None

    def __enter__(self) -> OtherLoad:
        self._start = mark()
        return self

    def __exit__(self, *exc: object) -> None:
        self.contention = self.so_far()

    def so_far(self) -> float | None:
        """The cores other programs took since the block began (None: not known here)."""
        others = others_between(self._start, mark())
        return None if others is None else max(0.0, others - max(0, (os.cpu_count() or 1) - self.threads))


def _times(model: Model, n: int, repeats: int) -> list[float]:
    session = model.session
    base = len(session.tokens)
    session.checkpoint(lasting=True)  # where a recurrent state comes back to after each try
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.decode([model.n_vocab // 2] * n, "all")
        times.append(time.perf_counter() - t0)
        session.rewind(base)
    return times


def tries_of(n: int, repeats: int = REPEATS) -> int:
    """How many times n positions are timed: fewer for the long batches, which vary less (FEWER_FROM)."""
    return repeats if n < FEWER_FROM else min(repeats, FEWER)


def timed_rounds(model: Model, repeats: int = REPEATS) -> dict[int, list[float]]:
    """Tries of every measured size, in rounds that time each size once, so that each size's lowest comes
    from across the whole measurement: timed size by size, a machine whose speed drifted over its 20 s (a
    neighbour that started halfway) gave the sizes timed before it their fast seconds and those after it
    slow ones, and the curve's shape, which is what auto decides by, with them. (Noise faster than that
    the rounds cannot remove: `bench/calibration` shows how much is left on this machine.)"""
    tries: dict[int, list[float]] = {n: [] for n in _MEASURED}
    for r in range(repeats):
        for n in _MEASURED:
            if r < tries_of(n, repeats):
                tries[n] += _times(model, n, 1)
    return tries


def _time_decode(model: Model, n: int, repeats: int = REPEATS) -> float:
    return min(_times(model, n, repeats))


def _time_rollback(model: Model, repeats: int = 5) -> Rollback | None:
    """What taking back a guess costs beyond the verification, on a cache that cannot drop positions:
    saving the state before, restoring it after (the tokens kept are decoded again, at the curve's
    cost). None where positions are simply dropped."""
    session = model.session
    if session.memory is Memory.TRIM:
        return None
    base, saves, restores = len(session.tokens), [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.checkpoint()
        saves.append(time.perf_counter() - t0)
        session.decode([model.n_vocab // 2] * 4, "none")
        session.decode([model.n_vocab // 2], "none")  # beyond what llama.cpp's own snapshots reach
        t0 = time.perf_counter()
        session.rewind(base)
        restores.append(time.perf_counter() - t0)
    return Rollback(statistics.median(saves), statistics.median(restores), session.rollback_depth)


def _time_mtp(head: MtpHead, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        head.begin()
        t0 = time.perf_counter()
        head.step(1)
        times.append(time.perf_counter() - t0)
        head.end()
    return statistics.median(times)


def measure_curve(target: Model, draft: Model | None, mtp: MtpHead | None = None,
                  repeats: int = REPEATS) -> Calibration:
    """Time verifying n = 1..32 positions on the target, one draft token, one token of the target's
    MTP layers and, where the cache cannot drop positions, a rollback, then check the result (20-22 s
    on a 2-core EPYC for the 1.5B target and its draft; a GPU takes a fraction of that)."""
    sessions = [m.session for m in (target, draft) if m is not None]
    FITTER.reset()  # measured with every thread it may use; a busy machine fails the checks instead
    for s in sessions:
        s.clear()
        s.decode([1] * _CONTEXT, "none")
    with OtherLoad(target.n_threads) as load:
        _times(target, 16, 2)  # warm up: the first batches after a prefill run slow
        tries = timed_rounds(target, repeats)
        plain = _plain_step(target, repeats)
        draft_s = _time_decode(draft, 1) if draft is not None else 0.0
        mtp_s = _time_mtp(mtp) if mtp is not None else 0.0
        rollback = _time_rollback(target)
    for s in sessions:
        s.clear()
    measured = {n: min(times) for n, times in tries.items()}
    points = sorted(measured)
    curve = [0.0] * MAX_POSITIONS
    for n in range(1, MAX_POSITIONS + 1):
        lo = max(p for p in points if p <= n)
        hi = min(p for p in points if p >= n)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        curve[n - 1] = measured[lo] * (1 - w) + measured[hi] * w
    spread = statistics.median(statistics.median(times) / min(times) for times in tries.values())
    fitted = CostCurve(non_decreasing(curve).tolist(), draft_s, mtp_s=mtp_s, rollback=rollback)
    problem = check(fitted, plain, load.contention, spread, target.n_threads)
    return Calibration(fitted, not problem, problem, load.contention, spread, time.time())


def _plain_step(model: Model, repeats: int) -> float:
    """One position decoded as plain decoding does it, apart from the curve's batches: a check on it."""
    session = model.session
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.decode([model.n_vocab // 3], "last")
        times.append(time.perf_counter() - t0)
    session.rewind(len(session.tokens) - repeats)
    return min(times)


def check(curve: CostCurve, plain_s: float, contention: float | None, spread: float, threads: int) -> str:
    """Why a measured curve is not to be trusted, or "" if it passes its checks."""
    if contention is not None and contention > MAX_CONTENTION:
        return (f"other programs took {contention:.1f} of the cores that llama.cpp's {threads} threads needed "
                "while it was measured")
    if spread > MAX_SPREAD:
        return f"its timings varied by {spread - 1:.0%} from try to try (the machine was busy)"
    one = float(curve.verify(1))
    if abs(one / plain_s - 1) > MAX_MISMATCH:
        return (f"one position cost {1000 * one:.1f} ms in the curve but {1000 * plain_s:.1f} ms as a plain step "
                "(the machine's speed changed while it was measured)")
    return ""
