"""Guessers: cheap proposals for the next tokens, checked by the target in one step.

One small interface, several implementations. A guesser returns the tokens it proposes
and, if it sampled them, the distributions it sampled from; deterministic proposals
(prompt lookup) return None, which the verifier treats as point masses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection, Protocol, Sequence

import numpy as np

from specchat.errors import SpecchatError
from specchat.spec.policy import Acceptance, CostCurve, MatchAcceptance, best_k, best_length, keep_drafting
from specchat.spec.sampling import SamplingConfig, logits_to_probs, sample
from specchat.spec.verify import Tree

if TYPE_CHECKING:  # settings validate guesser names without loading llama.cpp
    from specchat.llama.model import Model
    from specchat.llama.mtp import MtpHead
    from specchat.spec.history import HistoryIndex


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    probs: np.ndarray | None  # (len(tokens), V) or None for deterministic proposals
    guesser: str = "none"  # which guesser made it: "none", "lookup", "draft", "mtp" or "history"
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
        """Up to k tokens likely to follow context (which ends with the last committed token)."""

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
        """What the step made of the last proposal, for guessers that learn: verify_s is the
        verification alone, rollback_s what saving and restoring the state cost on top of it."""


class NoGuesser:
    """Plain decoding through the same engine: every step verifies nothing and samples one token."""

    name = "none"
    default_draft_length = 0

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal.empty()

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
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

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
        pass


class HistoryGuesser:
    """Copies from the user's past conversations (`specchat.spec.history`): what followed the longest
    match of the context's end there, as most of those matches continued."""

    name = "history"
    default_draft_length = 16

    def __init__(self, index: HistoryIndex) -> None:
        self.index = index

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        return Proposal(self.index.propose(context, k)[0], None, "history")

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
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

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
        pass

    def prepare(self, context: Sequence[int]) -> None:
        self._sync(context, lasting=True)

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
                                     self.keep_going)
        return Proposal(tokens, probs, "draft", sync_s)

    def _sync(self, context: Sequence[int], lasting: bool = False) -> np.ndarray:
        """Bring the cache to exactly `context` and return the logits after its last token. `lasting`
        (a prompt): keep the state before the last token, where a regenerated answer comes back to."""
        session = self.model.session
        # Re-evaluate at least the last token: its logits are what the first guess needs.
        keep = min(session.common_prefix(context), len(context) - 1)
        session.rewind(keep)
        if lasting and len(context) - 1 > keep:
            session.decode(context[keep:-1], "none")
            session.checkpoint(lasting=True)
        return session.decode(context[len(session.tokens):], "last")


class MtpGuesser:
    """The target drafts for itself with its own MTP layers (`specchat.llama.mtp`): one layer's work a
    token, and a draft that knows the target's hidden state. Drafts are sampled from the head's own
    (transformed) distribution, so the exact rule applies as it does for a draft model."""

    name = "mtp"
    default_draft_length = 3

    def __init__(self, head: MtpHead) -> None:
        self.head = head
        self.keep_going: Callable[[list[float]], bool] | None = None

    def prepare(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        if k <= 0:
            return Proposal.empty()
        self.head.begin()
        try:
            tokens, probs = draft_tokens(self.head.step(context[-1]), k, sampling, rng, self.head.step,
                                         self.keep_going)
        finally:
            self.head.end()
        return Proposal(tokens, probs, "mtp")

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
        pass


def draft_tokens(logits: np.ndarray, k: int, sampling: SamplingConfig, rng: np.random.Generator,
                 more: Callable[[int], np.ndarray],
                 keep_going: Callable[[list[float]], bool] | None = None) -> tuple[list[int], np.ndarray | None]:
    """Up to k tokens from a model that gives logits for the next token: `logits` for the first, then
    `more(token)` for the one after each. Greedy takes the argmax; sampling draws from q and returns
    the rows of q, which the acceptance rule needs. `keep_going` may stop early."""
    tokens: list[int] = []
    rows: list[np.ndarray] = []
    confidences: list[float] = []
    for i in range(k):
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
    return tokens, None if sampling.greedy else np.stack(rows)


def _confidence(logits: np.ndarray, token: int, probs: np.ndarray | None) -> float:
    """The draft's probability for its own token: a free estimate of acceptance."""
    if probs is not None:
        return float(probs[token])
    shifted = np.exp(logits - logits.max(), dtype=np.float64)
    return float(shifted[token] / shifted.sum())


class AutoGuesser:
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

    def __init__(self, curve: CostCurve, draft: DraftGuesser | None = None, max_match: int = 32,
                 window: int = 8, piece: Callable[[int], bytes] | None = None, mtp: MtpGuesser | None = None,
                 history: HistoryIndex | None = None, tree_branches: int = 1) -> None:
        self.curve, self.draft, self.max_match, self.window = curve, draft, max_match, window
        # Continuations verified together as a tree, at most this many (1: never; the cache decides).
        self.tree_branches = tree_branches
        self.history = history  # the user's past conversations, another place to copy from
        # The models that draft token by token, each with its own acceptance and cost per token.
        self.drafters: dict[str, DraftGuesser | MtpGuesser] = {
            name: g for name, g in (("draft", draft), ("mtp", mtp)) if g is not None}
        self.drafter_acceptance = {name: Acceptance() for name in self.drafters}
        self.piece = piece  # a token's text, to see how much of the copied text the target replaced
        # "far": the longest earlier match anywhere. "near": one that continues where the last
        # guess left off, in the passage being copied (even a 1-token match there usually holds).
        # "substitute": after the target replaced some copied text, copying on after that text.
        self.lookup_acceptance = {"far": MatchAcceptance(), "near": MatchAcceptance(floor=0.6),
                                  "substitute": MatchAcceptance(floor=0.6)}
        self._cursor: int | None = None  # where in the context the answer was last copying from
        self._replaced: int | None = None  # the copied token that the target just replaced, if any
        # The last step's source and, for lookup, where it copied from, its kind and match length.
        self._last: tuple[str, int, str, int] = ("none", 0, "far", 0)
        self._sampling = SamplingConfig()
        self._matches: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        # The last step's tree: where it started in the context and its branches (source, first token,
        # tokens drafted); which branch held is read from the context at the next step.
        self._tree: tuple[int, list[tuple[tuple[str, int, str, int], int, int]]] | None = None
        self._tree_accepted = 0
        for name, drafter in self.drafters.items():
            drafter.keep_going = lambda confidences, name=name: keep_drafting(
                confidences, self.curve, self.curve.token_s(name))

    def prepare(self, context: Sequence[int]) -> None:
        self._cursor = self._replaced = None  # a new generation: nothing is being copied yet
        self._tree = None  # a tree that ended the last one: which branch held is not in this context
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
        self._last, self._sampling = ("none", 0, "far", 0), sampling
        best = 1.0 / float(self.curve.verify(1))  # a plain step
        choice = Proposal.empty()
        # Copies worth sending on their own: (source, tokens, their acceptances), the best first.
        copies: list[tuple[tuple[str, int, str, int], list[int], np.ndarray]] = []
        copy = self._copy_source(context) if k > 0 else None
        if copy is not None:
            start, m, kind = copy
            found = [int(t) for t in context[start:start + k]]
            alphas = self.lookup_acceptance[kind].alphas(m, len(found))
            n, rate = best_length(alphas, self.curve, 0.0)
            if n:
                copies.append((("lookup", start, kind, m), found[:n], alphas[:n]))
            if n and rate > best:
                best, choice = rate, Proposal(found[:n], None, "lookup")
                self._last = ("lookup", start, kind, m)
        if self.history is not None and k > 0:
            found, m = self.history.propose(context, k)
            alphas = self.history.acceptance(sampling).alphas(m, len(found))
            n, rate = best_length(alphas, self.curve, 0.0)
            if n:
                copies.append((("history", 0, "history", m), found[:n], alphas[:n]))
            if n and rate > best:
                best, choice = rate, Proposal(found[:n], None, "history")
                self._last = ("history", 0, "history", m)
        if self.tree_branches > 1 and copies:
            tree = self._tree_of(context, copies, k, best)
            if tree is not None:
                best, choice = tree
        drafter = None
        for name in self.drafters if k > 0 else ():
            n, rate = best_k(self.drafter_acceptance[name].alpha, k, self.curve, self.curve.token_s(name))
            if n and rate > best:
                best, drafter = rate, (name, n)
        if drafter is not None:
            name, n = drafter
            self._last = (name, 0, "far", 0)
            return self.drafters[name].propose(context, n, sampling, rng)
        return choice

    def _tree_of(self, context: Sequence[int], copies: list, k: int,
                 best: float) -> tuple[float, Proposal] | None:
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
            n, _ = best_length(alphas, self.curve, 0.0)
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
        if rate <= best:
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
            self.observe(drafted, accepted if first == held else 0, 0.0, 0.0)

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, rollback_s: float = 0.0) -> None:
        # The curve is the service's to keep current (from every step, whoever guessed): auto learns
        # acceptance here.
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


# --- the registry --------------------------------------------------------------------------------


class Pair(Protocol):
    """What a guesser is built from: a loaded target, its draft if any, and this machine's costs."""

    target: Model
    draft: Model | None
    mtp: MtpHead | None  # the target's own MTP layers (or its assistant's), if it has them
    history: HistoryIndex | None  # the user's past conversations in the target's tokens, where known
    warnings: list[str]  # why something the user asked for was left out (a draft that failed to load)

    @property
    def capabilities(self) -> frozenset[str]:
        """What the pair has that a guesser may need (see NEEDS)."""

    def curve(self) -> CostCurve: ...


# What a guesser may need, in the words that say so when a pair lacks it.
NEEDS = {"rewind": "a cache that can take back a rejected guess, which this model's cannot (see its warning)",
         "draft": "a draft model: pass --draft PATH or use a --pair that has one",
         "mtp": "MTP layers: a model that has them (Qwen3.5/3.6, DeepSeek, GLM), or a Gemma 4 target with its "
                "gemma4-assistant file as --draft",
         "history": "the app's conversations to copy from (`generate` and `serve` have none)"}


@dataclass(frozen=True)
class Entry:
    help: str
    build: Callable[[Pair], Guesser]  # a new guesser, with state of its own, over the pair
    needs: frozenset[str] = frozenset()


def _auto(pair: Pair) -> Guesser:
    if "rewind" not in pair.capabilities:  # every guess would cost the whole conversation again
        return NoGuesser()
    # The pair's live curve, which the service keeps current from real steps.
    return AutoGuesser(pair.curve(), DraftGuesser(pair.draft) if pair.draft is not None else None,
                       piece=pair.target.piece, mtp=MtpGuesser(pair.mtp) if pair.mtp is not None else None,
                       history=pair.history, tree_branches=pair.target.tree_branches)


# Every guesser by name, in the order the app cycles through them. A new guesser is its class and one
# line here: the command line, the settings, Ctrl+G, the server and the loader all read this.
REGISTRY: dict[str, Entry] = {
    "auto": Entry("picks lookup, the draft or nothing at each step, by this machine's costs", _auto),
    "none": Entry("plain decoding", lambda pair: NoGuesser()),
    "lookup": Entry("copies from earlier text (prompt lookup)", lambda pair: LookupGuesser(), frozenset({"rewind"})),
    "draft": Entry("the draft model guesses", lambda pair: DraftGuesser(pair.draft), frozenset({"rewind", "draft"})),
    "mtp": Entry("the target's own MTP layers guess", lambda pair: MtpGuesser(pair.mtp), frozenset({"rewind", "mtp"})),
    "history": Entry("copies what your past conversations said next", lambda pair: HistoryGuesser(pair.history),
                     frozenset({"rewind", "history"})),
}
GUESSERS = tuple(REGISTRY)


def available(capabilities: Collection[str]) -> list[str]:
    """The guessers that can run on what a pair (or a server) has, in the registry's order."""
    return [name for name, entry in REGISTRY.items() if entry.needs <= set(capabilities)]


def unavailable(name: str, capabilities: Collection[str], warnings: Sequence[str] = ()) -> str | None:
    """Why the guesser `name` cannot run here (one line, with what to do), or None if it can. `warnings`
    say why something it needs was left out, when it was."""
    entry = REGISTRY.get(name)
    if entry is None:
        return f"unknown guesser {name!r}; choose one of {', '.join(GUESSERS)}"
    lacking = sorted(entry.needs - set(capabilities))
    if not lacking:
        return None
    if warnings:
        return f"the {name} guesser cannot run: {'; '.join(warnings)} (choose another guesser)"
    return f"the {name} guesser needs " + "; and ".join(NEEDS[need] for need in lacking)


def build(name: str, pair: Pair) -> Guesser:
    """A new guesser of this name over the pair, or a one-line error saying why it cannot run."""
    why = unavailable(name, pair.capabilities, pair.warnings)
    if why is not None:
        raise SpecchatError(why)
    return REGISTRY[name].build(pair)
