"""What the app talks to: one protocol for this machine's models and for a server on another.

A backend streams what it knows. The local one yields the engine's own events: a Prefill, a Step per
target step (its tokens and their provenance), and a Done whose figures are the engine's. A remote
one knows only the text as it arrives (a Chunk each) and whatever figures the server reports, which
its Done carries, saying where they come from. The UI draws whatever arrives and never asks which
backend it has. Both are made by `open_backend`; tests give the app a scripted fake instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence, Union

from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.models.fetch import Progress
from specchat.service.chat import ChatService, Notice
from specchat.service.choices import ModelChoice, RemoteChoice
from specchat.service.history import History
from specchat.service.loader import load_pair
from specchat.spec.engine import Event, GenerationConfig
from specchat.spec.guessers import available
from specchat.store.conversations import Store


@dataclass(frozen=True)
class Chunk:
    """Text a server streamed: how it split into tokens and steps, only the server knows."""

    text: str
    seconds: float  # since the chunk before (or since the first, for the first)


# What a backend streams: the engine's events, notices about the answer, and a server's text. The UI takes
# all three from here, whichever backend it has.
BackendEvent = Union[Event, Notice, Chunk]


@dataclass(frozen=True)
class Baseline:
    """Plain decoding's speed, which the speedup is measured against (None: not known here)."""

    tokens_per_s: float | None
    how: str


class Backend(Protocol):
    name: str
    server: str | None  # the server that answers (what conversations are marked with); None: this machine
    n_ctx: int  # tokens the context holds (once loaded)
    warnings: list[str]  # after load: what was left out and why (e.g. a draft that failed to load)
    guessers: list[str]  # after load: the guessers it can run, in the registry's order

    def load(self, progress: Progress) -> None: ...

    def baseline(self) -> Baseline: ...

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]: ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None:
        """Free what it holds, once any running generation has ended; it answers nothing afterwards."""


BackendFactory = Callable[[Union[ModelChoice, RemoteChoice]], Backend]


def open_backend(choice: ModelChoice | RemoteChoice, store: Store | None = None) -> Backend:
    """The backend for a choice: this machine's models (copying from the store's conversations, if
    given), or a server (`specchat[remote]`)."""
    if isinstance(choice, RemoteChoice):
        from specchat.service.remote import RemoteBackend

        return RemoteBackend(choice)
    return LocalBackend(choice, store)


class LocalBackend:
    """This machine's models: a loaded pair behind the conversation service."""

    server = None

    def __init__(self, choice: ModelChoice, store: Store | None = None) -> None:
        self.choice, self.store = choice, store
        self.name = "loading…"
        self.warnings: list[str] = []
        self.guessers: list[str] = []
        self._service: ChatService | None = None
        self._closed = False
        # Held for the whole of a generation: close() waits for it, so models are never freed
        # under a running generation and two generations never share the engine.
        self._busy = threading.Lock()

    def load(self, progress: Progress) -> None:
        progress("loading models", 0, 1)
        pair = load_pair(self.choice, progress)
        self.name, self.warnings = pair.name, pair.warnings
        progress("measuring this machine's decode costs (first run only)", 0, 1)
        pair.curve(waiting=lambda line: progress(line, 0, 1))
        history = None
        if self.store is not None:
            progress("reading your conversations for the history guesser", 0, 1)
            history = History.of(self.store, pair.target)
        self._service = ChatService(pair, history)
        self.guessers = available(pair.capabilities)
        progress("ready", 1, 1)

    @property
    def service(self) -> ChatService:
        if self._service is None:
            raise SpecchatError("the models are closed" if self._closed else "the models are not loaded yet")
        return self._service

    @property
    def n_ctx(self) -> int:
        return self.service.n_ctx

    def baseline(self) -> Baseline:
        """Plain decoding now: the live curve's one position, which real steps keep current."""
        if self._service is None or self._service.pair.costs.calibration is None:
            return Baseline(None, "not measured yet")
        costs = self._service.pair.costs
        one = float(costs.curve.verify(1))
        learned = len(costs.learned.verify.get(1, ()))
        return Baseline(1 / one, f"one plain step on this machine now, {1000 * one:.0f} ms"
                        + (f" (from its last {learned} plain steps)" if learned >= 3 else " (as measured)"))

    def count_tokens(self, text: str) -> int:
        return self.service.count_tokens(text)

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]:
        with self._busy:
            yield from self.service.chat(messages, config, guesser, cancel)

    def close(self) -> None:
        with self._busy:
            if self._service is not None:
                self._service.close()
            self._service, self._closed = None, True

