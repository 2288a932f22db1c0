"""This machine's costs for a loaded pair, kept honest, and answers that take turns on the machine.

`PairCosts` holds what auto decides with and what the speedup divides by: a calibration (measured
once, checked, cached per model file, backend and thread count), corrected by what the real steps of
quiet answers showed (`specchat.decoding.timing`), which is saved too, so that the cache converges to
the machine's real figures, in this process and the next, and an answer while the machine was busy
teaches nothing. A calibration that failed its checks is not trusted: auto decides on a curve that never
guesses until one passes, which is tried again at the next load. The speedup divides by plain steps
measured as such, which a wrong figure in the curve cannot bend.

`Turns` makes answers take turns across processes: two specchat processes decoding at once on the
same cores would each run at a fraction of their speed (llama.cpp's threads spin while they wait),
so the second waits for the first to finish its answer, and says so.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict, deque
from dataclasses import asdict
from typing import Callable, Iterator, Sequence

import numpy as np
from filelock import FileLock, Timeout

from specchat.decoding.calibrate import MAX_POSITIONS, Calibration, conservative, measure_curve
from specchat.decoding.events import Done, Step
from specchat.decoding.policy import CostCurve, Rollback
from specchat.decoding.timing import AGREE, AGREE_S, MIN_SEEN, MOVE, StepTimes
from specchat.llama.model import Model
from specchat.llama.mtp import MtpHead
from specchat.service.events import Answered
from specchat.store.files import cache_file, read_cache, update_cache

COSTS = "costs.json"  # this machine's cost curves, in the user cache dir
_FORMAT = "v2"  # the cache's entries; older ones (unchecked measurements) are measured again
# The steps an answer's speedup is measured against, when it had too few plain steps of its own: the last
# quiet answers' plain steps, at most this many and this old.
PLAIN_STEPS = 16
RECENT_S = 120.0
SPIKE = 1.5  # a step this much slower than the answer's typical one was delayed by something else


class PairCosts:
    """The costs of one loaded pair on this machine, live: `curve` changes as steps are observed."""

    def __init__(self, target: Model, draft: Model | None, mtp: MtpHead | None) -> None:
        self.target, self.draft, self.mtp = target, draft, mtp
        parts = (target.cache_key, draft.cache_key if draft is not None else "", "mtp" if mtp is not None else "")
        self.key = "|".join((_FORMAT, *parts))
        self.calibration: Calibration | None = None
        self.learned = StepTimes()
        self.curve = CostCurve([0.0] * MAX_POSITIONS)  # one object, updated in place: guessers keep it
        self.plain: deque[tuple[float, float]] = deque(maxlen=PLAIN_STEPS)  # quiet plain steps: (monotonic, s)
        self._lock = threading.Lock()

    # --- the calibration -------------------------------------------------------------------

    def ensure(self, fresh: bool = False, turns: Turns | None = None, waiting: Callable[[str], None] | None = None,
               measuring: Callable[[], None] | None = None) -> CostCurve:
        """The live curve, from the cache or measured now: when there is none, when the cached one
        failed its checks (tried again), or when `fresh` (a benchmark judges against today's).
        `measuring` hears it when a measurement begins (a cached curve takes no time to say)."""
        entry = read_cache(cache_file(COSTS)).get(self.key) or {}
        if self.calibration is None or fresh:
            self.calibration = None if fresh else _calibration(entry.get("calibration"))
            # "evidence": what answers taught, a figure an answer ("learned", before, held single steps).
            self.learned = StepTimes() if fresh else StepTimes.from_json(entry.get("evidence") or {})
            if self.calibration is None or not self.calibration.trusted:
                # Measured with the machine to itself: another specchat's answer would poison it.
                if measuring is not None:
                    measuring()
                with (turns or machine_turns()).turn(waiting):
                    self.calibration = measure_curve(self.target, self.draft, self.mtp)
                self.learned = StepTimes()  # what was learned on top of another calibration
                self.save()  # only if it passed: one that failed is measured again at the next load
            self._refit()
        return self.curve

    def assume(self, curve: CostCurve) -> None:
        """Decide on these figures, as if measured and trusted here (a known machine; tests)."""
        self.calibration, self.learned = Calibration(curve.copy(), True, measured_at=time.time()), StepTimes()
        self._refit()

    @property
    def prior(self) -> CostCurve:
        """What the steps correct: the calibration if it passed its checks, else the curve that never guesses."""
        c = self.calibration
        assert c is not None, "ensure() first"
        return c.curve if c.trusted else conservative(float(c.curve.verify(1)), c.curve.rollback)

    # --- learning from real steps ------------------------------------------------------------

    def learn(self, steps: Sequence[Step], when: float | None = None) -> None:
        """A quiet answer's steps (one that `judge` found busy teaches nothing): what verifying each number
        of positions cost (the verification alone: what a rollback costs is the calibration's), what each
        drafted token of a drafting model cost (without its catching up with earlier steps, which after a
        run of lookup steps would make a draft look slower per token than it is), and its plain steps, the
        reference the next answers' speedups are measured against."""
        verify: dict[int, list[float]] = defaultdict(list)
        token: dict[str, list[float]] = defaultdict(list)
        for s in steps:
            verify[s.drafted + 1].append(s.verify_s - s.rollback_s)
            if (token_s := s.drafted_token_s) is not None:
                token[s.guesser].append(token_s)
        now = time.monotonic()
        with self._lock:
            self.plain.extend((now, span(s)) for s in steps if not s.drafted)
            self.learned.add_answer(verify, token, time.time() if when is None else when)
            self._refit()

    def _refit(self) -> None:
        fitted = self.learned.curve(self.prior)
        self.curve.verify_s[:] = fitted.verify_s
        self.curve.draft_s, self.curve.mtp_s, self.curve.rollback = fitted.draft_s, fitted.mtp_s, fitted.rollback

    def plain_step(self, own: Sequence[float] = ()) -> float | None:
        """One plain step's seconds now, from plain steps measured as such, never from the curve (which a
        wrong figure would bend along with what it judges): the median of an answer's own plain steps where it
        had MIN_SEEN, else of them with the last quiet answers' of the last RECENT_S. None: none were seen. A
        median, as one step another program delayed moved the mean of a rewrite's 7 plain steps by a third."""
        if len(own) >= MIN_SEEN:
            return float(np.median(own))
        now = time.monotonic()
        recent = [*own, *(seconds for at, seconds in reversed(self.plain) if now - at <= RECENT_S)][:PLAIN_STEPS]
        return float(np.median(recent)) if recent else None

    def judge(self, done: Done, steps: Sequence[Step], before: CostCurve, contention: float | None = None) -> Answered:
        """The answer's speedup, against plain decoding at the same moments, and whether the machine was busy:
        steps much slower than the curve said, or other programs on the cores llama.cpp's threads needed
        (`contention`, measured over the answer).

        The speedup is what plain decoding would have spent on the answer's tokens, at `plain_step` of its
        own plain steps (never the curve's scaling of the guessing ones, which a wrong figure would bend with
        what it judges), over what its steps cost: its plain steps at that same figure, its guessing steps
        as they ran but for a check something else delayed (SPIKE times what the answer's checks typically
        took against the curve: counted at that). Steps are counted by their spans, everything between one
        step's end and the next's: what a user waits for, and what `wall_tokens_per_s` divides by. Counting
        the guess and the check alone left out proposing, rewinding and the engine's own work, so that a
        rewrite measured at 1.16x of plain decoding by the clock showed 1.36x. So an answer of plain steps
        shows exactly 1.00x, and another program's moment moves a rewrite's figure by what it cost, where
        one delayed step among its 7 plain ones made it show 1.48x for 1.15x. `plain_s` is set so that
        `Answered.speedup` is that ratio."""
        produced = done.stats.produced
        if not steps or not produced:
            return Answered.of(done)
        ratios = [(s.verify_s - s.rollback_s) / float(before.verify(s.drafted + 1)) for s in steps]
        slowdown = float(np.median(ratios))
        plain_steps = [span(s) for s in steps if not s.drafted]
        plain = self.plain_step(plain_steps) or float(before.verify(1))
        cost = plain * len(plain_steps) + sum(
            span(s) - s.verify_s + min(s.verify_s, SPIKE * slowdown * float(before.verify(s.drafted + 1)) + s.rollback_s)
            for s in steps if s.drafted)
        return Answered.of(done, plain_s=plain * done.stats.decode_s / cost, slowdown=slowdown,
                           contention=contention or 0.0)

    # --- keeping it ----------------------------------------------------------------------------

    def save(self) -> None:
        """Write the calibration and what the steps taught into the cache, for the next process too."""
        c = self.calibration
        if c is None or not c.trusted:
            return
        update_cache(cache_file(COSTS), self.key, {
            "calibration": {"verify_s": c.curve.verify_s, "draft_s": c.curve.draft_s, "mtp_s": c.curve.mtp_s,
                            "rollback": asdict(c.curve.rollback) if c.curve.rollback else None,
                            "trusted": c.trusted, "problem": c.problem, "contention": c.contention,
                            "spread": c.spread, "measured_at": c.measured_at},
            "evidence": self.learned.to_json(), "learned_at": time.time()})

    def provenance(self) -> list[str]:
        """Where each figure comes from, for `specchat costs`."""
        c = self.calibration
        assert c is not None, "ensure() first"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.measured_at))
        load = "unknown" if c.contention is None else f"{c.contention:.2f} cores taken by other programs"
        lines = [f"calibration: measured {when}; {'passed its checks' if c.trusted else 'NOT TRUSTED: ' + c.problem}"
                 f" (while measuring: {load}; tries varied by {c.spread - 1:.0%})"]
        if not c.trusted:
            lines.append("  not cached: the next start measures again; until one passes, auto decodes plainly "
                         "(it cannot lose to plain decoding)")
        seen = self.learned.seen()
        lines.append(f"learned from {self.learned.answers} quiet answers: positions "
                     f"{', '.join(f'{n} ({k})' for n, k in sorted(seen.items())) or 'none yet'} (answers that gave each "
                     f"figure: a plain step's time, and n positions over the same answer's plain steps, as a drafted "
                     f"token is) correct the calibration's, the rest of its shape moves with them; within {MOVE:.2f}x "
                     f"of it until {AGREE} answers at least {AGREE_S / 60:.0f} minutes apart agree")
        return lines


def span(step: Step) -> float:
    """A step's seconds as the clock saw them, where the engine measured its span (made-up steps: the guess
    and the check)."""
    return step.span_s or step.draft_s + step.verify_s


def _calibration(data: dict | None) -> Calibration | None:
    if not data or len(data.get("verify_s", [])) != MAX_POSITIONS:
        return None
    rollback = data.get("rollback")
    curve = CostCurve(list(data["verify_s"]), float(data["draft_s"]), mtp_s=float(data.get("mtp_s", 0.0)),
                      rollback=Rollback(**rollback) if rollback else None)
    return Calibration(curve, bool(data.get("trusted")), str(data.get("problem", "")), data.get("contention"),
                       float(data.get("spread", 1.0)), float(data.get("measured_at", 0.0)))


class Turns:
    """One answer (or measurement) at a time on this machine, across specchat processes. Within a
    process the turn is reentrant (a measurement inside an answer's turn does not wait for itself);
    one generation at a time in a process is the backend's and the server worker's business."""

    POLL_S = 0.2

    def __init__(self) -> None:
        path = cache_file("answering.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock, self._owner = FileLock(path, thread_local=False), path.with_suffix(".owner")

    def turn(self, waiting: Callable[[str], None] | None = None) -> _Turn:
        """A context in which this process has the machine; `waiting` hears once that it waits, and why."""
        return _Turn(self, waiting)

    def wait(self, cancel: threading.Event | None = None) -> Iterator[str]:
        """Take the turn, yielding once, if it must wait, the line that says why; returns when it has it
        (or when `cancel` is set, without it: check `has`)."""
        said = False
        while cancel is None or not cancel.is_set():
            try:
                self._lock.acquire(timeout=self.POLL_S)
            except Timeout:
                if not said:
                    said = True
                    yield (f"another specchat (pid {self._holder()}) is answering on this machine: this waits for it, "
                           "as two at once on the same cores would each run at a fraction of their speed")
                continue
            self._owner.write_text(str(os.getpid()))
            return

    @property
    def has(self) -> bool:
        return self._lock.is_locked

    def release(self) -> None:
        if self._lock.is_locked:
            self._lock.release()

    def _holder(self) -> str:
        try:
            return self._owner.read_text().strip() or "?"
        except OSError:
            return "?"


_turns: Turns | None = None


def machine_turns() -> Turns:
    """This process's one handle on the machine's turns."""
    global _turns
    if _turns is None:
        _turns = Turns()
    return _turns


class _Turn:
    def __init__(self, turns: Turns, waiting: Callable[[str], None] | None) -> None:
        self.turns, self.waiting = turns, waiting

    def __enter__(self) -> Turns:
        for line in self.turns.wait():
            if self.waiting is not None:
                self.waiting(line)
        return self.turns

    def __exit__(self, *exc: object) -> None:
        self.turns.release()
