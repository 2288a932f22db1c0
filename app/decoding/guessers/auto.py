"""Auto: per step, the guess that maximizes expected tokens per second, within a loss budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Mapping, Protocol, Sequence

import numpy as np

from specchat.decoding.guessers.base import BaseGuesser, Proposal
from specchat.decoding.guessers.copying import matches
from specchat.decoding.policy import (
    PRIORS,
    Acceptance,
    CostCurve,
    LossAccount,
    MatchAcceptance,
    Priors,
    best_k,
    best_length,
    keep_drafting,
)
from specchat.decoding.sampling import SamplingConfig
from specchat.decoding.verify import Tree

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

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal: ...


class AutoGuesser(BaseGuesser):
    """Per step, the guess that maximizes expected tokens per second: prompt lookup when a match
    is worth it, the draft model or the target's own MTP layers when that pays, or nothing (a plain
    step).

    Acceptance is estimated online: for each drafting model, one running estimate; for lookup, one
    per match length (see MatchAcceptance), kept apart for three kinds of copy. Costs come from the
    measured curve, kept current from real steps, with what a rollback costs on models whose cache
    cannot drop positions. On a GPU, where verifying many positions costs about as much as one, this
    picks long guesses; on a small CPU, short ones or none.
    """

    name = "auto"
    default_draft_length = 16

    def __init__(self, curve: CostCurve, drafters: Mapping[str, Drafter] | None = None, *, max_match: int = 32,
                 window: int = 8, piece: Callable[[int], bytes] | None = None, history: HistoryIndex | None = None,
                 tree_branches: int = 1, priors: Mapping[bool, Priors] = PRIORS) -> None:
        self.curve, self.max_match, self.window, self.priors = curve, max_match, window, priors
        # Continuations verified together as a tree, at most this many (1: never; the cache decides).
        self.tree_branches = tree_branches
        self.history = history  # the user's past conversations, another place to copy from
        # The models that draft token by token, by name ("draft", "mtp"): each with its own acceptance, and
        # its cost per token from the curve.
        self.drafters: dict[str, Drafter] = dict(drafters or {})
        self.piece = piece  # a token's text, to see how much of the copied text the target replaced
        # "far": the longest earlier match anywhere. "near": one that continues where the last
        # guess left off, in the passage being copied (even a 1-token match there usually holds).
        # "substitute": after the target replaced some copied text, copying on after that text.
        # Greedy and sampled answers keep estimates apart (sampled copies hold less often); `propose` picks.
        self._estimates: dict[bool, tuple[dict[str, MatchAcceptance], dict[str, Acceptance]]] = {}
        self.lookup_acceptance, self.drafter_acceptance = self._estimates_for(True)
        self._cursor: int | None = None  # where in the context the answer was last copying from
        self._replaced: int | None = None  # the copied token that the target just replaced, if any
        # The last step's source ("none", "lookup", "history", a drafter's name, or "tree": several copies at
        # once) and, for lookup, where it copied from, its kind and match length.
        self._last: tuple[str, int, str, int] = ("none", 0, "far", 0)
        self._sampling = SamplingConfig()
        self._matches: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        # The last step's tree: where it started in the context and its branches (source, first token,
        # tokens drafted); which branch held is read from the context at the next step.
        self._tree: tuple[int, list[tuple[tuple[str, int, str, int], int, int]]] | None = None
        self._tree_accepted = 0
        # Copies found but not sent, and where the context ended then: the next step's context shows whether
        # they would have held, evidence that costs nothing (see _settle_unsent).
        self._unsent: tuple[int, list[tuple[tuple[str, int, str, int], list[int]]]] = (0, [])
        # What guessing has gained or lost against plain decoding: no guess may risk more than it allows.
        self.account = LossAccount()
        self._timed = True  # the account counts the drafters' real time (not under a seed: by the curve)
        self._since_plain = 0  # steps since the last plain one
        for name, drafter in self.drafters.items():
            drafter.keep_going = lambda confidences, name=name: keep_drafting(
                confidences, self.curve, self.curve.token_s(name))

    def _estimates_for(self, greedy: bool) -> tuple[dict[str, MatchAcceptance], dict[str, Acceptance]]:
        if greedy not in self._estimates:
            p = self.priors[greedy]
            self._estimates[greedy] = (
                {"far": MatchAcceptance(priors=p), "near": MatchAcceptance(p.near, p),
                 "substitute": MatchAcceptance(p.near, p)},
                {name: Acceptance(p.weight * p.drafter, p.weight, p.decay) for name in self.drafters})
        return self._estimates[greedy]

    def prepare(self, context: Sequence[int]) -> None:
        self._cursor = self._replaced = None  # a new generation: nothing is being copied yet
        self._tree = None  # a tree that ended the last one: which branch held is not in this context
        self._unsent = (0, [])
        self.account.start()
        for drafter in self.drafters.values():
            drafter.prepare(context)

    def _copy_source(self, context: Sequence[int]) -> tuple[int, int, str] | None:
        """Where to copy from (start, match length, kind): the longest earlier match; among equals,
        the one nearest after the cursor, else the latest. In a passage that the answer copies
        with edits, the text after an edit is there, not at the latest " the" or "    return"."""
        ends, lengths = self._matches = matches(context, self.max_match)
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
        self._settle_tree(context)
        self._last, self._sampling, self._timed = ("none", 0, "far", 0), sampling, sampling.seed is None
        self.lookup_acceptance, self.drafter_acceptance = self._estimates_for(sampling.greedy)
        self._settle_unsent(context)
        found_copies: list[tuple[tuple[str, int, str, int], list[int]]] = []
        best = 1.0 / float(self.curve.verify(1))  # a plain step
        allow = self.account.allowance(float(self.curve.verify(1)))  # what this step may lose at worst
        choice = Proposal.empty()
        # Copies worth sending on their own: (source, tokens, their acceptances), the best first.
        copies: list[tuple[tuple[str, int, str, int], list[int], np.ndarray]] = []
        copy = self._copy_source(context) if k > 0 else None
        if copy is not None:
            start, m, kind = copy
            found = [int(t) for t in context[start:start + k]]
            alphas = self.lookup_acceptance[kind].alphas(m, len(found))
            n, rate = best_length(alphas, self.curve, 0.0, allow)
            found_copies.append((("lookup", start, kind, m), found))
            if n:
                copies.append((("lookup", start, kind, m), found[:n], alphas[:n]))
            if n and rate > best:
                best, choice = rate, Proposal(found[:n], None, "lookup")
                self._last = ("lookup", start, kind, m)
        if self.history is not None and k > 0:
            found, m = self.history.propose(context, k)
            alphas = self.history.acceptance(sampling).alphas(m, len(found))
            n, rate = best_length(alphas, self.curve, 0.0, allow)
            if found:
                found_copies.append((("history", 0, "history", m), found))
            if n:
                copies.append((("history", 0, "history", m), found[:n], alphas[:n]))
            if n and rate > best:
                best, choice = rate, Proposal(found[:n], None, "history")
                self._last = ("history", 0, "history", m)
        if self.tree_branches > 1 and copies:
            tree = self._tree_of(context, copies, k, best, allow)
            if tree is not None:
                best, choice = tree
        drafter = None
        for name in self.drafters if k > 0 else ():
            n, rate = best_k(self.drafter_acceptance[name].alpha, k, self.curve, self.curve.token_s(name), allow)
            if n and rate > best:
                best, drafter = rate, (name, n)
        if drafter is not None:
            name, n = drafter
            self._last, self._tree = (name, 0, "far", 0), None
        if self._since_plain >= PLAIN_EVERY:  # what plain decoding costs now is measured, not assumed
            choice, drafter, self._last, self._tree = Proposal.empty(), None, ("none", 0, "far", 0), None
        sent = {source for source, _, _ in self._tree[1]} if self._tree is not None else {self._last}
        self._unsent = (len(context), [(source, found) for source, found in found_copies if source not in sent])
        return self.drafters[drafter[0]].propose(context, drafter[1], sampling, rng) if drafter else choice

    def _tree_of(self, context: Sequence[int], copies: list, k: int, best: float,
                 allow: float) -> tuple[float, Proposal] | None:
        """Several copies that disagree on their first token, as one tree, if the curve says that
        verifying them together beats the best single guess: where verifying more positions costs
        little (a GPU, Apple silicon), a second continuation is nearly free; on a small CPU, rarely.
        Besides the copies found, the longest earlier match that continues differently from them."""
        firsts = {tokens[0] for _, tokens, _ in copies}
        ends, lengths = self._matches
        other = [i for i in range(len(ends)) if int(context[ends[i]]) not in firsts]
        if other:
            i = max(other, key=lambda j: (lengths[j], ends[j]))
            start, m = int(ends[i]), int(lengths[i])
            found = [int(t) for t in context[start:start + k]]
            alphas = self.lookup_acceptance["far"].alphas(m, len(found))
            n, _ = best_length(alphas, self.curve, 0.0, allow)
            if n:
                copies = [*copies, (("lookup", start, "far", m), found[:n], alphas[:n])]
        branches, seen = [], set()
        for copy in copies:  # one branch per first token: deterministic siblings must differ
            if copy[1][0] not in seen and len(branches) < self.tree_branches:
                seen.add(copy[1][0])
                branches.append(copy)
        if len(branches) < 2:
            return None
        # The branches' first tokens cannot both be right: their chances are shares of one.
        reach = [np.cumprod(alphas) for _, _, alphas in branches]
        scale = min(1.0, 1.0 / sum(float(r[0]) for r in reach))
        tokens = 1.0 + scale * sum(float(r.sum()) for r in reach)
        nodes = sum(len(t) for _, t, _ in branches)
        rate = tokens / float(self.curve.verify(1 + nodes))
        if rate <= best or float(self.curve.worst_loss(nodes, 0.0)[-1]) > allow:
            return None
        flat, parents = [], []
        for _, t, _ in branches:
            parents += [-1, *range(len(flat), len(flat) + len(t) - 1)]
            flat += t
        tree = Tree(tuple(flat), tuple(parents), (None,) * len(flat))
        self._tree = (len(context), [(source, t[0], len(t)) for source, t, _ in branches])
        self._last = ("tree", 0, "far", 0)
        return rate, Proposal(flat, None, "tree", tree=tree)

    def _settle_tree(self, context: Sequence[int]) -> None:
        """What the last tree's branches made of it, now that the context shows which one held: that
        one accepted what the step kept, the others nothing."""
        if self._tree is None:
            return
        (at, branches), accepted = self._tree, self._tree_accepted
        self._tree = None
        held = int(context[at]) if accepted and at < len(context) else None
        # the one that held last: a copy that missed must not undo where the one that held left off
        for last, first, drafted in sorted(branches, key=lambda b: b[1] == held):
            self._last = last
            self._learn(drafted, accepted if first == held else 0)

    def _settle_unsent(self, context: Sequence[int]) -> None:
        """What the copies found but not sent at the last step would have made of it: the context now holds
        the tokens that step committed, and a copied token is kept exactly when it equals the committed one
        (greedy or sampled: the exact rule keeps a point mass where the target's draw lands on it). So every
        copy auto passes up is judged for free, and an estimate that ruled copying out learns when the
        answer starts to copy, instead of waiting to drift back to its prior."""
        at, unsent = self._unsent
        self._unsent = (0, [])
        committed = [int(t) for t in context[at:]] if at <= len(context) else []
        for (source, _, kind, m), found in unsent:
            n = min(len(found), len(committed))
            held = next((j for j in range(n) if found[j] != committed[j]), n)
            if n and source == "lookup":
                self.lookup_acceptance[kind].observe(m, n, held)
            elif n and self.history is not None:
                self.history.acceptance(self._sampling).observe(m, n, held)

    def observe(self, drafted: int, accepted: int, draft_s: float) -> None:
        # The curve is the service's to keep current (from every step, whoever guessed): auto keeps its
        # account and learns acceptance here. The account prices the verification by the curve (a plain
        # step's own time varies more than any guess gains) and a drafter's work by its real time.
        source = self._last[0]
        drafting = (draft_s if self._timed else drafted * self.curve.token_s(source)) if source in self.drafters else 0.0
        self.account.settle(accepted + 1, self.curve.spent_s(drafted, accepted, drafting), float(self.curve.verify(1)))
        self._since_plain = 0 if not drafted else self._since_plain + 1
        self._learn(drafted, accepted)

    def _learn(self, drafted: int, accepted: int) -> None:
        source, start, kind, m = self._last
        if source == "tree":  # settled at the next step, which shows which branch held
            self._tree_accepted = accepted
            return
        if source == "history":
            self.history.acceptance(self._sampling).observe(m, drafted, accepted)
        if source == "lookup":
            self.lookup_acceptance[kind].observe(m, drafted, accepted)
            # Only a guess that landed at least once shows where the answer copies from: a first-token
            # miss may just be the wrong occurrence, and following it would drift off the passage.
            if accepted:
                self._cursor = start + accepted
            self._replaced = self._cursor if 0 < accepted < drafted else None
        if source in self.drafters:
            self.drafter_acceptance[source].observe(accepted, accepted < drafted)
        # An option never chosen is never measured again: estimates that ruled a guesser out
        # drift back towards their priors, so that it is retried now and then.
        for estimate in [*self.drafter_acceptance.values(), *self.lookup_acceptance.values()]:
            estimate.relax()
