"""Guessers that copy: from the text so far (prompt lookup) and from the user's past conversations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from specchat.decoding.guessers.base import BaseGuesser, Proposal
from specchat.decoding.sampling import SamplingConfig

if TYPE_CHECKING:
    from specchat.decoding.history import HistoryIndex


class LookupGuesser(BaseGuesser):
    """Prompt lookup (Saxena 2023) as deployed: the longest n-gram (n <= max_ngram) ending the
    context that occurred earlier in prompt plus output, most recent occurrence first;
    propose the tokens that followed it there."""

    name = "lookup"
    default_draft_length = 10

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal(lookup(context, k, self.max_ngram), None, "lookup")


class HistoryGuesser(BaseGuesser):
    """Copies from the user's past conversations (`specchat.decoding.history`): what followed the longest
    match of the context's end there, as most of those matches continued."""

    name = "history"
    default_draft_length = 16

    def __init__(self, index: HistoryIndex) -> None:
        self.index = index

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal(self.index.propose(context, k)[0], None, "history")


def lookup(context: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    return lookup_match(context, k, max_ngram)[0]


def lookup_match(context: Sequence[int], k: int, max_ngram: int = 3) -> tuple[list[int], int]:
    """The proposal and the length of the n-gram that matched (0: no match)."""
    if k <= 0 or max_ngram <= 0:
        return [], 0
    ends, lengths = matches(context, max_ngram)
    if not len(ends):
        return [], 0
    best = len(ends) - 1 - int(lengths[::-1].argmax())  # the longest match, latest among equals
    start = int(ends[best])
    return [int(t) for t in context[start:start + k]], int(lengths[best])


def matches(context: Sequence[int], cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Every earlier occurrence of the context's last token, as (ends, lengths): copying from
    context[ends[i]] would continue the context, whose last lengths[i] tokens (at most cap)
    equal those before ends[i]. Vectorized over occurrences, so a long context costs little."""
    seq = np.asarray(context, dtype=np.int64)
    n = len(seq)
    if n < 2 or cap < 1:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(seq[:-1] == seq[-1]) + 1
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for t in range(1, cap):
        if np.count_nonzero(alive) <= _FEW:
            # A few places left, often the passage being copied, which matches all cap tokens: walked back one
            # by one, where a numpy pass per token would cost a microsecond or more each (auto asks every step).
            for i in np.flatnonzero(alive):
                end, k = int(ends[i]), t
                while k < cap and end - 1 - k >= 0 and context[end - 1 - k] == context[n - 1 - k]:
                    k += 1
                lengths[i] += k - t
            break
        before = ends - 1 - t
        alive &= before >= 0
        alive[alive] = seq[before[alive]] == seq[n - 1 - t]
        lengths += alive
    return ends, lengths


_FEW = 4  # places still matching, below which `matches` walks them back in Python
