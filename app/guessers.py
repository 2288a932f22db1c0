"""Guessers: cheap proposals for the next tokens, checked by the target in one step.

One small interface, several implementations. A guesser returns the tokens it proposes
and, if it sampled them, the distributions it sampled from; deterministic proposals
(prompt lookup) return None, which the verifier treats as point masses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from app.controller import Acceptance, CostCurve, best_k, keep_drafting
from app.llm import Model
from app.sampling import SamplingConfig, logits_to_probs, sample


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray | None  # (len(tokens), V) or None for deterministic proposals
    source: str = "none"  # which guesser made it: "none", "lookup" or "draft"

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

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        """What the step made of the last proposal, for guessers that learn."""


class NoGuesser:
    """Plain decoding through the same engine: every step verifies nothing and samples one token."""

    name = "none"
    default_k = 0

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal.empty()

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


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
        return Proposal(lookup(context, k, self.max_ngram), None, "lookup")

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass


def lookup(context: Sequence[int], k: int, max_ngram: int = 3) -> list[int]:
    return lookup_match(context, k, max_ngram)[0]


def lookup_match(context: Sequence[int], k: int, max_ngram: int = 3) -> tuple[list[int], int]:
    """The proposal and the length of the n-gram that matched (0: no match)."""
    start, ng, _ = _match(context, max_ngram) if k > 0 else (0, 0, False)
    return ([int(t) for t in context[start:start + k]], ng) if ng else ([], 0)


def _match(context: Sequence[int], max_ngram: int, cursor: int | None = None,
           window: int = 8) -> tuple[int, int, bool]:
    """Where to copy from: the continuation of the longest n-gram that ends the context and
    occurred before (its most recent occurrence), and n (0: no match). Given a `cursor` (where
    the answer was last copying from), an occurrence whose continuation lies within `window`
    tokens after it wins over any other: in a passage that the answer copies with edits, the
    text after the edit is there, not at the latest " the" or "    return". The flag says so."""
    seq = np.asarray(context, dtype=np.int64)
    n = len(seq)
    fallback = (0, 0, False)
    for ng in range(min(max_ngram, n - 1), 0, -1):
        # Start positions j < n - ng whose ng tokens equal the last ng tokens (vectorized).
        match = np.ones(n - ng, dtype=bool)
        for t in range(ng):
            match &= seq[t:n - ng + t] == seq[n - ng + t]
        ends = np.flatnonzero(match) + ng
        if cursor is not None:
            near = ends[(ends >= cursor) & (ends <= cursor + window)]
            if len(near):
                return int(near[0]), ng, True
        if len(ends) and not fallback[1]:
            fallback = (int(ends[-1]), ng, False)
            if cursor is None:
                break
    return fallback


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
        # Optional early stop: given the draft's probabilities for the tokens drafted so far,
        # is one more worth it? (Set by AutoGuesser from the cost model.)
        self.keep_going: Callable[[list[float]], bool] | None = None

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        pass

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
        confidences: list[float] = []
        for i in range(k):
            if sampling.greedy:
                tokens.append(int(logits[-1].argmax()))
            else:
                q = logits_to_probs(logits[-1], sampling)
                tokens.append(sample(q, rng))
                rows.append(q)
            if self.keep_going is not None:
                confidences.append(_confidence(logits[-1], tokens[-1], rows[-1] if rows else None))
                if not self.keep_going(confidences):
                    break
            if i < k - 1:
                logits = session.decode(tokens[-1:], "last")
        return Proposal(tokens, None if sampling.greedy else np.stack(rows), "draft")

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        """Bring the cache to exactly `context` and return the logits after its last token."""
        session = self.model.session
        # Re-evaluate at least the last token: its logits are what the first guess needs.
        keep = min(session.common_prefix(context), len(context) - 1)
        session.rewind(keep)
        return session.decode(context[keep:], "last")


def _confidence(logits: np.ndarray, token: int, probs: np.ndarray | None) -> float:
    """The draft's probability for its own token: a free estimate of acceptance."""
    if probs is not None:
        return float(probs[token])
    shifted = np.exp(logits - logits.max(), dtype=np.float64)
    return float(shifted[token] / shifted.sum())


class AutoGuesser:
    """Per step, the guess that maximizes expected tokens per second: prompt lookup when a match
    is worth it, the draft model when that pays, or nothing (a plain step).

    Acceptance is estimated online, per draft and per lookup match length; costs come from the
    measured curve, kept current from real steps. On a GPU, where verifying many positions costs
    about as much as one, this picks long guesses; on a small CPU, short ones or none.
    """

    name = "auto"
    default_k = 16

    def __init__(self, curve: CostCurve, draft: DraftGuesser | None = None, max_ngram: int = 3) -> None:
        self.curve, self.draft, self.max_ngram = curve, draft, max_ngram
        # Lookup acceptance per (match length, whether the last lookup step was accepted in full):
        # inside a passage the answer copies, guesses keep landing; outside, they rarely do.
        self.lookup_acceptance = {(n, run): Acceptance(3.0, 4.0) if run else Acceptance()
                                  for n in range(1, max_ngram + 1) for run in (False, True)}
        self._copying = False
        # Copying on from where the last lookup left off (see _match).
        self.near_acceptance = Acceptance(3.0, 4.0)
        self.substitute_acceptance = Acceptance()
        self._cursor: int | None = None  # where in the context the answer was last copying from
        self._start = 0  # where the last lookup proposal was copied from
        self._substitute: int | None = None  # where copying resumes if the target replaced one token
        self.draft_acceptance = Acceptance()
        # The last step's source, and for lookup the estimate that its outcome updates.
        self._last: tuple[str, Acceptance | None] = ("none", None)
        if draft is not None:
            draft.keep_going = lambda confidences: keep_drafting(confidences, self.curve)

    def prepare(self, context: Sequence[int]) -> None:
        self._cursor = self._substitute = None  # a new generation: nothing is being copied yet
        if self.draft is not None:
            self.draft.prepare(context)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        choice, best = ("none", 0, None), 1.0 / float(self.curve.verify(1))
        start, ngram, near = _match(context, self.max_ngram, self._cursor)
        # Copying on where the last guess left off, and guessing a substitution, are options of
        # their own with their own estimates: renames are substitutions, typo fixes seldom are.
        estimate = self.near_acceptance if near else self.lookup_acceptance.get((ngram, self._copying))
        if self._substitute is not None and not near and self._substitute < len(context) - 1:
            # The last guess was rejected at the cursor and nothing near matches the target's own
            # token: assume it replaced the copied one (a renamed identifier, a fixed word).
            start, estimate = self._substitute, self.substitute_acceptance
        self._substitute = None
        found = [int(t) for t in context[start:start + k]] if estimate is not None else []
        if found:
            n, rate = self._plan(estimate, len(found), 0.0)
            if rate > best:
                choice, best = ("lookup", n, estimate), rate
        if self.draft is not None:
            n, rate = self._plan(self.draft_acceptance, k, self.curve.draft_s)
            if rate > best:
                choice, best = ("draft", n, self.draft_acceptance), rate
        source, n, chosen = choice
        self._last = (source, chosen)
        if source == "lookup":
            self._start = start
            return Proposal(found[:n], None, "lookup")
        if source == "draft":
            assert self.draft is not None
            return self.draft.propose(context, n, sampling, rng)
        return Proposal.empty()

    def _plan(self, estimate: Acceptance, k_max: int, draft_s: float) -> tuple[int, float]:
        """How many guesses to make from this source, and the rate that ranks it. The rate is
        optimistic (so an untried source gets tried), but the length follows the estimate
        itself: a source that is only being probed gets one guess, which costs little."""
        n, _ = best_k(estimate.alpha, k_max, self.curve, draft_s)
        _, rate = best_k(estimate.optimistic, k_max, self.curve, draft_s)
        return max(n, 1), rate

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        source, estimate = self._last
        self.curve.observe_verify(drafted + 1, verify_s)
        self._copying = source == "lookup" and accepted == drafted
        if source == "lookup":
            # Only a guess that landed at least once shows where the answer copies from: a first-token
            # miss may just be the wrong occurrence, and following it would drift off the passage.
            if accepted:
                self._cursor = self._start + accepted
            self._substitute = self._cursor + 1 if 0 < accepted < drafted else None
        if source == "draft":
            self.curve.observe_draft(drafted, draft_s)
        if estimate is not None:
            estimate.observe(accepted, accepted < drafted)
        # An option never chosen is never measured again: estimates that ruled a guesser out
        # drift back towards the prior, so that it is retried now and then.
        for estimate in [self.draft_acceptance, self.near_acceptance, self.substitute_acceptance,
                         *self.lookup_acceptance.values()]:
            estimate.relax()
