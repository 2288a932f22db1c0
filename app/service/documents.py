"""Document rewriting: instructions, paragraph-aligned chunks that fit the context, diffs,
and saves that never touch the original unless asked."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from specchat.decoding.engine import GenerationConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.store.files import atomic_write

PRESETS = {
    "Fix grammar": "Fix the grammar, spelling and punctuation. Change nothing else.",
    "Make formal": "Make the tone formal and professional, keeping every fact.",
    "Simplify": "Simplify the wording so that it is easy to read, keeping every fact.",
    "Make concise": "Make it more concise without losing information.",
}


def rewrite_messages(instruction: str, chunk: str) -> list[Message]:
    return [Message("system", "You rewrite documents. Reply with the rewritten text only, no preamble."),
            Message("user", f"{instruction}\n\n{chunk}")]


def rewrite_requests(instruction: str, text: str, n_ctx: int, count: Callable[[str], int],
                     config: GenerationConfig) -> list[tuple[list[Message], GenerationConfig]]:
    """A document's rewrite as the requests that make it, in order: paragraph-aligned chunks of at most
    half the context that is left after the instruction (the answer is about as long as its chunk), each
    with room to answer in full and no stop strings (a document may hold any text)."""
    budget = max(128, (n_ctx - 200) // 2)
    answer = replace(config, max_tokens=budget + 64, stop=())
    return [(rewrite_messages(instruction, chunk), answer) for chunk in split_paragraphs(text, budget, count)]


def split_paragraphs(text: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    """Chunks of whole paragraphs, each within max_tokens (a single longer paragraph is split
    at sentence ends, and at worst stands alone)."""
    paragraphs = [p for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]
    chunks: list[str] = []
    current: list[str] = []
    for para in paragraphs:
        pieces = [para] if count(para) <= max_tokens else _sentences(para, max_tokens, count)
        for piece in pieces:
            if current and count("\n\n".join(current + [piece])) > max_tokens:
                chunks.append("\n\n".join(current))
                current = []
            current.append(piece)
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _sentences(para: str, max_tokens: int, count: Callable[[str], int]) -> list[str]:
    out: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", para):
        if out and count(out[-1] + " " + sentence) <= max_tokens:
            out[-1] += " " + sentence
        else:
            out.append(sentence)
    return out


def read_document(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecchatError(f"document not found: {path}") from None
    except UnicodeDecodeError:
        raise SpecchatError(f"{path} is not UTF-8 text; convert it first") from None
    except OSError as e:
        raise SpecchatError(f"cannot read {path}: {e.strerror}") from None


def output_path(original: Path) -> Path:
    """A new file next to the original that does not exist yet: notes.rewritten.md, then -2, -3…"""
    candidate = original.with_name(f"{original.stem}.rewritten{original.suffix}")
    n = 2
    while candidate.exists():
        candidate = original.with_name(f"{original.stem}.rewritten-{n}{original.suffix}")
        n += 1
    return candidate


def saved_form(text: str) -> str:
    """The text as `save` writes it: ending in a newline, as text files do."""
    return text if text.endswith("\n") else text + "\n"


def save(text: str, path: Path) -> Path:
    atomic_write(path, saved_form(text))
    return path


_WORDS = re.compile(r"\s+|\w+|[^\w\s]")


def word_diff(original: str, rewritten: str) -> list[tuple[str, str]]:
    """The rewrite as runs of text marked "same", "removed" or "added", word by word (as
    `git diff --word-diff` shows it), so a fixed typo is one word, not a whole paragraph."""
    a, b = _WORDS.findall(original), _WORDS.findall(rewritten)
    runs: list[tuple[str, str]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            runs.append(("".join(a[i1:i2]), "same"))
            continue
        if i2 > i1:
            runs.append(("".join(a[i1:i2]), "removed"))
        if j2 > j1:
            runs.append(("".join(b[j1:j2]), "added"))
    return runs



@dataclass(frozen=True)
class Change:
    """One changed passage of a rewrite: what it removes from the original and what it puts instead."""

    removed: str
    added: str


class Review:
    """A rewrite reviewed change by change: every change starts accepted (the rewrite as written), and
    each can be rejected (the original's words stay) or accepted again. `text` is the document with the
    accepted changes; `runs` is the diff as it now stands, for showing.

    Changes a word or a space apart are one passage: a rewritten phrase is one decision, not five."""

    def __init__(self, original: str, rewritten: str) -> None:
        # The rewrite ends as the original does (a model's answer is stripped), so that the last newline is
        # no change to review, and rejecting every change gives back the original exactly.
        self.original = original
        self.rewritten = saved_form(rewritten.rstrip("\n")) if original.endswith("\n") else rewritten.rstrip("\n")
        parts: list[str | Change] = []
        for text, kind in word_diff(original, self.rewritten):
            if kind == "same":
                parts.append(text)
                continue
            last = parts.pop() if parts and isinstance(parts[-1], Change) else Change("", "")
            parts.append(replace(last, removed=last.removed + text) if kind == "removed" else
                         replace(last, added=last.added + text))
        self._parts: list[str | Change] = []
        for part in parts:
            if isinstance(part, Change) and len(self._parts) >= 2 and isinstance(self._parts[-2], Change) \
                    and len(_WORDS.findall(str(self._parts[-1]))) <= 2:
                same, before = self._parts.pop(), self._parts.pop()
                assert isinstance(before, Change) and isinstance(same, str)
                part = Change(before.removed + same + part.removed, before.added + same + part.added)
            self._parts.append(part)
        self.changes = [p for p in self._parts if isinstance(p, Change)]
        self.accepted = [True] * len(self.changes)

    def decide(self, index: int, accept: bool) -> None:
        self.accepted[index] = accept

    def decide_all(self, accept: bool) -> None:
        self.accepted = [accept] * len(self.changes)

    @property
    def text(self) -> str:
        """The document as the review stands: the original, with the accepted changes made."""
        out, n = [], 0
        for part in self._parts:
            if isinstance(part, Change):
                out.append(part.added if self.accepted[n] else part.removed)
                n += 1
            else:
                out.append(part)
        return "".join(out)

    def runs(self) -> list[tuple[str, str, int | None]]:
        """The diff for showing: (text, kind, change index); kind is "same", "removed", "added" for an
        accepted change, or "kept" and "declined" for a rejected one (its original words, and the words
        it would have put)."""
        out: list[tuple[str, str, int | None]] = []
        n = 0
        for part in self._parts:
            if not isinstance(part, Change):
                out.append((part, "same", None))
                continue
            accepted = self.accepted[n]
            if part.removed:
                out.append((part.removed, "removed" if accepted else "kept", n))
            if part.added:
                out.append((part.added, "added" if accepted else "declined", n))
            n += 1
        return out

    def summary(self) -> str:
        taken = sum(self.accepted)
        return f"{taken} of {len(self.changes)} changes accepted, {len(self.changes) - taken} rejected"


def unchanged_since(path: Path, original: str) -> bool:
    """Whether the file still holds the text the review was made of (another program may have saved it)."""
    try:
        return path.read_text(encoding="utf-8") == original
    except (OSError, UnicodeDecodeError):
        return False
