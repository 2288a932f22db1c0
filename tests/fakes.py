"""A scripted backend for UI tests: the same methods as the real one, no model."""

from __future__ import annotations

import threading
from typing import Iterator, Sequence

from specchat.backend import BackendEvent, Baseline, Notice
from specchat.llama.template import Message
from specchat.spec.engine import Done, GenerationConfig, Prefill, Source, Stats, Step, Token


class FakeBackend:
    name = "fake-target + fake-draft"
    has_draft = True
    n_ctx = 4096

    def __init__(self, answer: str = "Hello **world**, this is a scripted answer.",
                 pause_after: int | None = None, notice: str | None = None) -> None:
        self.answer = answer
        self.notice = notice  # yielded before the answer, as the real backend does when it drops turns
        self.pause_after = pause_after  # steps after which generation waits for a cancel
        self.calls: list[tuple[list[Message], str]] = []
        self.paused = threading.Event()
        self.closed = False

    def load(self, progress) -> None:
        progress("loading fake models", 1, 1)

    def close(self) -> None:
        self.closed = True

    def baseline(self) -> Baseline:
        return Baseline(25.0, "fixed by the test")

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[BackendEvent]:
        self.calls.append((list(messages), guesser))
        if self.notice:
            yield Notice(self.notice)
        yield Prefill(12, 0, 0.05)
        words = [w + " " for w in self.answer.split(" ")]
        words[-1] = words[-1].rstrip()
        stats, text, ids = Stats(n_prompt=12, prefill_s=0.05), "", []
        for n, start in enumerate(range(0, len(words), 3)):
            if self.pause_after is not None and n == self.pause_after:
                self.paused.set()
                cancel.wait(10)
            if cancel.is_set():
                yield Done("cancelled", text, tuple(ids), stats)
                return
            chunk = words[start:start + 3]
            sources = [Source.DRAFT] * (len(chunk) - 1) + [Source.CORRECTION]
            tokens = tuple(Token(len(ids) + i, w, s) for i, (w, s) in enumerate(zip(chunk, sources)))
            step = Step(tokens, "".join(chunk), 3, len(chunk) - 1, 0.01, 0.03, "draft")
            ids += [t.id for t in tokens]
            text += step.text
            stats = stats.add_step(step)
            yield step
        yield Done("eog", text, tuple(ids), stats)
