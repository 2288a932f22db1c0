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
from dataclasses import dataclass, field
from typing import Iterable, Union

from textual.message import Message
from textual.message_pump import MessagePump

from specchat.decoding.events import Done, Prefill, Step
from specchat.errors import SpecchatError
from specchat.mcptools.agent import RoundsSpent, ToolRan
from specchat.service.events import Answered, Chunk, Notice, Said
from specchat.store.files import log_path

log = logging.getLogger("specchat.ui")

DRAW_INTERVAL_S = 0.1, 1.0  # redraw at most ten times a second, and at least once a second
UI_SHARE = 0.015  # of a core, for the UI thread while an answer streams (bench/ui_cost: the draws ~0.5 s apart at 40 tok/s)


Piece = Union[Said, Chunk]  # what streams: the engine's steps as the service said them, or a server's chunks of text


@dataclass
class Pending:
    """What a generation produced since the last batch. With tools, one generation is several answers: an answer
    that ends in calls (its `done`), the calls run (`ran`: the agent loop's ToolRan and RoundsSpent), the next answer,
    and so on."""

    pieces: list[Piece] = field(default_factory=list)
    prefill: Prefill | None = None
    notices: list[str] = field(default_factory=list)
    ran: list[object] = field(default_factory=list)
    done: Answered | None = None  # an answer's end: held until the next event shows whether more follows

    def add(self, event: object) -> bool:
        """Take one event; True where it must go out at once (a call that ran: the next may wait on the user)."""
        if isinstance(event, (Step, Chunk)):
            self.pieces.append(event)
        elif isinstance(event, Prefill):
            self.prefill = event
        elif isinstance(event, Notice):
            self.notices.append(event.text)
        elif isinstance(event, Done):
            self.done = event
        else:
            self.ran.append(event)
            return True
        return False


class GenerationBatch(Message):
    """What a generation produced since the last batch (`Pending`'s fields), and whether it failed (`error`) or
    ended (`last`: no batch follows). The handler must call `handled()`."""

    def __init__(self, pump: Pump, pending: Pending, error: str | None, last: bool) -> None:
        super().__init__()
        self.pump, self.error, self.last = pump, error, last
        self.pieces, self.prefill, self.notices = pending.pieces, pending.prefill, pending.notices
        self.ran, self.done = pending.ran, pending.done

    @property
    def text(self) -> str:
        return "".join(piece.text for piece in self.pieces)

    @property
    def thinking(self) -> str:
        return "".join(piece.thinking for piece in self.pieces)

    def handled(self) -> None:
        """Called on the UI thread: the next batch may go out (after the interval)."""
        self.pump.ui_done(time.thread_time(), time.monotonic())


SHOWN = (Step, Chunk, Prefill, Notice, Done, ToolRan, RoundsSpent)  # the events a screen draws


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

    def run(self, events: Iterable[object]) -> Answered | None:
        """Consume `events` in the worker thread until the generation ends (its last Done is returned) or fails
        (None: the UI got the error). Besides the backend's events, the agent loop's pass through."""
        pending, last, posted = Pending(), None, float("-inf")

        def post(error: str | None = None, end: bool = False) -> None:
            nonlocal pending, posted
            self.ready.clear()
            self.target.post_message(GenerationBatch(self, pending, error, end or error is not None))
            pending, posted = Pending(), time.monotonic()

        try:
            for event in events:
                if not isinstance(event, SHOWN):
                    continue  # the agent loop's Added: the screen stores what it shows itself
                if pending.done is not None:  # more follows the answer that ended: it goes out now, not as the last
                    post()
                if pending.add(event):
                    post()
                    continue
                last = event if isinstance(event, Done) else last
                # The first piece goes out at once, with the prefill (time to first token is what users feel);
                # after it, only once the UI is ready for more.
                first = posted == float("-inf") and pending.pieces
                if pending.done is None and (first or (pending.pieces and self.ready.is_set()
                                                       and time.monotonic() - posted >= self.interval)):
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
