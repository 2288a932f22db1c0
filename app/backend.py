"""What the UI talks to: loaded models plus chat and rewrite calls yielding engine events.

The real backend wraps the engine; tests give the UI a scripted fake with the same methods.
The UI imports this module; this module never imports the UI.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol, Sequence, Union

from app.chat import ChatPrompter, Message
from app.engine import Done, Engine, Event, GenerationConfig, final
from app.cost import load_curve
from app.fetch import Progress
from app.files import cache_file, read_cache, update_cache
from app.guessers import AutoGuesser, DraftGuesser, Guesser, LookupGuesser, NoGuesser
from app.llm import Model, check_compatible
from app.runtime import ModelChoice, model_paths


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

    def load(self, progress: Progress) -> None: ...

    def baseline(self) -> Baseline | None: ...

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]: ...

    def count_tokens(self, text: str) -> int: ...


class EngineBackend:
    """The real thing: a target, an optional draft, and the three guessers over them."""

    def __init__(self, choice: ModelChoice) -> None:
        self.choice = choice
        self.name = "loading…"
        self.has_draft = False
        self._baseline: Baseline | None = None

    def load(self, progress: Progress) -> None:
        target_path, draft_path = model_paths(self.choice, progress=progress)
        progress("loading target", 0, 1)
        self.target = Model(target_path, n_ctx=self.choice.n_ctx, n_threads=self.choice.threads)
        self.guessers: dict[str, Guesser] = {"none": NoGuesser(), "lookup": LookupGuesser()}
        draft = None
        if draft_path is not None:
            progress("loading draft", 0, 1)
            draft = Model(draft_path, n_ctx=self.choice.n_ctx, n_threads=self.choice.threads)
            check_compatible(self.target, draft)
            self.guessers["draft"] = DraftGuesser(draft)
            self.has_draft = True
        progress("measuring this machine's decode costs (first run only)", 0, 1)
        # Its own DraftGuesser (same model): auto sets an early stop that plain `draft` must not get.
        self.guessers["auto"] = AutoGuesser(load_curve(self.target, draft), DraftGuesser(draft) if draft else None,
                                            piece=self.target.piece)
        self.engine = Engine(self.target)
        self.prompter = ChatPrompter(self.target)
        self.name = f"{self.target.name}" + (f" + {draft.name}" if draft is not None else "")
        progress("measuring plain decoding", 0, 1)
        self._baseline = self._measure_baseline()
        progress("ready", 1, 1)

    def baseline(self) -> Baseline | None:
        return self._baseline

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
