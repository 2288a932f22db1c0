"""A scripted backend for UI tests: the same methods as the real one, no model."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator, Sequence

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Prefill, Source, Stats, Token
from specchat.decoding.guessers import GUESSERS
from specchat.llama.template import Message, ToolCall
from specchat.service.backend import Baseline
from specchat.service.events import Answered, BackendEvent, Notice, Said

PAUSE_S = 10.0  # the longest a paused generation waits for a cancel or a resume


class FakeBackend:
    name = "fake-target + fake-draft"
    server = None
    pair = ""
    guesser_asked = False
    n_ctx = 4096
    thinking_switch: str | None = None

    def __init__(self, answer: str = "Hello **world**, this is a scripted answer.",
                 pause_after: int | None = None, notice: str | None = None,
                 load_gate: threading.Event | None = None, plain_s: float = 0.0, slowdown: float = 1.0,
                 thinking: str = "") -> None:
        self.answer = answer
        self.thinking = thinking  # thought before the answer, as a reasoning model's service splits it out
        self.plain_s = plain_s  # what the service would judge a plain step cost during the answer (0: not known)
        self.slowdown = slowdown  # ... and how much slower than usual its steps ran
        self.warnings: list[str] = []
        self.guessers = list(GUESSERS)
        self.draft: str | None = "fake-draft"
        self.notice = notice  # yielded before the answer, as the real backend does when it drops turns
        self.pause_after = pause_after  # steps after which each generation waits for a cancel or a resume
        self.calls: list[tuple[list[Message], str]] = []
        self.thinks: list[bool | None] = []  # each call's thinking switch
        self.offered: list[list[str]] = []  # each call's tools, by name
        self.tool_choices: list[str] = []  # and its tool choice
        # What the model calls when it is offered tools: each answer takes the first entry (its calls), its Done
        # then ending with reason "tool_calls", as the conversation service's does.
        self.tool_script: list[tuple[ToolCall, ...]] = []
        self.paused = threading.Event()  # some generation has paused
        self.pauses = 0  # how many times a generation has paused
        self._resume = threading.Semaphore(0)
        self.closed = False
        self.closing = threading.Event()
        self.last_done: Answered | None = None
        # As in LocalBackend: a lock held for the whole of a generation, which close() waits for.
        self.lock = threading.Lock()
        self.running = 0  # generations begun and not yet done (counted before they take the lock)
        self.max_running = 0
        self.log: list[str] = []  # "start", "done", "end" (the generator is over) and "close", in order
        self._count = threading.Lock()
        self.load_gate = load_gate  # when given, load() reports a step without a size and waits for it
        self.loading = threading.Event()  # load() is waiting on load_gate

    def _note(self, what: str, running: int = 0) -> None:
        with self._count:
            self.running += running
            self.max_running = max(self.max_running, self.running)
            self.log.append(what)

    def resume(self) -> None:
        """Let a paused generation go on without a cancel (or the next one pass its pause)."""
        self._resume.release()

    def load(self, progress) -> None:
        if self.load_gate is not None:
            progress("loading fake models", 0, 1)  # as LocalBackend does while it loads
            self.loading.set()
            self.load_gate.wait(PAUSE_S)
        progress("loading fake models", 1, 1)

    def close(self) -> None:
        self.closing.set()  # called; what follows waits for a running generation
        with self.lock:  # as LocalBackend: only once any running generation has ended
            self.closed = True
            self._note("close")

    def baseline(self) -> Baseline:
        return Baseline(25.0, "fixed by the test")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event, think: bool | None = None,
             tools: Sequence[dict] | None = None, tool_choice: str = "auto") -> Iterator[BackendEvent]:
        self.calls.append((list(messages), guesser))
        self.thinks.append(think)
        self.offered.append([t["function"]["name"] for t in tools or ()])
        self.tool_choices.append(tool_choice)
        calls = self.tool_script.pop(0) if tools and self.tool_script else ()
        self._note("start", +1)
        done = False
        try:
            with self.lock:
                for event in self._generate(cancel):
                    if isinstance(event, Done) and calls and event.reason != "cancelled":
                        event = replace(event, calls=calls, reason="tool_calls")
                    if isinstance(event, Done):
                        self.last_done, done = event, True
                        # Over, as far as the engine goes: what follows is the consumer closing the generator.
                        self._note("done", -1)
                    yield event
        finally:
            if not done:
                self._note("done", -1)
            self._note("end")

    def _wait(self, cancel: threading.Event) -> None:
        with self._count:
            self.pauses += 1
        self.paused.set()
        deadline = time.monotonic() + PAUSE_S
        while not cancel.is_set() and time.monotonic() < deadline:
            if self._resume.acquire(timeout=0.01):
                return

    def _generate(self, cancel: threading.Event) -> Iterator[BackendEvent]:
        if self.notice:
            yield Notice(self.notice)
        yield Prefill(12, 0, 0.05)
        words = [w + " " for w in self.answer.split(" ")]
        words[-1] = words[-1].rstrip()
        stats, text, ids = Stats(n_prompt=12, prefill_s=0.05), "", []
        thought = [w + " " for w in self.thinking.split(" ")] if self.thinking else []
        for start in range(0, len(thought), 3):  # the thinking streams first, a step of 3 tokens at a time
            chunk = thought[start:start + 3]
            step = Said(tuple(Token(len(ids) + i, w, Source.PLAIN) for i, w in enumerate(chunk)), "", 0, 0, 0.0, 0.03,
                        thinking="".join(chunk))
            ids += [t.id for t in step.tokens]
            stats = stats.add_step(step)
            yield step
        thinking = dict(thinking=self.thinking, thinking_tokens=len(thought), thinking_s=0.03 * len(range(0, len(thought), 3)))
        for n, start in enumerate(range(0, len(words), 3)):
            if self.pause_after is not None and n == self.pause_after:
                self._wait(cancel)
            if cancel.is_set():
                yield Answered("cancelled", text, tuple(ids), stats, **thinking)
                return
            chunk = words[start:start + 3]
            sources = [Source.DRAFT] * (len(chunk) - 1) + [Source.CORRECTION]
            tokens = tuple(Token(len(ids) + i, w, s) for i, (w, s) in enumerate(zip(chunk, sources)))
            step = Said(tokens, "".join(chunk), 3, len(chunk) - 1, 0.01, 0.03, "draft")
            ids += [t.id for t in tokens]
            text += step.text
            stats = stats.add_step(step)
            yield step
        yield Answered("eog", text, tuple(ids), stats, plain_s=self.plain_s, slowdown=self.slowdown, **thinking)
