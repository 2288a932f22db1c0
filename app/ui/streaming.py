"""Running a generation in a worker thread and handing its events to the UI in batches.

The worker never waits for the UI: it posts a `GenerationBatch` message (Textual's post_message
is thread-safe) and goes straight back to decoding. A new batch is posted only once the UI has
handled the previous one, and no sooner than `interval` after it, so the message queue never
grows and whatever the engine produced meanwhile goes into the next batch. The interval follows
what drawing costs: it grows until the UI thread (handling, layout, rendering) uses at most
UI_SHARE of a core, because on a small CPU every cycle it takes is one llama.cpp's threads lose.
The chat and the rewrite screen both run generations this way.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Union

from textual.message import Message
from textual.message_pump import MessagePump

from specchat.decoding.events import Done, Prefill, Step
from specchat.errors import SpecchatError
from specchat.mcptools.agent import RoundsSpent, ToolRan
from specchat.service.events import Chunk, Notice
from specchat.store.files import log_path

log = logging.getLogger("specchat.ui")

DRAW_INTERVAL_S = 0.1, 1.0  # redraw at most ten times a second, and at least once a second
UI_SHARE = 0.025  # of a core, for the UI thread while an answer streams


Piece = Union[Step, Chunk]  # what streams: the engine's steps, or a server's chunks of text


class GenerationBatch(Message):
    """What a generation produced since the last batch. The handler must call `handled()`.

    With tools, one generation is several answers: an answer that ends in calls (its `done`, not `last`), the
    calls run (`ran`: the agent loop's ToolRan and RoundsSpent), the next answer, and so on."""

    def __init__(self, pump: Pump, pieces: list[Piece], prefill: Prefill | None, notices: list[str],
                 done: Done | None, error: str | None, ran: list[object], last: bool) -> None:
        super().__init__()
        self.pump, self.pieces, self.prefill, self.notices = pump, pieces, prefill, notices
        self.done, self.error, self.ran, self.last = done, error, ran, last

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)

    @property
    def thinking(self) -> str:
        return "".join(piece.thinking for piece in self.pieces)

    def handled(self) -> None:
        """Called on the UI thread: the next batch may go out (after the interval)."""
        self.pump.ui_done(time.thread_time(), time.monotonic())


class Pump:
    """Moves one generation's events from a worker thread to `target`, in batches."""

    def __init__(self, target: MessagePump) -> None:
        self.target, self.interval = target, DRAW_INTERVAL_S[0]
        self.ready = threading.Event()  # the UI has handled the last batch
        self.ready.set()
        self._ui_clock: tuple[float, float] | None = None  # the UI thread's CPU time and the wall time

    def ui_done(self, cpu: float, wall: float) -> None:
        """The UI handled a batch: adjust the interval to the share of a core it used since the last."""
        if self._ui_clock is not None and wall > self._ui_clock[1]:
            share = (cpu - self._ui_clock[0]) / (wall - self._ui_clock[1])
            low, high = DRAW_INTERVAL_S
            self.interval = min(high, max(low, self.interval * (share / UI_SHARE) ** 0.5))
        self._ui_clock = cpu, wall
        self.ready.set()

    def run(self, events: Iterable[object]) -> Done | None:
        """Consume `events` in the worker thread until the generation ends (its last Done is returned) or fails
        (None: the UI got the error). Besides the backend's events, the agent loop's pass through: an answer's
        Done is held until the next event shows whether more follows, and a call that ran goes out at once."""
        pieces: list[Piece] = []
        prefill: Prefill | None = None
        notices: list[str] = []
        ran: list[object] = []
        done: Done | None = None  # the last answer's end, not yet posted
        last: Done | None = None
        posted = float("-inf")

        def post(error: str | None = None, end: bool = False) -> None:
            nonlocal pieces, prefill, notices, ran, done, posted
            self.ready.clear()
            self.target.post_message(GenerationBatch(self, pieces, prefill, notices, done, error, ran, end or error is not None))
            pieces, prefill, notices, ran, done, posted = [], None, [], [], None, time.monotonic()

        try:
            for event in events:
                if done is not None:  # more follows the answer that ended: it goes out now, not as the last
                    post()
                if isinstance(event, (Step, Chunk)):
                    pieces.append(event)
                elif isinstance(event, Prefill):
                    prefill = event
                elif isinstance(event, Notice):
                    notices.append(event.text)
                elif isinstance(event, Done):
                    done = last = event
                    continue
                elif isinstance(event, (ToolRan, RoundsSpent)):
                    ran.append(event)
                    post()  # a call's result is shown as it comes: the next may wait on the user
                    continue
                # The first piece goes out at once, with the prefill (time to first token is what
                # users feel); after it, only once the UI is ready for more.
                first = posted == float("-inf") and pieces
                if first or (pieces and self.ready.is_set() and time.monotonic() - posted >= self.interval):
                    post()
        except SpecchatError as e:
            post(error=str(e))
            return None
        except Exception as e:  # a bug, not the user's doing: said in one line, logged whole, the app goes on
            log.exception("the generation failed")
            post(error=f"internal error: {type(e).__name__}: {e} (the traceback is in {log_path()}; please report it)")
            return None
        if last is None:
            post(error="the generation ended without finishing")  # a backend bug, reported rather than hung
            return None
        post(end=True)
        return last
