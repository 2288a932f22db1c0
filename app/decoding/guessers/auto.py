"""Auto: per step, the guess that maximizes expected tokens per second, within a loss budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

from specchat.decoding.guessers.base import Allowed, BaseGuesser, Proposal
from specchat.decoding.guessers.sources import (
    Copy,
    Found,
    Offer,
    Passage,
    SentTree,
    Unsent,
    as_tree,
    branches,
    copies,
)
from specchat.decoding.policy import (
    PLACE_SHIFTS,
    PRIORS,
    Acceptance,
    Clock,
    CostCurve,
    LossAccount,
    MatchAcceptance,
    PlaceShift,
    Priors,
    best_drafter,
    best_length,
    could_pay,
    estimates,
    keep_drafting,
    rate_bound,
    settle_step,
    shifted,
    step_allowance,
    tree_beats,
)
from specchat.decoding.sampling import SamplingConfig

if TYPE_CHECKING:
    from specchat.decoding.history import HistoryIndex


# A plain step never loses to plain decoding, and it is what every speedup is measured against: auto takes
# one when it has gone this many steps without, so that what plain decoding costs now is always measured,
# whatever the curve says (at a step's cost in a long copy: 1-2% of a rewrite's tokens).
PLAIN_EVERY = 64


class Drafter(Protocol):
    """What auto needs of a guesser that drafts token by token (DraftGuesser, MtpGuesser)."""

    keep_going: Callable[[list[float]], bool] | None  # auto's early stop, from the draft's own confidence

    def prepare(self, context: Sequence[int]) -> None: ...

    def constrain(self, allowed: Allowed | None) -> None: ...

    def behind(self, context: Sequence[int]) -> int:
        """How many of the context's tokens it would read before its first guess (1: only the last)."""

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal: ...


class AutoGuesser(BaseGuesser):
    """Per step, the guess that maximizes expected tokens per second: prompt lookup when a match is worth it, the
    draft model or the target's own MTP layers when that pays, or nothing (a plain step).

    Acceptance is estimated online: for each drafting model, one running estimate; for lookup, one per match
    length (see MatchAcceptance), kept apart for three kinds of copy. Costs come from the measured curve, kept
    current from real steps, with what a rollback costs on models whose cache cannot drop positions. On a GPU,
    where verifying many positions costs about as much as one, this picks long guesses; on a small CPU, short
    ones or none."""

    name = "auto"
    default_draft_length = 16

    def __init__(self, curve: CostCurve, drafters: Mapping[str, Drafter] | None = None, *, max_match: int = 32,
                 window: int = 8, piece: Callable[[int], bytes] | None = None, history: HistoryIndex | None = None,
                 tree_branches: int = 1, priors: Mapping[bool, Priors] = PRIORS,
                 places: Mapping[bool, PlaceShift | None] = PLACE_SHIFTS) -> None:
        self.curve, self.priors, self.places = curve, priors, places
        self.passage = Passage(max_match, window, piece)  # where in the context the answer copies from
        # Continuations verified together as a tree, at most this many (1: never; the cache decides).
        self.tree_branches = tree_branches
        self.history = history  # the user's past conversations, another place to copy from
        # The models that draft token by token, by name ("draft", "mtp"): each with its own acceptance, and
        # its cost per token from the curve.
        self.drafters: dict[str, Drafter] = dict(drafters or {})
        # Greedy and sampled answers keep estimates apart (sampled copies hold less often); `propose` picks.
        self._estimates: dict[bool, tuple[dict[str, MatchAcceptance], dict[str, Acceptance]]] = {}
        self.lookup_acceptance, self.drafter_acceptance = self._estimates_for(True)
        # The last step's source: a copy, a drafter's name, "tree" (several copies at once) or "none".
        self._last: Copy | str = "none"
        self._sampling = SamplingConfig()
        self._tree: SentTree | None = None  # the last step's tree, and what the step kept of it
        self._tree_accepted = 0
        self._unsent = Unsent()  # copies found but not sent: the next step's context judges them
        # What guessing has gained or lost against plain decoding: no guess may risk more than it allows.
        # Steps are settled at their time by the clock, against plain steps timed alike (`clock`); under a
        # seed by the curve, so that the same choices, and so the same text, come again.
        self.account = LossAccount()
        self.clock = Clock()
        self._timed = True
        self._since_plain = 0  # steps since the last plain one
        self._catch_up_s = 0.0  # what the drafter sent this step was priced to take catching up (by the curve)
        for name, drafter in self.drafters.items():
            drafter.keep_going = lambda confidences, name=name: keep_drafting(
                confidences, self.curve, self.curve.token_s(name))

    def _estimates_for(self, greedy: bool) -> tuple[dict[str, MatchAcceptance], dict[str, Acceptance]]:
        if greedy not in self._estimates:
            self._estimates[greedy] = estimates(self.priors[greedy], self.drafters)
        return self._estimates[greedy]

    def _acceptance(self, copy: Copy) -> MatchAcceptance:
        """How often copies like this one hold, by match length (the history keeps its own, across chats)."""
        if copy.source == "history":
            assert self.history is not None
            return self.history.acceptance(self._sampling)
        return self.lookup_acceptance[copy.kind]

    def constrain(self, allowed: Allowed | None) -> None:
        for drafter in self.drafters.values():  # its copies are cut by the engine, as lookup's are
            constrain = getattr(drafter, "constrain", None)  # (a drafter without it drafts unmasked: still exact)
            if constrain is not None:
                constrain(allowed)

    def prepare(self, context: Sequence[int]) -> None:
        self.passage.restart(len(context))
        self._tree = None  # a tree that ended the last one: which branch held is not in this context
        self._unsent = Unsent()
        self.account.start()
        for name, drafter in self.drafters.items():
            # Brought up to the prompt only where it could pay at its estimate: where a draft token costs most of a
            # target step (a small CPU) it never would, and reading the prompt would only delay the first token
            # (0.4 s of 1.2 s for an 80-token prompt on a 2-core EPYC). Left behind, it catches up if it comes to
            # pay, at the price best_drafter counts.
            alpha = max(estimate[1][name].alpha for estimate in self._estimates.values())
            if could_pay(alpha, self.default_draft_length, self.curve, self.curve.token_s(name)):
                drafter.prepare(context)

    def _offer(self, context: Sequence[int], found: Found, allow: float) -> Offer:
        """The copy cut to its best length (no tokens: none pays), and the rate it would make."""
        copy = found.copy
        alphas = self._acceptance(copy).alphas(copy.m, len(found.tokens))
        place = self.places[self._sampling.greedy]
        if place is not None and copy.kind in ("far", "near"):  # a substitute's place is a guess of auto's own
            alphas = shifted(alphas, place.shift(*self.passage.place(context, copy)))
        plain = 1.0 / float(self.curve.verify(1))
        if rate_bound(alphas, self.curve, 0.0) <= plain:  # no length beats a plain step: best_length would say so
            return Offer(found.copy, found.tokens[:0], alphas[:0], plain)
        n, rate = best_length(alphas, self.curve, 0.0, allow)
        return Offer(found.copy, found.tokens[:n], alphas[:n], rate)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        self._settle_tree(context)
        self._last, self._sampling, self._timed = "none", sampling, sampling.seed is None
        self.lookup_acceptance, self.drafter_acceptance = self._estimates_for(sampling.greedy)
        self._settle_unsent(context)
        allow = step_allowance(self.account, self.curve, self.clock.ratio if self._timed else 1.0)
        # Every copy found (those not sent are judged next step), and those worth sending on their own.
        found = [copy for copy in copies(context, k, self.passage, self.history) if copy.tokens]
        offers = [offer for offer in (self._offer(context, copy, allow) for copy in found) if offer.tokens]
        best, choice = 1.0 / float(self.curve.verify(1)), Proposal.empty()  # a plain step
        for offer in offers:
            if offer.rate > best:
                best, choice, self._last = offer.rate, Proposal(offer.tokens, None, offer.copy.source), offer.copy
        if self.tree_branches > 1 and offers:
            best, choice = self._tree_of(context, offers, k, best, allow) or (best, choice)
        alphas = {name: estimate.alpha for name, estimate in self.drafter_acceptance.items()}
        drafter = best_drafter(alphas, lambda name: self.drafters[name].behind(context), k, self.curve, allow, best)
        self._catch_up_s = drafter.catch_up_s if drafter else 0.0
        if drafter is not None:
            self._last, self._tree = drafter.name, None
        if self._since_plain >= PLAIN_EVERY:  # what plain decoding costs now is measured, not assumed
            choice, drafter, self._last, self._tree = Proposal.empty(), None, "none", None
        sent = {copy for copy, _, _ in self._tree.branches} if self._tree is not None else {self._last}
        self._unsent = Unsent(len(context), tuple(copy for copy in found if copy.copy not in sent))
        return self.drafters[drafter.name].propose(context, drafter.n, sampling, rng) if drafter else choice

    def _tree_of(self, context: Sequence[int], offers: list[Offer], k: int, best: float,
                 allow: float) -> tuple[float, Proposal] | None:
        """Several copies that disagree on their first token, as one tree, if the curve says that
        verifying them together beats the best single guess: where verifying more positions costs
        little (a GPU, Apple silicon), a second continuation is nearly free; on a small CPU, rarely.
        Besides the copies found, the longest earlier match that continues differently from them."""
        other = self.passage.other(context, {offer.tokens[0] for offer in offers})
        if other is not None:
            offer = self._offer(context, Found(other, self.passage.guesses(context, other, k)), allow)
            offers = [*offers, offer] if offer.tokens else offers
        sent = branches(offers, self.tree_branches)
        rate = tree_beats([offer.alphas for offer in sent], self.curve, allow, best)
        if rate is None:
            return None
        self._tree, self._last = SentTree.of(len(context), sent), "tree"
        tree = as_tree([offer.tokens for offer in sent])
        return rate, Proposal(list(tree.tokens), None, "tree", tree=tree)

    def _settle_tree(self, context: Sequence[int]) -> None:
        """What the last tree's branches made of it, now that the context shows which one held."""
        tree, self._tree = self._tree, None
        for copy, drafted, accepted in tree.outcomes(context, self._tree_accepted) if tree is not None else ():
            self._last = copy
            self._learn(drafted, accepted)

    def _settle_unsent(self, context: Sequence[int]) -> None:
        """What the copies found but not sent at the last step would have made of it (Unsent.outcomes)."""
        unsent, self._unsent = self._unsent, Unsent()
        for copy, drafted, accepted in unsent.outcomes(context):
            self._acceptance(copy).observe(copy.m, drafted, accepted)

    def observe(self, drafted: int, accepted: int, span_s: float | None = None) -> None:
        # The curve is the service's to keep current (from every step, whoever guessed): auto keeps its
        # account and learns acceptance here.
        name = self._last if isinstance(self._last, str) and self._last in self.drafters else None
        draft_s = 0.0 if name is None else drafted * self.curve.token_s(name) + self._catch_up_s
        settle_step(self.account, self.clock, self.curve, drafted, accepted, draft_s, span_s if self._timed else None)
        self._since_plain = 0 if not drafted else self._since_plain + 1
        self._learn(drafted, accepted)

    def _learn(self, drafted: int, accepted: int) -> None:
        last = self._last
        if last == "tree":  # settled at the next step, which shows which branch held
            self._tree_accepted = accepted
            return
        if isinstance(last, Copy):
            self._acceptance(last).observe(last.m, drafted, accepted)
            if last.source == "lookup":
                self.passage.landed(last.start, drafted, accepted)
        elif last in self.drafters:
            self.drafter_acceptance[last].observe(accepted, accepted < drafted)
        # An option never chosen is never measured again: estimates that ruled a guesser out
        # drift back towards their priors, so that it is retried now and then.
        for estimate in [*self.drafter_acceptance.values(), *self.lookup_acceptance.values()]:
            estimate.relax()
