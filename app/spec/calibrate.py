"""Measuring a model's decode cost curve on this machine (the loader caches it per model file,
backend and thread count)."""

from __future__ import annotations

import statistics
import time

from specchat.llama.model import Model
from specchat.llama.mtp import MtpHead
from specchat.llama.session import Memory
from specchat.spec.policy import CostCurve, Rollback

MAX_POSITIONS = 32
# Every n up to 17 is timed: CPU kernels batch rows in fours and eights, so the curve is not smooth
# there (on the 2-core test machine 16 positions cost 150 ms and 15 cost 200). The rest is
# interpolated.
_MEASURED = (*range(1, 18), 20, 24, 28, 32)
_CONTEXT = 128  # timings are taken at this position, a typical early-answer depth


def _time_decode(model: Model, n: int, repeats: int = 3) -> float:
    session = model.session
    base = len(session.tokens)
    session.checkpoint(lasting=True)  # where a recurrent state comes back to after each try
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        session.decode([model.n_vocab // 2] * n, "all")
        times.append(time.perf_counter() - t0)
        session.rewind(base)
    return statistics.median(times)


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


def measure_curve(target: Model, draft: Model | None, mtp: MtpHead | None = None) -> CostCurve:
    """Time verifying n = 1..32 positions on the target, one draft token, one token of the target's
    MTP layers and, where the cache cannot drop positions, a rollback (about 15 s on a 2-core CPU for
    a 1.5B target; a GPU takes a fraction of that)."""
    sessions = [m.session for m in (target, draft) if m is not None]
    for s in sessions:
        s.clear()
        s.decode([1] * _CONTEXT, "none")
    _time_decode(target, 16, repeats=2)  # warm up: the first batches after a prefill run slow
    measured = {n: _time_decode(target, n) for n in _MEASURED}
    curve = [0.0] * MAX_POSITIONS
    points = sorted(measured)
    for n in range(1, MAX_POSITIONS + 1):
        lo = max(p for p in points if p <= n)
        hi = min(p for p in points if p >= n)
        w = 0.0 if hi == lo else (n - lo) / (hi - lo)
        curve[n - 1] = measured[lo] * (1 - w) + measured[hi] * w
    draft_s = _time_decode(draft, 1, repeats=5) if draft is not None else 0.0
    mtp_s = _time_mtp(mtp) if mtp is not None else 0.0
    rollback = _time_rollback(target)
    for s in sessions:
        s.clear()
    return CostCurve(curve, draft_s, mtp_s=mtp_s, rollback=rollback)
