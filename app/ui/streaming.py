"""Running a generation in a worker thread and handing its events to the UI in batches.

The worker never waits for the UI: it posts a `GenerationBatch` message (Textual's post_message
is thread-safe) and goes straight back to decoding. A new batch is posted only once the UI has
handled the previous one, and no sooner than `interval` after it, so the UI draws at a rate
bounded by what drawing costs, the message queue never grows, and whatever the engine produced
meanwhile goes into the next batch. The chat and the rewrite screen both run generations this way.
"""

from __future__ import annotations

import threading
import time
from typing import Iterable

from textual.message import Message
from textual.message_pump import MessagePump

from specchat.backend import BackendEvent, Notice
from specchat.errors import SpecchatError
from specchat.spec.engine import Done, Prefill, Step

DRAW_INTERVAL_S = 0.1  # at most ten redraws a second: the eye sees no difference, llama.cpp's threads do


class GenerationBatch(Message):
    """What a generation produced since the last batch. The handler must call `handled()`."""

    def __init__(self, pump: Pump, steps: list[Step], prefill: Prefill | None, notices: list[str],
                 done: Done | None, error: str | None) -> None:
        super().__init__()
        self.pump, self.steps, self.prefill, self.notices = pump, steps, prefill, notices
        self.done, self.error = done, error

    @property
    def last(self) -> bool:
        """The generation is over (finished, stopped or failed): no batch follows this one."""
        return self.done is not None or self.error is not None

    def handled(self) -> None:
        self.pump.ready.set()


class Pump:
    """Moves one generation's events from a worker thread to `target`, in batches."""

    def __init__(self, target: MessagePump, interval: float = DRAW_INTERVAL_S) -> None:
        self.target, self.interval = target, interval
        self.ready = threading.Event()  # the UI has handled the last batch
        self.ready.set()

    def run(self, events: Iterable[BackendEvent]) -> Done | None:
        """Consume `events` in the worker thread until the generation ends (its Done is returned)
        or fails (None: the UI got the error)."""
        steps: list[Step] = []
        prefill: Prefill | None = None
        notices: list[str] = []
        posted = float("-inf")

        def post(done: Done | None = None, error: str | None = None) -> None:
            nonlocal steps, prefill, notices, posted
            self.ready.clear()
            self.target.post_message(GenerationBatch(self, steps, prefill, notices, done, error))
            steps, prefill, notices, posted = [], None, [], time.monotonic()

        try:
            for event in events:
                if isinstance(event, Step):
                    steps.append(event)
                elif isinstance(event, Prefill):
                    prefill = event
                elif isinstance(event, Notice):
                    notices.append(event.text)
                elif isinstance(event, Done):
                    post(done=event)
                    return event
                # The first step goes out at once, with the prefill (time to first token is what
                # users feel); after it, only once the UI is ready for more.
                first = posted == float("-inf") and steps
                if first or (steps and self.ready.is_set() and time.monotonic() - posted >= self.interval):
                    post()
        except SpecchatError as e:
            post(error=str(e))
            return None
        post(error="the generation ended without finishing")  # a backend bug, reported rather than hung
        return None
