"""What the user's past conversations say next: continuations of text seen before, as guesses.

A chat app has what a server lacks, the user's whole history. SuffixDecoding (Oliaro et al., 2024)
keeps a suffix tree over past outputs and proposes the continuation that most of the longest matches
share, drafting longer the longer the match; llama-lookup's dynamic cache keeps n-gram counts across
generations in a file. This index does the same on a budget: every past text in one token array, the
places where each pair of tokens occurred sorted for a binary search, the match behind each place
extended backwards, and a proposal that follows the continuation most of the longest matches agree
on. A regenerated answer, a question asked again in a new conversation, "rewrite it again, shorter":
the text the target is about to write is often there.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from specchat.decoding.policy import MatchAcceptance
from specchat.decoding.sampling import SamplingConfig

MAX_MATCH = 32  # tokens of context compared behind a place
MAX_PLACES = 64  # the latest places of a pair examined per proposal: bounds its time on a long history
AGREE = 0.5  # a continuation token is proposed while more than this share of the matches agree on it
_SEP = -1  # between texts: no match runs across


class HistoryIndex:
    """Token sequences (the texts of past messages, each under a key), searchable by their last tokens."""

    def __init__(self, max_tokens: int = 2_000_000) -> None:
        self.max_tokens = max_tokens
        self._texts: dict[str, np.ndarray] = {}  # key -> tokens, oldest first
        self.tokens = 0  # held in all (kept as texts come and go: a start adds thousands)
        self._dirty = True
        self._all = np.zeros(0, dtype=np.int64)
        self._pairs = np.zeros(0, dtype=np.int64)  # sorted pair codes
        self._where = np.zeros(0, dtype=np.int64)  # for each, the place after the pair in _all
        # How often the target took copies from here, by match length: kept across conversations (each
        # new chat's auto starts from what the earlier ones showed, not from priors), apart for greedy
        # and sampled answers (a sampled answer takes a copied token only as often as it would draw it).
        self._acceptance = {True: MatchAcceptance(), False: MatchAcceptance()}

    def __len__(self) -> int:
        return len(self._texts)

    def __contains__(self, key: str) -> bool:
        return key in self._texts

    def keys(self) -> list[str]:
        return list(self._texts)

    def acceptance(self, sampling: SamplingConfig) -> MatchAcceptance:
        return self._acceptance[sampling.greedy]

    def add(self, key: str, tokens: Sequence[int]) -> None:
        """Remember a text (again: it becomes the latest). The oldest go once the index is over budget."""
        self._drop(key)
        if len(tokens) >= 2:
            self._texts[key] = np.asarray(tokens, dtype=np.int64)
            self.tokens += len(tokens)
        while self.tokens > self.max_tokens and len(self._texts) > 1:
            self._drop(next(iter(self._texts)))
        self._dirty = True

    def remove(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._drop(key)
        self._dirty = True

    def _drop(self, key: str) -> None:
        gone = self._texts.pop(key, None)
        if gone is not None:
            self.tokens -= len(gone)

    def items(self) -> list[tuple[str, np.ndarray]]:
        return list(self._texts.items())

    def _build(self) -> None:
        parts = []
        for tokens in self._texts.values():
            parts += [tokens, np.array([_SEP])]
        self._all = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        a, b = self._all[:-1], self._all[1:]
        codes = (a << 32) | (b & 0xFFFFFFFF)
        valid = np.flatnonzero((a != _SEP) & (b != _SEP))
        order = valid[np.argsort(codes[valid], kind="stable")]  # within a pair, older places first
        self._pairs, self._where = codes[order], order + 2
        self._dirty = False

    def propose(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the context's end in the past texts, and the length of the match
        behind them (0: nothing matched two tokens or more)."""
        if k <= 0 or len(context) < 2 or not self._texts:
            return [], 0
        if self._dirty:
            self._build()
        code = (int(context[-2]) << 32) | (int(context[-1]) & 0xFFFFFFFF)
        lo, hi = np.searchsorted(self._pairs, code, "left"), np.searchsorted(self._pairs, code, "right")
        places = self._where[max(lo, hi - MAX_PLACES):hi]  # the latest places of the pair
        places = places[places < len(self._all)]
        if not len(places):
            return [], 0
        seq, n = self._all, len(context)
        lengths = np.full(len(places), 2)
        alive = np.ones(len(places), dtype=bool)
        for j in range(2, min(MAX_MATCH, n)):
            before = places - 1 - j
            alive &= before >= 0
            alive[alive] = seq[before[alive]] == int(context[n - 1 - j])
            if not alive.any():
                break
            lengths += alive
        best = int(lengths.max())
        return self._follow(places[lengths == best], k), best

    def _follow(self, places: np.ndarray, k: int) -> list[int]:
        """The continuation the places agree on: token by token, the most frequent next token while at
        more than AGREE of the places still following share it."""
        out: list[int] = []
        while len(out) < k and len(places):
            nxt = self._all[np.minimum(places + len(out), len(self._all) - 1)]
            nxt = nxt[(places + len(out) < len(self._all)) & (nxt != _SEP)]
            if not len(nxt):
                break
            values, counts = np.unique(nxt, return_counts=True)
            top = int(counts.argmax())
            if counts[top] <= AGREE * len(places):
                break
            token = int(values[top])
            out.append(token)
            keep = self._all[np.minimum(places + len(out) - 1, len(self._all) - 1)] == token
            places = places[keep]
        return out
