"""The user's conversations as a guesser's memory: the history index, kept in step with the store.

The index holds every message's text in the target's tokens, so that a regenerated answer, a question
asked again in another conversation or a document rewritten once more can copy from what was said
before. It is kept beside the store, per tokenizer, so a start does not tokenize the whole history
again, and it follows the store: an answer is learned as soon as it is written, and a deleted
conversation's text leaves the index (and its file) before the next answer. A file that is lost or
damaged is built again from the store. Its size is bounded (HistoryIndex.max_tokens), the oldest
texts going first. An answer that regenerate or edit replaced, and a document rewritten in rewrite
mode (which the store does not keep), are copied from until the app closes or a conversation is
deleted: the index is then made to match the store exactly.
"""

from __future__ import annotations

import hashlib
import zipfile
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from specchat.decoding.history import HistoryIndex
from specchat.store.conversations import Store

if TYPE_CHECKING:
    from specchat.llama.model import Model


def text_key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class History:
    """The index over one store's messages, in one tokenizer's tokens."""

    def __init__(self, store: Store, tokenizer: str, tokenize: Callable[[str], list[int]]) -> None:
        self.store, self.tokenize = store, tokenize
        self.index = HistoryIndex()
        # Beside the conversations it is made from (never in a shared cache): it holds their words.
        self.path = store.path.with_name(f"{store.path.stem}-history-{hashlib.sha1(tokenizer.encode()).hexdigest()[:16]}.npz")
        self._deletions = store.deletions
        self._load()
        self._follow(store.texts())

    @classmethod
    def of(cls, store: Store, model: Model) -> History:
        """The store's history in this model's tokens (messages as text: no special tokens)."""
        return cls(store, tokenizer_key(model), lambda text: model.tokenize(text, special=False))

    def learn(self, texts: Iterable[str]) -> None:
        """New text (a prompt, an answer): remembered now, and kept for the next start."""
        added = [t for t in texts if t and text_key(t) not in self.index]
        for text in added:
            self.index.add(text_key(text), self.tokenize(text))
        if added:
            self.save()

    def sync(self) -> None:
        """Forget what the store no longer holds (a deleted conversation's text), before it is copied."""
        if self.store.deletions != self._deletions:
            self._deletions = self.store.deletions
            self._follow(self.store.texts())

    def _follow(self, texts: list[str]) -> None:
        wanted = {text_key(t): t for t in texts if t}
        stale = [key for key in self.index.keys() if key not in wanted]
        self.index.remove(stale)
        # Only the newest texts that fit the budget (at about 4 characters a token) are read: the older
        # ones would be tokenized only to be dropped again.
        budget, newest = 4 * self.index.max_tokens, []
        for key, text in reversed(wanted.items()):
            budget -= len(text)
            if budget < 0:
                break
            newest.append((key, text))
        missing = [(key, text) for key, text in reversed(newest) if key not in self.index]
        for key, text in missing:
            self.index.add(key, self.tokenize(text))
        if stale or missing:
            self.save()

    def save(self) -> None:
        """One file: the texts' tokens end to end, their keys and lengths (written whole, atomically)."""
        items = self.index.items()
        tokens = np.concatenate([t for _, t in items]) if items else np.zeros(0, dtype=np.int64)
        lengths = np.array([len(t) for _, t in items], dtype=np.int64)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with tmp.open("wb") as f:
                np.savez(f, tokens=tokens.astype(np.int32), lengths=lengths, keys=np.array([k for k, _ in items]))
            tmp.replace(self.path)
        except OSError:  # a full disk: the index still works from memory, and is built again next start
            tmp.unlink(missing_ok=True)

    def _load(self) -> None:
        """What the file holds, if it can be read; a lost or damaged one is built again from the store."""
        try:
            with np.load(self.path, allow_pickle=False) as data:
                tokens, lengths, keys = data["tokens"], data["lengths"], data["keys"]
                if lengths.sum() != len(tokens) or len(keys) != len(lengths):
                    raise ValueError("its parts disagree")
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            return
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        for key, start, end in zip(keys, offsets[:-1], offsets[1:]):
            self.index.add(str(key), tokens[start:end])


def tokenizer_key(model: Model) -> str:
    """What the index's tokens depend on: the vocabulary (a sample of it; files that share a tokenizer
    share one history file)."""
    sample = "\x00".join(model.token_text(t) for t in range(0, model.n_vocab, 97))
    return f"{model.n_vocab}|{model.vocab_type}|{sample}"
