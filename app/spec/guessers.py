"""Guessers: cheap proposals for the next tokens, checked by the target in one step.

One small interface, several implementations. A guesser returns the tokens it proposes
and, if it sampled them, the distributions it sampled from; deterministic proposals
(prompt lookup) return None, which the verifier treats as point masses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import numpy as np

from specchat.spec.policy import Acceptance, CostCurve, MatchAcceptance, best_k, best_length, keep_drafting
from specchat.spec.sampling import SamplingConfig, logits_to_probs, sample

if TYPE_CHECKING:  # settings validate guesser names without loading llama.cpp
    from specchat.llama.model import Model

# The guessers by name, in the order the app cycles through them: the one registry of names that
# the command line, the settings and the app offer (specchat.loader builds them).
GUESSERS: dict[str, str] = {
    "auto": "picks lookup, the draft or nothing at each step, by this machine's costs",
    "none": "plain decoding",
    "lookup": "copies from earlier text (prompt lookup)",
    "draft": "the draft model guesses",
}


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray | None  # (len(tokens), V) or None for deterministic proposals
    guesser: str = "none"  # which guesser made it: "none", "lookup" or "draft"

    @staticmethod
    def empty() -> "Proposal":
        return Proposal([], None)


class Guesser(Protocol):
    name: str
    default_draft_length: int

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
    default_draft_length = 0

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
    default_draft_length = 10

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
        before = ends - 1 - t
        alive &= before >= 0
        alive[alive] = seq[before[alive]] == seq[n - 1 - t]
        if not alive.any():
            break
        lengths += alive
    return ends, lengths


class DraftGuesser:
    """A small model with the target's tokenizer, run autoregressively for k tokens.

    Under sampling it *samples* from its own (transformed) distribution q, so that the
    acceptance rate is sum(min(p, q)) rather than the chance that its top-1 is drawn.
    Its KV cache follows the committed tokens: each proposal first rewinds to the longest
    prefix it shares with the context, which discards rejected guesses.
    """

    name = "draft"
    default_draft_length = 4

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

    Acceptance is estimated online: for the draft, one running estimate; for lookup, one per
    match length (see MatchAcceptance), kept apart for three kinds of copy. Costs come from the
    measured curve, kept current from real steps. On a GPU, where verifying many positions costs
    about as much as one, this picks long guesses; on a small CPU, short ones or none.
    """

    name = "auto"
    default_draft_length = 16

    def __init__(self, curve: CostCurve, draft: DraftGuesser | None = None, max_match: int = 32,
                 window: int = 8, piece: Callable[[int], bytes] | None = None) -> None:
        self.curve, self.draft, self.max_match, self.window = curve, draft, max_match, window
        self.piece = piece  # a token's text, to see how much of the copied text the target replaced
        # "far": the longest earlier match anywhere. "near": one that continues where the last
        # guess left off, in the passage being copied (even a 1-token match there usually holds).
        # "substitute": after the target replaced some copied text, copying on after that text.
        self.lookup_acceptance = {"far": MatchAcceptance(), "near": MatchAcceptance(floor=0.6),
                                  "substitute": MatchAcceptance(floor=0.6)}
        self.draft_acceptance = Acceptance()
        self._cursor: int | None = None  # where in the context the answer was last copying from
        self._replaced: int | None = None  # the copied token that the target just replaced, if any
        # The last step's source and, for lookup, where it copied from, its kind and match length.
        self._last: tuple[str, int, str, int] = ("none", 0, "far", 0)
        # With a seed, choices must not depend on wall-clock timings: the curve stays as measured
        # (cached per machine), so the same seed takes the same choices, and so the same random
        # draws, in a fresh process.
        self._timed = True
        if draft is not None:
            draft.keep_going = lambda confidences: keep_drafting(confidences, self.curve)

    def prepare(self, context: Sequence[int]) -> None:
        self._cursor = self._replaced = None  # a new generation: nothing is being copied yet
        if self.draft is not None:
            self.draft.prepare(context)

    def _copy_source(self, context: Sequence[int]) -> tuple[int, int, str] | None:
        """Where to copy from (start, match length, kind): the longest earlier match; among equals,
        the one nearest after the cursor, else the latest. In a passage that the answer copies
        with edits, the text after an edit is there, not at the latest " the" or "    return"."""
        ends, lengths = matches(context, self.max_match)
        source = None
        if len(ends):
            near = np.zeros(len(ends), dtype=bool)
            if self._cursor is not None:
                near = (ends >= self._cursor) & (ends <= self._cursor + self.window)
            # The last key sorts first: length, then near, then nearest the cursor or latest.
            best = int(np.lexsort((np.where(near, -ends, ends), near, lengths))[-1])
            source = int(ends[best]), int(lengths[best]), "near" if near[best] else "far"
        if self._replaced is not None and (source is None or source[2] != "near"):
            # The last guess was rejected inside a copy and nothing near matches the target's own
            # token: assume it replaced the copied text (a renamed identifier, a fixed word).
            resume = self._resume_after(context, self._replaced)
            if resume < len(context) - 1:
                source = resume, 1, "substitute"
        self._replaced = None
        return source

    def _resume_after(self, context: Sequence[int], replaced: int) -> int:
        """Where copying resumes after the target wrote context[-1] instead of context[replaced]:
        after the 1 to 3 copied tokens whose text is about as long as what the target wrote.
        A fixed typo is often one token for two (" availble" is " avail" "ble"; " available"
        is one token); a renamed identifier is one for one."""
        if self.piece is None:
            return replaced + 1
        wrote = len(self.piece(context[-1]))
        best, best_gap, copied = replaced + 1, None, 0
        for end in range(replaced + 1, min(replaced + 4, len(context) - 1)):
            copied += len(self.piece(context[end - 1]))
            gap = abs(copied - wrote)
            if best_gap is None or gap < best_gap:
                best, best_gap = end, gap
        return best

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self._last = ("none", 0, "far", 0)
        self._timed = sampling.seed is None
        best = 1.0 / float(self.curve.verify(1))  # a plain step
        choice = Proposal.empty()
        copy = self._copy_source(context) if k > 0 else None
        if copy is not None:
            start, m, kind = copy
            found = [int(t) for t in context[start:start + k]]
            n, rate = best_length(self.lookup_acceptance[kind].alphas(m, len(found)), self.curve, 0.0)
            if n and rate > best:
                best, choice = rate, Proposal(found[:n], None, "lookup")
                self._last = ("lookup", start, kind, m)
        if self.draft is not None and k > 0:
            n, rate = best_k(self.draft_acceptance.alpha, k, self.curve, self.curve.draft_s)
            if n and rate > best:
                self._last = ("draft", 0, "far", 0)
                return self.draft.propose(context, n, sampling, rng)
        return choice

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        source, start, kind, m = self._last
        if self._timed:
            self.curve.observe_verify(drafted + 1, verify_s)
        if source == "lookup":
            self.lookup_acceptance[kind].observe(m, drafted, accepted)
            # Only a guess that landed at least once shows where the answer copies from: a first-token
            # miss may just be the wrong occurrence, and following it would drift off the passage.
            if accepted:
                self._cursor = start + accepted
            self._replaced = self._cursor if 0 < accepted < drafted else None
        if source == "draft":
            if self._timed:
                self.curve.observe_draft(drafted, draft_s)
            self.draft_acceptance.observe(accepted, accepted < drafted)
        # An option never chosen is never measured again: estimates that ruled a guesser out
        # drift back towards their priors, so that it is retried now and then.
        self.draft_acceptance.relax()
        for estimate in self.lookup_acceptance.values():
            estimate.relax()
