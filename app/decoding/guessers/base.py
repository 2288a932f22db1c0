"""The guesser interface: what every guesser proposes, and what it may hear back.

A guesser returns the tokens it proposes and, if it sampled them, the distributions it sampled from;
deterministic proposals (copies) return None, which the verifier treats as point masses. Auto may also
propose several continuations at once as a tree (copies that part ways), verified in one target step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from specchat.decoding.sampling import SamplingConfig
from specchat.decoding.verify import Tree

# Under a grammar: what it allows after the answer so far and then these drafted tokens ((V,) bool; nothing,
# if it refuses them). A drafter samples from its distribution masked to it, and reports the masked one.
Allowed = Callable[[Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray | None  # (len(tokens), V), or None for deterministic proposals and trees
    guesser: str = "none"  # which guesser made it: "none", "lookup", "history", "draft", "mtp", or auto's "tree"
    # Of the time the proposal took, what went into catching the draft's cache up with the tokens
    # committed since it last ran: a cost of the steps before, not of these guesses.
    sync_s: float = 0.0
    # Several continuations at once, verified as a tree in one target step; `tokens` are then its
    # nodes' tokens, in its order, and `probs` is None (the tree holds each node's draft distribution).
    tree: Tree | None = None

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
        """Up to k tokens likely to follow context (which ends with the last committed token), or a tree of
        such continuations."""

    def observe(self, drafted: int, accepted: int, span_s: float | None = None) -> None:
        """What the step made of the last proposal, for guessers that learn: how many of its tokens the
        target kept, and the step's time by the clock, from the last step's end to this one's: proposing,
        verifying, taking back, handing the tokens on (None: untimed, as in a replay). The service keeps
        the cost curve from the same steps."""

    def constrain(self, allowed: Allowed | None) -> None:
        """Called at each generation's start: the grammar's masks for drafting under it (None: no grammar).
        Optional for exactness (the target's rule is masked whatever is guessed): it makes guesses that hold."""


class BaseGuesser:
    """No-op defaults: a guesser that needs no set-up and learns nothing defines `propose` alone."""

    name = "none"
    default_draft_length = 0

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def observe(self, drafted: int, accepted: int, span_s: float | None = None) -> None:
        pass

    def constrain(self, allowed: Allowed | None) -> None:
        pass


class NoGuesser(BaseGuesser):
    """Plain decoding through the same engine: every step verifies nothing and samples one token."""

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal.empty()
