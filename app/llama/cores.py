"""llama.cpp's threads fitted to the cores other programs leave free.

llama.cpp's threads spin while they wait for one another at every layer, so a thread that shares its
core with another program holds all the others up: on a 2-core AMD EPYC with one core kept busy, the
1.5B default model decoded at 5.7 tok/s with 2 threads and 9.7 with 1 (2026-12-05; `bench/threads`).
A model loaded without a thread count of its own is fitted while it decodes: every half second a decode
reads what other programs took of the CPU (Linux's /proc/stat, less this process's own time) and
gives llama.cpp the cores they left, never fewer than one. While it has given a core up, and after any
change, it reads every tenth of a second instead: slow to give a core up (a half-second of load), quick to
take it back. A model given a thread count keeps it.
llama.cpp's CPU kernels split work by rows, so the thread count changes no logit (tests/llama/test_cores.py).
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Protocol

PROC_STAT = "/proc/stat"  # Linux's CPU time counters (a test points this at a file of its own)
WINDOW_S = 0.5  # long enough to average over the scheduler's slices, short next to an answer
# While fewer threads run than may, or just after a change or a new start: the next reading comes sooner. Once
# another program stops, the next answer got its core back only after a whole window that still held the
# load, up to a second at one thread: its first answer ran at 0.91-0.94x of plain (bench/busy --moment answer,
# 2026-12-07). A tenth of a second is still ten of the kernel's ticks a core, enough to tell a busy core.
RECHECK_S = 0.1
STALE_S = 5.0  # a reading older than this is of another moment: start again from every core


def busy_s() -> float | None:
    """Seconds every CPU of the machine spent busy so far (None where that cannot be read)."""
    try:
        with open(PROC_STAT, encoding="ascii") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in f.readline().split()[1:9])
    except (OSError, ValueError):  # unreadable, or not the counters it should be (a short line too)
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_s() -> float:
    """Seconds of CPU this process has taken so far."""
    t = os.times()
    return t.user + t.system


Mark = tuple[float, float | None, float]  # the clock, the machine's busy seconds, this process's


def mark() -> Mark:
    return time.monotonic(), busy_s(), own_s()


def others_between(start: Mark, end: Mark) -> float | None:
    """The cores other programs took between two marks (None: not known here)."""
    (t0, busy0, own0), (t1, busy1, own1) = start, end
    if busy0 is None or busy1 is None or t1 <= t0:
        return None
    return max(0.0, (busy1 - busy0) - (own1 - own0)) / (t1 - t0)


def threads_for(cores: int, others: float, most: int) -> int:
    """The threads to run on `cores` while other programs take `others` of them: the cores they leave,
    rounded (a program on half a core or less leaves that core to llama.cpp), at most `most`, at least one."""
    return max(1, min(most, int(cores - others + 0.5)))


class Fitted(Protocol):
    """A llama.cpp context whose threads follow the free cores (Model)."""

    n_threads: int  # the most it may use: every core, by default
    threads: int  # what it uses now

    def use_threads(self, n: int) -> None: ...


class _Fitter:
    """The free cores, measured over the last window, and every fitted context set to them."""

    def __init__(self) -> None:
        self.contexts: weakref.WeakSet[Fitted] = weakref.WeakSet()
        self._mark: Mark | None = None  # at the window's start
        self.others = 0.0  # what other programs took in the last window, in cores
        self.windows = 0  # windows measured so far
        self._window = RECHECK_S  # how long the open window runs

    def refit(self) -> None:
        """Called at every decode: cheap (a clock read) but once a window."""
        now = time.monotonic()
        if self._mark is not None and now - self._mark[0] < self._window:
            return
        here = mark()
        if here[1] is None:
            return
        if self._mark is None or now - self._mark[0] > STALE_S:
            self.reset()
        else:
            self.others = others_between(self._mark, here) or 0.0
            self.windows += 1
            cores = os.cpu_count() or 1
            short = False  # a change, or a thread given up: the next reading comes sooner
            for context in list(self.contexts):
                fit = threads_for(cores, self.others, context.n_threads)
                short |= fit != context.threads or fit < context.n_threads
                context.use_threads(fit)
            self._window = RECHECK_S if short else WINDOW_S
        self._mark = here

    def reset(self) -> None:
        """Every context back to all its threads, and no window open (a calibration measures with all of them);
        the first window after it is short."""
        self._mark, self.others, self._window = None, 0.0, RECHECK_S
        for context in list(self.contexts):
            context.use_threads(context.n_threads)


FITTER = _Fitter()
