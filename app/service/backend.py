"""What the app talks to: one protocol for this machine's models and for a server on another.

A backend streams what it knows. The local one yields the engine's own events as the service passes them
on: a Prefill, a Said per target step (its tokens and their provenance), and an Answered whose figures
are the engine's. A remote one knows only the text as it arrives (a Chunk each) and whatever figures the
server reports, which its Answered carries, saying where they come from. The UI draws whatever arrives and never asks which
backend it has. Both are made by `open_backend` (`specchat.service.local`); tests give the app a scripted
fake instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol, Sequence, Union

from specchat.decoding.engine import GenerationConfig
from specchat.llama.template import Message
from specchat.models.fetch import Progress
from specchat.service.choices import ModelChoice, RemoteChoice
from specchat.service.events import BackendEvent


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
    pair: str | None  # the catalog's pair it answers with ("": the default pair); None: files, or a server's model
    draft: str | None  # after load: the draft model beside the target; None: none, or a server that does not say
    guesser_asked: bool  # the guesser is a request (a server runs what it can) rather than what runs
    # After load: the chat template's variable that turns thinking on and off (None: it has none). A
    # server's is a request: it passes chat_template_kwargs to a template that may not read them.
    thinking_switch: str | None

    def load(self, progress: Progress) -> None: ...

    def baseline(self) -> Baseline: ...

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event, think: bool | None = None,
             tools: Sequence[dict[str, Any]] | None = None, tool_choice: str = "auto") -> Iterator[BackendEvent]:
        """Answer the last message; `think` turns a reasoning model's thinking on or off (None: as it does
        unasked), for a template with a switch (`thinking_switch`); `tools` (OpenAI function schemas) are
        offered to the model, its calls coming back on the Done, and `tool_choice` "required" makes it call one (a
        server that refuses tools says so in one line)."""

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None:
        """Free what it holds, once any running generation has ended; it answers nothing afterwards."""


BackendFactory = Callable[[Union[ModelChoice, RemoteChoice]], Backend]
