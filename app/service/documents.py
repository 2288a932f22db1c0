"""Document rewriting: instructions, paragraph-aligned chunks that fit the context, diffs,
and saves that never touch the original unless asked."""

from __future__ import annotations

import difflib
import re
from dataclasses import replace
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

