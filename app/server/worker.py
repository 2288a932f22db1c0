"""One generation at a time: a worker thread runs jobs in order from a bounded queue.

The batch-1 engine blocks in llama.cpp, so it runs here rather than on the event loop, which stays
free to answer /health and to notice clients that leave. A job's events cross to the loop through an
asyncio queue; a job whose `cancel` is set stops at the engine's next step, or is dropped without
generating if it was still waiting.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from specchat.decoding.events import Done
from specchat.errors import SpecchatError

log = logging.getLogger("specchat.server")

Work = Callable[[threading.Event], Iterator[Any]]


class Busy(Exception):
    """The queue is full; `retry_after` is a guess, in whole seconds, at when a place frees up."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"retry after {retry_after}s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Failed:
    """The job raised before or while generating; `error` is what it raised."""

    error: BaseException


END = object()  # the last item of every job's events


@dataclass
class Counters:
    completed: int = 0  # generations that ran to their end (eog, stop, length)
    cancelled: int = 0  # generations stopped because their client left
    dropped: int = 0  # jobs whose client left while they waited: never started
    rejected: int = 0  # requests the model side refused (a prompt too long, a token id out of range): 400s
    failed: int = 0  # internal errors: 500s
    last: dict[str, Any] = field(default_factory=dict)  # the last generation's end: reason, tokens, steps


class Job:
    def __init__(self, work: Work, loop: asyncio.AbstractEventLoop) -> None:
        self.work, self._loop = work, loop
        self.cancel = threading.Event()
        self._events: asyncio.Queue[Any] = asyncio.Queue()

    def post(self, item: Any) -> None:
        """From the worker thread: hand an item to the request's coroutine."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, item)
        except RuntimeError:  # the loop has closed (the server is stopping): nobody is listening
            self.cancel.set()

    async def next(self) -> Any:
        return await self._events.get()


class Worker:
    def __init__(self, max_waiting: int) -> None:
        self.max_waiting = max_waiting
        self.counters = Counters()
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._running: Job | None = None
        self._stopping = False
        self._mean_s = 1.0  # how long a job takes, smoothed: for Retry-After
        self._thread = threading.Thread(target=self._loop, name="specchat-generation", daemon=True)
        self._thread.start()

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def running(self) -> bool:
        return self._running is not None

    def submit(self, work: Work) -> Job:
        """Queue a job, or raise Busy when `max_waiting` jobs already wait."""
        job = Job(work, asyncio.get_running_loop())
        with self._lock:
            if self._waiting >= self.max_waiting:
                raise Busy(max(1, math.ceil(self._mean_s * (self._waiting + 1))))
            self._waiting += 1
        self._jobs.put(job)
        return job

    def cancel_all(self) -> None:
        """Stop the running generation at its next step and answer every waiting request (the server is
        stopping: its clients hear so now, rather than when the shutdown's grace period runs out)."""
        with self._lock:
            self._stopping = True
            if self._running is not None:
                self._running.cancel.set()
            while True:
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    self._waiting -= 1
                    job.cancel.set()
                    job.post(END)

    def stop(self, timeout: float) -> bool:
        """Cancel everything, let the running step end and the thread exit; True if it did in time."""
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                self._waiting -= 1
                self._running = job
                if self._stopping:  # taken from the queue just as cancel_all emptied it
                    job.cancel.set()
            try:
                if job.cancel.is_set():
                    self.counters.dropped += 1
                else:
                    t0 = time.monotonic()
                    self._run(job)
                    self._mean_s = 0.8 * self._mean_s + 0.2 * (time.monotonic() - t0)
            finally:
                with self._lock:
                    self._running = None
                job.post(END)

    def _run(self, job: Job) -> None:
        try:
            for event in job.work(job.cancel):
                job.post(event)
                if isinstance(event, Done):
                    self._count(event)
        except Exception as e:  # the request's coroutine answers it; the worker goes on
            if isinstance(e, SpecchatError):
                self.counters.rejected += 1
            else:
                self.counters.failed += 1
            job.post(Failed(e))

    def _count(self, done: Done) -> None:
        c = self.counters
        if done.reason == "cancelled":
            c.cancelled += 1
        else:
            c.completed += 1
        c.last = {"reason": done.reason, "predicted_n": done.stats.n_tokens, "steps": done.stats.steps}
