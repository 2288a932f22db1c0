"""Document rewriting: instructions, paragraph-aligned chunks that fit the context, diffs,
and saves that never touch the original unless asked."""

from __future__ import annotations

import codecs
import difflib
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

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


def rewrite_requests(instruction: str, text: str, n_ctx: int, count: Callable[[str], int], config: GenerationConfig
                     ) -> tuple[Parts, list[tuple[list[Message], GenerationConfig]]]:
    """A document's rewrite as the requests that make it, in order: paragraph-aligned chunks of at most
    half the context that is left after the instruction (the answer is about as long as its chunk), each
    with room to answer in full and no stop strings (a document may hold any text). With them, the parts
    they rewrite, which join the answers back as the document was laid out."""
    budget = max(128, (n_ctx - 200) // 2)
    answer = replace(config, max_tokens=budget + 64, stop=())
    parts = split_paragraphs(text, budget, count)
    return parts, [(rewrite_messages(instruction, chunk), answer) for chunk in parts.texts]


@dataclass(frozen=True)
class Parts:
    """A document cut into parts that are rewritten one by one, and what lies around them in the original
    (the blank lines between them, the document's leading and trailing whitespace), which is not sent: joining
    the rewrites with it keeps the document's own spacing, where a fixed "\n\n" would make each other
    spacing a change to review."""

    texts: tuple[str, ...]
    gaps: tuple[str, ...]  # before the first part, between each two, after the last: one more than texts

    @classmethod
    def cut(cls, text: str, spans: Sequence[tuple[int, int]]) -> Parts:
        """`text` cut at `spans` (in order, not overlapping): the parts, and the text between them."""
        bounds = [0, *(i for span in spans for i in span), len(text)]
        return cls(tuple(text[a:b] for a, b in spans), tuple(text[a:b] for a, b in zip(bounds[::2], bounds[1::2])))

    def join(self, texts: Sequence[str]) -> str:
        """The parts' rewrites, in order, with the original's text between them: the original for its own parts."""
        return self.gaps[0] + "".join(text + gap for text, gap in zip(texts, self.gaps[1:], strict=True))


def split_paragraphs(text: str, max_tokens: int, count: Callable[[str], int]) -> Parts:
    """Parts of whole paragraphs, each within max_tokens. A longer paragraph is split at sentence ends, a longer
    sentence at line ends, a longer line between words: a passage with no sentence end (a list, a table, code, a
    document of one long line) is rewritten in parts like any other. It used to stand alone, overflow the context, and
    fail only once every part before it was rewritten. Each part is the original's text as it is, spacing and all.

    Each piece is counted once, and a part's size is its pieces' counts and the gaps' between them, summed:
    counting each part anew as it grew tokenized a long document over and over (a 350 KB one: 4.1 s on the
    default pair here, now 0.2 s). A sum counts a space that a tokenizer would join to the next word as a token of its
    own, so it errs towards smaller parts, never larger. Only a run of text with no space in it that is longer than a
    part may be cannot be split: that is said, before any part is rewritten."""
    pieces = _pieces(text, 0, len(text), None, max_tokens, count)
    chunks: list[tuple[int, int]] = []
    held = 0  # the last part's tokens
    for start, end, n in pieces:
        if n > max_tokens:
            line = text.count("\n", 0, start) + 1
            raise SpecchatError(f"line {line} has {n} tokens with no space to split them at (“{text[start:start + 24]}…”), "
                                f"more than one part of a rewrite may hold ({max_tokens}); break it up, or raise --ctx")
        if chunks and (joined := held + count(text[chunks[-1][1]:start]) + n) <= max_tokens:
            chunks[-1], held = (chunks[-1][0], end), joined
        else:
            chunks.append((start, end))
            held = n
    return Parts.cut(text, chunks)


# Where a piece too long for a part is split, in turn: between paragraphs, sentences, lines, words.
_SEPARATORS = (re.compile(r"\n\s*\n"), re.compile(r"(?<=[.!?])\s+"), re.compile(r"\n"), re.compile(r"\s+"))


def _pieces(text: str, start: int, end: int, tokens: int | None, max_tokens: int, count: Callable[[str], int],
            level: int = 0) -> list[tuple[int, int, int]]:
    """text[start:end], of `tokens` (None: not counted yet), as pieces (start, end, tokens) of at most max_tokens
    where _SEPARATORS from `level` on can split it so; a run none of them splits stays whole, however long."""
    if tokens is not None and (tokens <= max_tokens or level == len(_SEPARATORS)):
        return [(start, end, tokens)]
    spans = _spans(text, _SEPARATORS[level], start, end)
    if tokens is not None and spans == [(start, end)]:  # not split here: on to the next separator, not counted again
        return _pieces(text, start, end, tokens, max_tokens, count, level + 1)
    return [piece for a, b in spans for piece in _pieces(text, a, b, count(text[a:b]), max_tokens, count, level + 1)]


def _spans(text: str, separator: re.Pattern[str], start: int, end: int) -> list[tuple[int, int]]:
    """Where the pieces of text[start:end] between `separator`s lie, each without the whitespace at its
    ends (which stays in the gaps between parts); blank pieces are left out."""
    bounds = [start, *(i for m in separator.finditer(text, start, end) for i in m.span()), end]
    spans = []
    for a, b in zip(bounds[::2], bounds[1::2]):
        piece = text[a:b]
        if piece.strip():
            spans.append((a + len(piece) - len(piece.lstrip()), a + len(piece.rstrip())))
    return spans


# A byte order mark names the encoding. UTF-32's are looked for first: UTF-32 LE's begins with UTF-16 LE's.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32-le"), (codecs.BOM_UTF32_BE, "utf-32-be"), (codecs.BOM_UTF8, "utf-8"),
         (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
# A text file's line ends. Not str.splitlines: it also splits at \x0b, \x0c, \x1c-\x1e, \x85, \u2028 and \u2029,
# which are characters of a line in a text file.
_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Document:
    """A text file as it is on disk. `text` is what the model and the review work on: its lines joined by
    "\n". `encode` gives an edited text back the file's own form: its encoding and byte order mark, each
    line's own end where the line is kept (or replaced one for one), and its final newline or none. So a
    review with every change rejected writes the file back byte for byte."""

    raw: bytes  # as read: another program's save shows as other bytes, if only other line ends
    bom: bytes
    encoding: str
    text: str
    endings: tuple[str, ...]  # each line's end as found, in order; the last line has none

    @classmethod
    def decode(cls, raw: bytes) -> Document:
        """The document that `raw` holds (raises UnicodeDecodeError if it is not text in the encoding that
        its byte order mark names, or UTF-8 without one)."""
        bom, encoding = next(((bom, encoding) for bom, encoding in _BOMS if raw.startswith(bom)), (b"", "utf-8"))
        decoded = raw[len(bom):].decode(encoding)
        return cls(raw, bom, encoding, _LINE_END.sub("\n", decoded), tuple(_LINE_END.findall(decoded)))

    def encode(self, text: str) -> bytes:
        """`text` (this document edited) in the file's own form."""
        lines = _LINE_END.split(text)
        ends = self._ends_for(lines)
        return self.bom + "".join(line + end for line, end in zip(lines, [*ends, ""])).encode(self.encoding)

    def _ends_for(self, lines: list[str]) -> list[str]:
        """The line end of each of `lines` but the last. A line kept from the original keeps its end, and so
        does one that replaces an original line one for one; lines that replace lines which all ended alike
        end so too; any other line ends as most of the file's lines do."""
        old = self.text.split("\n")
        ends = [self._dominant_end()] * (len(lines) - 1)
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, lines, autojunk=False).get_opcodes():
            if op in ("equal", "replace") and i2 - i1 == j2 - j1:
                matched = self.endings[i1:i2]  # none for the original's last line: its match keeps the usual end
            elif op == "replace" and len(set(self.endings[i1:i2])) == 1:
                matched = (self.endings[i1],) * (j2 - j1)
            else:
                continue
            for j, end in zip(range(j1, len(ends)), matched):
                ends[j] = end
        return ends

    def _dominant_end(self) -> str:
        return Counter(self.endings).most_common(1)[0][0] if self.endings else "\n"


def open_document(path: Path) -> Document:
    """The document at `path` as it is on disk; a missing, unreadable or undecodable file is a one-line error."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecchatError(f"document not found: {path}") from None
    except OSError as e:
        raise SpecchatError(f"cannot read {path}: {e.strerror}") from None
    try:
        return Document.decode(raw)
    except UnicodeDecodeError as e:
        raise SpecchatError(f"{path} is not {e.encoding.upper()} text; convert it first") from None


def read_document(path: Path) -> str:
    """A file's text, with "\n" line ends (to attach to a message, or to check before the app starts)."""
    return open_document(path).text


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


def save(text: str, path: Path, like: Document | None = None) -> Path:
    """Write `text` to `path` in the form of the document it was made from (its encoding, line ends and final
    newline), or, with none, as UTF-8 ending in a newline."""
    atomic_write(path, like.encode(text) if like is not None else saved_form(text))
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

    Changes a word or a space apart are one passage: a rewritten phrase is one decision, not five.

    A rewrite that stops before the document does (a small model ends its answer after the first paragraph
    now and then), or before a part of it does (`of_parts`), would drop the rest as a change. Such a change stays
    apart from its neighbours and starts rejected (`cut_short` counts them), so that accepting the rewrite as
    written never loses text."""

    def __init__(self, original: str, rewritten: str, segments: Sequence[tuple[str, str]] = ()) -> None:
        """`segments`: the original and the rewrite in pieces diffed apart, which join to the two texts (by
        default, one piece each)."""
        # The rewrite ends in as many newlines as the original (a model's answer is stripped), none included,
        # so that the file's end is no change to review.
        self.original = original
        self.rewritten = rewritten.rstrip("\n") + original[len(original.rstrip("\n")):]
        parts: list[str | Change] = []
        cuts: set[int] = set()  # the changes (indices in parts) that leave out the rest of a piece
        for before, after in segments or [(original, self.rewritten)]:
            first = len(parts)
            for text, kind in word_diff(before, after):
                if kind == "same":
                    parts.append(text)
                    continue
                last = parts.pop() if len(parts) > first and isinstance(parts[-1], Change) else Change("", "")
                parts.append(replace(last, removed=last.removed + text) if kind == "removed" else
                             replace(last, added=last.added + text))
            cut = _cut_short(before, parts[first:])
            if cut is not None:
                cuts.add(first + cut)
        merged: list[tuple[str | Change, bool]] = []  # each passage, and whether it leaves out the rest
        for n, part in enumerate(parts):
            if isinstance(part, Change) and n not in cuts and len(merged) >= 2 and isinstance(merged[-2][0], Change) \
                    and not merged[-2][1] and len(_WORDS.findall(str(merged[-1][0]))) <= 2:
                (same, _), (prior, _) = merged.pop(), merged.pop()
                assert isinstance(prior, Change) and isinstance(same, str)
                part = Change(prior.removed + same + part.removed, prior.added + same + part.added)
            merged.append((part, n in cuts))
        self._parts = [part for part, _ in merged]
        self.changes = [part for part in self._parts if isinstance(part, Change)]
        self.accepted = [not cut for part, cut in merged if isinstance(part, Change)]
        self.cut_short = len(cuts)

    @classmethod
    def of_parts(cls, parts: Parts, answers: Sequence[str]) -> Review:
        """A document rewritten part by part (`rewrite_requests`): each part diffed against its own answer, and
        the text between the parts kept as it was."""
        segments = [(parts.gaps[0], parts.gaps[0])]
        for text, answer, gap in zip(parts.texts, answers, parts.gaps[1:], strict=True):
            segments += [(text, answer), (gap, gap)]
        return cls(parts.join(parts.texts), parts.join(answers), segments)

    def keep_decisions(self, earlier: Review) -> None:
        """Take an earlier review's decisions on the changes that open this one as they opened it: a rewrite that
        went on from where it stopped keeps what the user decided on the parts done before."""
        for n, (then, now) in enumerate(zip(earlier.changes, self.changes)):
            if then != now:
                break
            self.accepted[n] = earlier.accepted[n]

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


def _cut_short(before: str, diff: Sequence[str | Change]) -> int | None:
    """The index of a piece's last change where it removes whole lines up to the piece's end and puts nothing
    there: where a rewrite stopped short (None: it did not)."""
    changed = [n for n, part in enumerate(diff) if isinstance(part, Change)]
    if not changed or "".join(str(part) for part in diff[changed[-1] + 1:]).strip():
        return None
    last = diff[changed[-1]]
    assert isinstance(last, Change)
    start = sum(len(part) if isinstance(part, str) else len(part.removed) for part in diff[:changed[-1]])
    line_start = before[start - 1] if start else "\n"  # a removal from a line's start takes that line
    return changed[-1] if not last.added.strip() and re.search(r"\n\s*\S", line_start + last.removed) else None


def unchanged_since(path: Path, document: Document) -> bool:
    """Whether the file still holds the bytes the document was read from (another program may have saved it,
    if only to change its line ends)."""
    try:
        return path.read_bytes() == document.raw
    except OSError:
        return False
