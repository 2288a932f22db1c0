"""What the UI talks to: loaded models plus chat and rewrite calls yielding engine events.

The real backend wraps the engine; tests give the UI a scripted fake with the same methods.
The UI imports this module; this module never imports the UI.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence, Union

from specchat.llama.template import ChatPrompter, Message
from specchat.loader import LoadedPair, ModelChoice, load_pair
from specchat.models.fetch import Progress
from specchat.spec.engine import Done, Engine, Event, GenerationConfig, final
from specchat.spec.guessers import NoGuesser
from specchat.store.files import cache_file, read_cache, update_cache


@dataclass(frozen=True)
class Notice:
    """Something the user should know about this generation (e.g. old turns were dropped)."""

    text: str


BackendEvent = Union[Event, Notice]


@dataclass(frozen=True)
class Baseline:
    tokens_per_s: float
    how: str


class Backend(Protocol):
    name: str
    has_draft: bool
    n_ctx: int  # tokens the context holds (once loaded)
    warnings: list[str]  # after load: what was left out and why (e.g. a draft that failed to load)

    def load(self, progress: Progress) -> None: ...

    def baseline(self) -> Baseline | None: ...

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]: ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None:
        """Free the models, once any running generation has ended."""


class EngineBackend:
    """The real thing: a loaded pair, and the guessers over it."""

    def __init__(self, choice: ModelChoice) -> None:
        self.choice = choice
        self.name = "loading…"
        self.has_draft = False
        self._baseline: Baseline | None = None
        self._pair: LoadedPair | None = None
        self.warnings: list[str] = []
        # Held for the whole of a generation: close() waits for it, so models are never freed
        # under a running generation and two generations never share the engine.
        self._busy = threading.Lock()

    def load(self, progress: Progress) -> None:
        progress("loading models", 0, 1)
        pair = self._pair = load_pair(self.choice, progress)
        self.target, self.has_draft, self.name = pair.target, pair.draft is not None, pair.name
        self.warnings = pair.warnings
        progress("measuring this machine's decode costs (first run only)", 0, 1)
        self.guessers = {name: pair.guesser(name) for name in pair.guesser_names()}
        self.engine = Engine(self.target)
        self.prompter = ChatPrompter(self.target)
        progress("measuring plain decoding", 0, 1)
        self._baseline = self._measure_baseline()
        progress("ready", 1, 1)

    def close(self) -> None:
        with self._busy:
            if self._pair is not None:
                self._pair.close()
                self._pair = None

    def baseline(self) -> Baseline | None:
        return self._baseline

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    def count_tokens(self, text: str) -> int:
        return len(self.target.tokenize(text, special=False))

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]:
        messages = list(messages)
        prompt = self.prompter.tokens(messages)
        dropped = 0
        # Context policy: drop the oldest turns (never the system prompt or the last message).
        while len(prompt) + min(config.max_tokens, 256) > self.target.n_ctx and len(messages) > 2 - (
                messages[0].role != "system"):
            del messages[1 if messages[0].role == "system" else 0]
            dropped += 1
            prompt = self.prompter.tokens(messages)
        if dropped:
            yield Notice(f"the conversation is longer than the {self.target.n_ctx}-token context: "
                         f"the oldest {dropped} message(s) were left out of this answer")
        with self._busy:
            if not self.prompter.continued and self._pair is not None:
                # Another conversation (or a regenerated answer): auto starts from its priors, as a
                # fresh `specchat generate` does, rather than from what another text taught it.
                self.guessers["auto"] = self._pair.guesser("auto")
            self.engine.guesser = self.guessers.get(guesser, self.guessers["auto"])
            for event in self.engine.generate(prompt, config, cancel):
                if isinstance(event, Done):
                    self.prompter.remember(event.token_ids)
                yield event

    def _measure_baseline(self) -> Baseline:
        """Plain decoding speed of this target on this machine, timed once and cached."""
        path = cache_file("baseline.json")
        cached = read_cache(path).get(self.target.cache_key)
        if cached is not None:
            return Baseline(**cached)
        self.engine.guesser = NoGuesser()
        prompt = self.prompter.tokens([Message("user", "Count from one to fifty in words.")])
        done = final(self.engine.generate(prompt, GenerationConfig(max_tokens=48)))
        baseline = Baseline(done.stats.tokens_per_s,
                            f"plain decoding timed once on this machine ({done.stats.n_tokens} tokens, "
                            f"{time.strftime('%Y-%m-%d')}), cached per model file and thread count")
        update_cache(path, self.target.cache_key, baseline.__dict__)
        return baseline


BackendFactory = Callable[[ModelChoice], Backend]
