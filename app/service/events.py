"""What the conversation service adds to the engine's events (`specchat.decoding.events`): a Notice the
user should see about an answer, and a server's streamed text (a Chunk). `BackendEvent` is every event a
front end receives, from this machine's models or from a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from specchat.decoding.events import Event


@dataclass(frozen=True)
class Notice:
    """Something the user should know about this answer (old turns were left out to fit the context)."""

    text: str


ChatEvent = Union[Event, Notice]


@dataclass(frozen=True)
class Chunk:
    """Text a server streamed: how it split into tokens and steps, only the server knows."""

    text: str
    seconds: float  # since the chunk before (or since the first, for the first)
    thinking: str = ""  # the server's reasoning_content in this chunk


# What a backend streams: the engine's events, notices about the answer, and a server's text. The UI takes
# all three from here, whichever backend it has.
BackendEvent = Union[Event, Notice, Chunk]
