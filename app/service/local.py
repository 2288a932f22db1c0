"""This machine's models as a conversation service, opened the one way that the app, `generate`, `serve` and
the measuring commands all use, so that none of them skips a step or takes them in another order; and the
app's backend over it (`LocalBackend`), or over a server (`open_backend`)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

from specchat.decoding.engine import GenerationConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.models.fetch import Progress
from specchat.service.backend import Backend, Baseline
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice, RemoteChoice
from specchat.service.events import BackendEvent
from specchat.service.history import History
from specchat.service.loader import load_pair
from specchat.store.conversations import Store

MEASURING = "measuring this machine's decode costs (first run only)"


def open_local(choice: ModelChoice, progress: Progress | None = None, store: Store | None = None, *,
               guesser: str | None = None, warn: Callable[[str], None] = lambda line: None,
               fresh_costs: bool = False, chat: bool = False, think: bool | None = None) -> ChatService:
    """Load the pair (fetching what is missing); read the store's conversations for the history guesser
    (where a store is given); refuse at once, in one line, a `guesser` it cannot run, and (`chat`) a target
    with no chat template or a `think` asked of a template with no switch for it; say what was left out
    (`warn`, a line each); and measure this machine's cost
    curve for it (cached per machine; `fresh_costs`: measured again now, as a benchmark wants). The models
    are freed if any step fails."""
    say = progress or (lambda what, done, total: None)
    pair = load_pair(choice, progress)
    try:
        service = ChatService(pair)
        if store is not None:
            say("reading your conversations for the history guesser", 0, 1)
            service.history = History.of(store, pair.target)
        if guesser is not None:
            service.require(guesser)
        if chat:  # a base model, or a switch the template lacks, is refused here, not after a first measurement
            service.template_variables(think)
        for warning in pair.warnings:
            warn(warning)
        measured = False  # said only when it takes time: a cached curve is read at once

        def measuring() -> None:
            nonlocal measured
            measured = True
            say(MEASURING, 0, 1)

        pair.curve(fresh_costs, waiting=lambda line: say(line, 0, 1), measuring=measuring)
        if measured:
            say(MEASURING, 1, 1)
        return service
    except BaseException:
        pair.close()
        raise


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
    guesser_asked = False

    def __init__(self, choice: ModelChoice, store: Store | None = None) -> None:
        self.choice, self.store = choice, store
        self.pair = (choice.pair or "") if choice.target is None else None
        self.draft: str | None = None
        self.name = "loading…"
        self.warnings: list[str] = []
        self.guessers: list[str] = []
        self.thinking_switch: str | None = None
        self._service: ChatService | None = None
        self._closed = False
        # Held for the whole of a generation: close() waits for it, so models are never freed
        # under a running generation and two generations never share the engine.
        self._busy = threading.Lock()

    def load(self, progress: Progress) -> None:
        progress("loading models", 0, 1)
        service = open_local(self.choice, progress, self.store)  # the app shows the warnings as notices
        self.name, self.warnings, self.guessers = service.pair.name, service.pair.warnings, service.guessers
        self.draft = service.pair.draft.name if service.pair.draft is not None else None
        with contextlib.suppress(SpecchatError):  # a base model has no template, and no switch
            self.thinking_switch = service.thinking_switch
        self._service = service
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
        """Plain decoding now: the last quiet answers' plain steps, else the curve's one position."""
        if self._service is None or self._service.pair.costs.calibration is None:
            return Baseline(None, "not measured yet")
        costs = self._service.pair.costs
        plain = costs.plain_step()
        one = plain or float(costs.curve.verify(1))
        return Baseline(1 / one, f"one plain step on this machine now, {1000 * one:.0f} ms"
                        + (" (the last answers' plain steps)" if plain else " (as measured)"))

    def count_tokens(self, text: str) -> int:
        return self.service.count_tokens(text)

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event, think: bool | None = None,
             tools: Sequence[dict[str, Any]] | None = None, tool_choice: str = "auto") -> Iterator[BackendEvent]:
        with self._busy:
            yield from self.service.chat(messages, config, guesser, cancel, self.service.template_variables(think),
                                         tools=tools or None, tool_choice=tool_choice if tools else None)

    def close(self) -> None:
        with self._busy:
            if self._service is not None:
                self._service.close()
            self._service, self._closed = None, True

