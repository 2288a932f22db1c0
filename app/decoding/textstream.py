"""Turning token bytes into text: UTF-8 characters split across tokens, and stop strings."""

from __future__ import annotations

import codecs
from typing import Sequence

from specchat.llama.template import held_back


class TextStream:
    """Feed each token's bytes; get back the text that is safe to show.

    Text that could be the beginning of a stop string is held back until it is not, so a
    stop string never flashes on screen and is never part of the answer.
    """

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False

    def decode(self, piece: bytes) -> str:
        """The characters this token completes (empty while a character is still split)."""
        return self._decoder.decode(piece)

    def push(self, text: str) -> str:
        """Add decoded text; return what can be released now. Sets `stopped` on a stop string."""
        if self.stopped:
            return ""
        self._held += text
        # Stop at the stop string that is *completed* first (ties: the one that starts first), as
        # one token at a time would: text pushed many tokens at once (a speculative step) must
        # give the same answer. The earliest start is not it: with stops "abcd" and "bc", "abc"
        # then "d" stops at "bc", so "abcd" in one push must too.
        ends = [(i + len(s), i) for i, s in ((self._held.find(s), s) for s in self._stop) if i >= 0]
        if ends:
            self.stopped = True
            out, self._held = self._held[:min(ends)[1]], ""
            return out
        keep = held_back(self._held, self._stop)
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(out):]
        return out

    def flush(self) -> str:
        """End of generation: release held text and any incomplete character (as U+FFFD)."""
        if self.stopped:
            return ""
        out = self._held + self._decoder.decode(b"", final=True)
        self._held = ""
        return out
