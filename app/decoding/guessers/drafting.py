"""Guessers that draft token by token: a small model with the target's tokenizer, or the target's own MTP
layers. Under sampling both *sample* from their own (transformed) distribution q, so that the exact rule
keeps sum(min(p, q)) of their guesses rather than the chance that their top-1 is drawn."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from specchat.decoding.guessers.base import Allowed, BaseGuesser, Proposal
from specchat.decoding.sampling import SamplingConfig, logits_to_probs, masked, sample

if TYPE_CHECKING:  # settings validate guesser names without loading llama.cpp
    from specchat.llama.model import Model
    from specchat.llama.mtp import MtpHead


class DraftGuesser(BaseGuesser):
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
        self.allowed: Allowed | None = None  # a grammar's masks, under a constraint

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context, lasting=True)

    def constrain(self, allowed: Allowed | None) -> None:
        self.allowed = allowed

    def behind(self, context: Sequence[int]) -> int:
        """How many of the context's tokens its cache would read before its first guess (see _sync)."""
        return len(context) - self.model.session.reusable(context)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        t0 = time.perf_counter()
        logits = self._sync(context)[-1]
        sync_s = time.perf_counter() - t0
        session = self.model.session
        if k > 1:  # its own guesses go into its cache, and the rejected ones come out again
            session.checkpoint()
        tokens, probs = draft_tokens(logits, k, sampling, rng, lambda token: session.decode([token], "last")[-1],
                                     self.keep_going, self.allowed)
        return Proposal(tokens, probs, "draft", sync_s)

    def _sync(self, context: Sequence[int], lasting: bool = False) -> np.ndarray:
        """Bring the cache to exactly `context` and return the logits after its last token. `lasting`
        (a prompt): keep the state before the last token, where a regenerated answer comes back to."""
        session = self.model.session
        keep = session.reusable(context)  # at least the last token goes in again: the first guess needs its logits
        session.rewind(keep)
        if lasting and len(context) - 1 > keep:
            session.decode(context[keep:-1], "none")
            session.checkpoint(lasting=True)
        return session.decode(context[len(session.tokens):], "last")


class MtpGuesser(BaseGuesser):
    """The target drafts for itself with its own MTP layers (`specchat.llama.mtp`): one layer's work a
    token, and a draft that knows the target's hidden state. Drafts are sampled from the head's own
    (transformed) distribution, so the exact rule applies as it does for a draft model."""

    name = "mtp"
    default_draft_length = 3

    def __init__(self, head: MtpHead) -> None:
        self.head = head
        self.keep_going: Callable[[list[float]], bool] | None = None
        self.allowed: Allowed | None = None

    def constrain(self, allowed: Allowed | None) -> None:
        self.allowed = allowed

    def behind(self, context: Sequence[int]) -> int:
        """1: its layers read the target's own state, which is always current."""
        return 1

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        self.head.begin()
        try:
            tokens, probs = draft_tokens(self.head.step(context[-1]), k, sampling, rng, self.head.step,
                                         self.keep_going, self.allowed)
        finally:
            self.head.end()
        return Proposal(tokens, probs, "mtp")


def draft_tokens(logits: np.ndarray, k: int, sampling: SamplingConfig, rng: np.random.Generator,
                 more: Callable[[int], np.ndarray],
                 keep_going: Callable[[list[float]], bool] | None = None,
                 allowed: Allowed | None = None) -> tuple[list[int], np.ndarray | None]:
    """Up to k tokens from a model that gives logits for the next token: `logits` for the first, then
    `more(token)` for the one after each. Greedy takes the argmax; sampling draws from q and returns
    the rows of q, which the acceptance rule needs. `keep_going` may stop early. Under a grammar
    (`allowed`), q is masked to what it allows after the tokens drafted so far: guesses it would refuse
    are not made, and the rows returned are the masked q the tokens were drawn from, as the rule needs."""
    tokens: list[int] = []
    rows: list[np.ndarray] = []
    confidences: list[float] = []
    for i in range(k):
        if allowed is not None:
            allow = allowed(tokens)
            if not allow[:len(logits)].any():  # nothing this draft can write is allowed: stop here
                break
            logits = masked(logits, allow)
        q = None if sampling.greedy else logits_to_probs(logits, sampling)
        tokens.append(int(logits.argmax()) if q is None else sample(q, rng))
        if q is not None:
            rows.append(q)
        if keep_going is not None:
            confidences.append(_confidence(logits, tokens[-1], q))
            if not keep_going(confidences):
                break
        if i < k - 1:
            logits = more(tokens[-1])
    return tokens, None if sampling.greedy or not rows else np.stack(rows)


def _confidence(logits: np.ndarray, token: int, probs: np.ndarray | None) -> float:
    """The draft's probability for its own token: a free estimate of acceptance."""
    if probs is not None:
        return float(probs[token])
    shifted = np.exp(logits - logits.max(), dtype=np.float64)
    return float(shifted[token] / shifted.sum())
