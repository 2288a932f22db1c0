"""What the conversation service adds to the engine's events (`specchat.decoding.events`): each Step passed
on as a Said and each Done as an Answered, with what the service learned beside what the engine knew (the
thinking and the tool calls split out of the text, what plain decoding cost meanwhile, whether the machine
was busy); a Notice the user should see about an answer; and a server's streamed text (a Chunk).
`BackendEvent` is every event a front end receives, from this machine's models or from a server. A Said is
a Step and an Answered a Done: whoever reads only the engine's facts reads them as before.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Union

from specchat.decoding.events import Done, Prefill, Step
from specchat.llama.template import ToolCall

BUSY_SLOWDOWN = 1.5  # steps this much slower than the machine's curve: something else was running
BUSY_CONTENTION = 0.25  # or other programs took this many of the cores llama.cpp's threads needed
ENGINE_FIGURES = "engine"  # Answered.figures when the stats are the engine's own count of its steps


def _facts(event: Step | Done) -> dict[str, Any]:
    """Every field of an event, by name: what a service event built from it starts from."""
    return {f.name: getattr(event, f.name) for f in fields(event)}


@dataclass(frozen=True)
class Said(Step):
    """A step as the service passes it on: its `text` the answer's part alone, its thinking and the tool calls
    it finished beside it."""

    # A reasoning model's thinking among the released text, split out (`specchat.service.thinking`).
    thinking: str = ""
    # The tool calls this step finished, where the answer was asked with tools, split out of the text, which
    # keeps what is not a call (`specchat.service.toolsplit`).
    calls: tuple[ToolCall, ...] = ()

    @classmethod
    def of(cls, step: Step, **facts: Any) -> Said:
        """The step (the engine's, or one the service already passed on) with these facts told or changed."""
        return cls(**(_facts(step) | facts))


@dataclass(frozen=True)
class Answered(Done):
    """An answer's end as the service passes it on: its `text` the answer alone, with its thinking and calls
    beside it, and how its figures compare with plain decoding on this machine at the same moments."""

    # One plain step's seconds under the same conditions (0: not known), how much slower than usual the
    # steps ran, and the cores other programs took meanwhile (`specchat.service.costs`: the engine does not
    # know the machine).
    plain_s: float = 0.0
    slowdown: float = 1.0
    contention: float = 0.0
    # A reasoning model's thinking, split out of `text`, and the tokens and decode seconds it took (which
    # `stats` count too: they count every token the model decoded).
    thinking: str = ""
    thinking_tokens: int = 0
    thinking_s: float = 0.0
    # The answer's tool calls, split out of `text` (asked with tools), or read from a server's `tool_calls` by
    # the remote backend.
    calls: tuple[ToolCall, ...] = ()
    # Where `stats` come from: the engine's own steps, or what a server reported (`specchat.service.remote`).
    figures: str = ENGINE_FIGURES

    @classmethod
    def of(cls, done: Done, **facts: Any) -> Answered:
        """The answer's end (the engine's, or one the service already passed on) with these facts told or
        changed."""
        return cls(**(_facts(done) | facts))

    @property
    def thinking_tokens_per_s(self) -> float:
        return self.thinking_tokens / self.thinking_s if self.thinking_s > 0 else 0.0

    @property
    def speedup(self) -> float | None:
        """Against plain decoding under the same conditions (`Stats.speedup`)."""
        return self.stats.speedup(self.plain_s)

    @property
    def busy(self) -> bool:
        """The machine was busy during the answer: its figures say more about the machine than the answer."""
        return self.slowdown > BUSY_SLOWDOWN or self.contention > BUSY_CONTENTION

    @property
    def busy_why(self) -> str:
        """Why the answer counts as busy, in words ("" where it does not)."""
        if self.contention > BUSY_CONTENTION:
            return f"other programs took {self.contention:.1f} of the cores it needed"
        return f"steps {self.slowdown:.1f}x slower than usual" if self.busy else ""


@dataclass(frozen=True)
class Notice:
    """Something the user should know about this answer (old turns were left out to fit the context)."""

    text: str


# What the service passes on of an answer: never the engine's own Step or Done, always its Said and Answered.
ChatEvent = Union[Prefill, Said, Answered, Notice]


@dataclass(frozen=True)
class Chunk:
    """Text a server streamed: how it split into tokens and steps, only the server knows."""

    text: str
    seconds: float  # since the chunk before (or since the first, for the first)
    thinking: str = ""  # the server's reasoning_content in this chunk


# What a backend streams: the service's events, notices about the answer, and a server's text. The UI takes
# all of them from here, whichever backend it has.
BackendEvent = Union[Prefill, Said, Answered, Notice, Chunk]
