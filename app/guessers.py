"""Guessers: cheap proposals for the next tokens, checked by the target in one step.

One small interface, several implementations. A guesser returns the tokens it proposes
and, if it sampled them, the distributions it sampled from; deterministic proposals
(prompt lookup) return None, which the verifier treats as point masses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from app.llm import Model
from app.sampling import SamplingConfig, logits_to_probs, sample


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray | None  # (len(tokens), V) or None for deterministic proposals

    @staticmethod
    def empty() -> "Proposal":
        return Proposal([], None)


class Guesser(Protocol):
    name: str
    default_k: int

    def prepare(self, context: Sequence[int]) -> None:
        """Called once per generation with the prompt, before timing starts counting steps."""

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        """Up to k tokens likely to follow context (which ends with the last committed token)."""


class NoGuesser:
    """Plain decoding through the same engine: every step verifies nothing and samples one token."""

    name = "none"
    default_k = 0

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal.empty()


class LookupGuesser:
    """Prompt lookup (Saxena 2023) as deployed: the longest n-gram (n <= max_ngram) ending the
    context that occurred earlier in prompt plus output, most recent occurrence first;
    propose the tokens that followed it there."""

    name = "lookup"
    default_k = 10

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal(lookup(context, k, self.max_ngram), None)


def lookup(context: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    if k <= 0:
        return []
    seq = np.asarray(context, dtype=np.int64)
    n = len(seq)
    for ng in range(min(max_ngram, n - 1), 0, -1):
        # Start positions j < n - ng whose ng tokens equal the last ng tokens (vectorized).
        match = np.ones(n - ng, dtype=bool)
        for t in range(ng):
            match &= seq[t:n - ng + t] == seq[n - ng + t]
        hits = np.flatnonzero(match)
        if len(hits):
            j = hits[-1] + ng
            return seq[j:min(j + k, n)].tolist()
    return []


class DraftGuesser:
    """A small model with the target's tokenizer, run autoregressively for k tokens.

    Under sampling it *samples* from its own (transformed) distribution q, so that the
    acceptance rate is sum(min(p, q)) rather than the chance that its top-1 is drawn.
    Its KV cache follows the committed tokens: each proposal first rewinds to the longest
    prefix it shares with the context, which discards rejected guesses.
    """

    name = "draft"
    default_k = 4

    def __init__(self, model: Model) -> None:
        self.model = model

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        logits = self._sync(context)
        session = self.model.session
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        for i in range(k):
            if sampling.greedy:
                tokens.append(int(logits[-1].argmax()))
            else:
                q = logits_to_probs(logits[-1], sampling)
                tokens.append(sample(q, rng))
                rows.append(q)
            if i < k - 1:
                logits = session.decode(tokens[-1:], "last")
        return Proposal(tokens, None if sampling.greedy else np.stack(rows))

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        """Bring the cache to exactly `context` and return the logits after its last token."""
        session = self.model.session
        # Re-evaluate at least the last token: its logits are what the first guess needs.
        keep = min(session.common_prefix(context), len(context) - 1)
        session.rewind(keep)
        return session.decode(context[keep:], "last")
