"""Choosing how much to guess: pure functions over a cost model and acceptance estimates.

A step that verifies n positions costs verify(n); drafting costs draft_s per token (zero for
prompt lookup). With per-position acceptance alpha, k guesses yield (1 - alpha^(k+1)) / (1 - alpha)
tokens, so the rate is that over (k * draft_s + verify(k + 1)). On a GPU verify() is nearly flat
and long drafts win; on a small CPU it climbs steeply and short drafts, or none, win. On a model
whose cache cannot drop positions (recurrent state), a guess also costs saving the state, and a
rejection restoring it and decoding the accepted tokens again (`Rollback`).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np


def expected_tokens(alpha: float, k: np.ndarray | int) -> np.ndarray:
    """Expected tokens per step with k guesses, each accepted i.i.d. with probability alpha."""
    k = np.asarray(k, dtype=np.float64)
    if alpha >= 1.0:
        return k + 1
    return (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(frozen=True)
class Rollback:
    """What taking back a rejected guess costs where the cache cannot simply drop positions: a copy of
    the state before the verification, and on a rejection its restore plus a decode of the tokens kept.
    Rewinds of up to `free_depth` positions cost nothing (llama.cpp's own snapshots)."""

    save_s: float
    restore_s: float
    free_depth: int = 0


@dataclass
class CostCurve:
    """Seconds to verify n positions (n = 1..len). The service keeps one per pair current from real
    steps (`specchat.decoding.timing`); the guessers read it."""

    verify_s: list[float]  # verify_s[n - 1] is the cost of n positions
    draft_s: float = 0.0  # one draft-model token
    mtp_s: float = 0.0  # one token of the target's own MTP layers
    rollback: Rollback | None = None  # None: the cache drops positions for free

    def verify(self, n: np.ndarray | int) -> np.ndarray:
        if type(n) is int and 1 <= n <= len(self.verify_s):
            # Auto asks this several times a step: at 30 tok/s numpy's path would be a percent of each.
            return np.float64(self.verify_s[n - 1])
        n = np.asarray(n)
        table = np.asarray(self.verify_s)
        last = len(table)
        # Beyond the table, extend by the slope of its last two points.
        slope = table[-1] - table[-2] if last > 1 else table[-1]
        inside = table[np.clip(n, 1, last) - 1]
        return np.where(n <= last, inside, table[-1] + (n - last) * slope)

    def copy(self) -> "CostCurve":
        """An independent copy, for a user that adjusts it from its own steps."""
        return CostCurve(list(self.verify_s), self.draft_s, self.mtp_s, self.rollback)

    def token_s(self, drafter: str) -> float:
        """One drafted token of the "draft" model or of the "mtp" layers."""
        return self.mtp_s if drafter == "mtp" else self.draft_s

    def spent_s(self, drafted: int, accepted: int, draft_s: float) -> float:
        """What a step that sent `drafted` guesses and kept `accepted` cost by this curve, with draft_s for
        its drafting: the verification and, where the cache cannot drop positions, taking back the rest."""
        seconds = draft_s + float(self.verify(drafted + 1))
        r = self.rollback
        if r is not None and drafted > r.free_depth:
            seconds += r.save_s + (r.restore_s + float(self.verify(accepted + 1)) if accepted < drafted else 0.0)
        return seconds

    def catch_up_s(self, drafter: str, behind: int) -> float:
        """What a drafter takes to read the `behind` tokens committed since it last ran, beyond the one every
        drafting step reads (which token_s covers): one batch, priced by the target's curve's shape."""
        return self.token_s(drafter) * (float(self.verify(behind) / self.verify(1)) - 1.0) if behind > 1 else 0.0

    def worst_loss(self, k_max: int, draft_s: float, setup_s: float = 0.0) -> np.ndarray:
        """For k = 0..k_max guesses, what a step that sends k and has every one rejected costs beyond the
        plain step that would have made its one token."""
        return self.step_s(np.zeros(k_max), draft_s, setup_s) - float(self.verify(1))

    def step_s(self, alphas: np.ndarray, draft_s: float, setup_s: float = 0.0) -> np.ndarray:
        """Expected seconds of a step that sends the first k of these guesses, for k = 0..len(alphas):
        drafting (setup_s before the first guess: a draft catching up), verifying k + 1 positions, and
        taking back what is rejected."""
        ks = np.arange(0, len(alphas) + 1)
        seconds = ks * draft_s + self.verify(ks + 1) + np.where(ks > 0, setup_s, 0.0)
        if self.rollback is None:
            return seconds
        r = self.rollback
        # The first rejection at guess j (each before it accepted): restore, then decode the pending
        # token and the j accepted guesses again.
        reach = np.concatenate([[1.0], np.cumprod(alphas)])[:-1]
        stop = reach * (1 - np.asarray(alphas, dtype=np.float64))
        taken_back = np.concatenate([[0.0], np.cumsum(stop * (r.restore_s + self.verify(ks[:-1] + 1)))])
        return seconds + np.where(ks > r.free_depth, r.save_s + taken_back, 0.0)


def best_length(alphas: np.ndarray, cost: CostCurve, draft_s: float,
                max_loss: float = float("inf"), setup_s: float = 0.0) -> tuple[int, float]:
    """How many of the offered guesses (0..len(alphas)) to send, and the expected tokens per second
    then, when guess j is accepted with probability alphas[j] given that those before it were. Only
    lengths that the loss budget lets a step risk, where `max_loss` is the step's allowance (`affordable`)."""
    alphas = np.asarray(alphas, dtype=np.float64)
    tokens = np.concatenate([[1.0], 1.0 + np.cumsum(np.cumprod(alphas))])
    rate = tokens / cost.step_s(alphas, draft_s, setup_s)
    first = float(alphas[0]) if len(alphas) else 0.0
    # (length 0 loses nothing: always affordable)
    rate[~affordable(cost.worst_loss(len(alphas), draft_s, setup_s), first, max_loss, cost)] = -np.inf
    best = int(rate.argmax())
    return best, float(rate[best])


def best_k(alpha: float, k_max: int, cost: CostCurve, draft_s: float,
           max_loss: float = float("inf"), setup_s: float = 0.0) -> tuple[int, float]:
    """The number of guesses (0..k_max), each accepted with probability alpha, that maximizes
    expected tokens per second, and that rate."""
    return best_length(np.full(max(0, k_max), alpha), cost, draft_s, max_loss, setup_s)


def rate_bound(alphas: Sequence[float], cost: CostCurve, draft_s: float) -> float:
    """At least the rate `best_length` finds with one guess or more, at any loss bound and catch-up: the tokens
    k guesses make over the step's drafting and verifying, with nothing taken back. In floats, where best_length's
    arrays cost tens of microseconds, so that auto can rule a guess out at every step for almost nothing."""
    best, tokens, reach = 0.0, 1.0, 1.0
    for k, alpha in enumerate(alphas, 1):
        reach *= float(alpha)
        tokens += reach
        best = max(best, tokens / (k * draft_s + float(cost.verify(k + 1))))
    return best


def could_pay(alpha: float, k_max: int, cost: CostCurve, draft_s: float) -> bool:
    """Whether guesses drafted at draft_s a token and accepted with probability alpha beat a plain step at some
    length up to k_max, with nothing to catch up first."""
    return best_k(alpha, k_max, cost, draft_s)[1] > 1.0 / float(cost.verify(1))


def tree_tokens(branches: Sequence[np.ndarray]) -> float:
    """Expected tokens of a step that verifies these copies as one tree, branch b's guess j accepted with
    probability branches[b][j] given those before it. The branches' first tokens differ and cannot both be
    right, so their chances are shares of one: estimated each as if its branch were sent alone, they are
    scaled down where they sum to more than one."""
    reach = [np.cumprod(alphas) for alphas in branches]
    scale = min(1.0, 1.0 / sum(float(r[0]) for r in reach))
    return 1.0 + scale * sum(float(r.sum()) for r in reach)


def tree_rate(branches: Sequence[np.ndarray], cost: CostCurve, max_loss: float = float("inf")) -> float:
    """Expected tokens per second of verifying these branches as one tree (see tree_tokens): one step over
    all their nodes. -inf where the loss budget does not let a step risk it, `max_loss` being the step's
    allowance (`affordable`; the branches' first tokens differ, so their chances add up)."""
    nodes = sum(len(alphas) for alphas in branches)
    first = min(1.0, sum(float(alphas[0]) for alphas in branches))
    if not affordable(cost.worst_loss(nodes, 0.0)[-1:], first, max_loss, cost)[0]:
        return -np.inf
    return tree_tokens(branches) / float(cost.verify(1 + nodes))


class Drafting(NamedTuple):
    """A drafter chosen for this step: how many guesses, the rate they make, and what catching up costs first."""

    name: str
    n: int
    rate: float
    catch_up_s: float


def best_drafter(alphas: Mapping[str, float], behind: Callable[[str], int], k_max: int, cost: CostCurve,
                 max_loss: float, best: float) -> Drafting | None:
    """Of the drafting models (by name, each with its per-token acceptance), the one whose best number of
    guesses makes the highest rate (of equals, the first), if that beats `best`, the best other choice's.
    A draft left idle reads the tokens committed since it last ran before it guesses: `behind(name)` of them,
    asked only of a drafter that would pay without. None where none beats it."""
    choice = None
    for name, alpha in alphas.items():
        draft_s = cost.token_s(name)
        if rate_bound([alpha] * k_max, cost, draft_s) <= best or best_k(alpha, k_max, cost, draft_s, max_loss)[1] <= best:
            continue
        setup_s = cost.catch_up_s(name, behind(name))
        n, rate = best_k(alpha, k_max, cost, draft_s, max_loss, setup_s)
        if n and rate > best:
            best, choice = rate, Drafting(name, n, rate, setup_s)
    return choice


def tree_beats(branches: Sequence[np.ndarray], cost: CostCurve, max_loss: float, best: float) -> float | None:
    """The rate of verifying these branches as one tree (see tree_rate), where there are two or more and it
    beats `best`, the best single guess's; else None."""
    rate = tree_rate(branches, cost, max_loss) if len(branches) > 1 else -np.inf
    return rate if rate > best else None


def keep_drafting(confidences: list[float], cost: CostCurve, draft_s: float | None = None) -> bool:
    """After drafting len(confidences) tokens whose draft probabilities were `confidences`: is
    one more worth its cost? The draft's own probability is a free estimate of acceptance, so
    the expected tokens so far are 1 + q1 + q1 q2 + ..., and the next guess adds about
    prod(q) * q_last more. `draft_s`: one drafted token (default: the draft model's)."""
    k = len(confidences)
    alphas = np.array([*confidences, confidences[-1]], dtype=np.float64)
    tokens = 1 + np.cumsum(np.cumprod(alphas))
    seconds = cost.step_s(alphas, cost.draft_s if draft_s is None else draft_s)
    return bool(tokens[k] / seconds[k + 1] > tokens[k - 1] / seconds[k])


@dataclass
class Acceptance:
    """A running estimate of per-position acceptance that forgets slowly (the text changes)."""

    accepted: float = 1.0  # the prior: by default a weak one of one accept and one reject
    judged: float = 2.0
    decay: float = 0.98

    def __post_init__(self) -> None:
        self._prior = (self.accepted, self.judged)

    @property
    def alpha(self) -> float:
        return self.accepted / self.judged

    def observe(self, n_accepted: int, rejected: bool) -> None:
        self.accepted = self.accepted * self.decay + n_accepted
        self.judged = self.judged * self.decay + n_accepted + int(rejected)

    def relax(self, weight: float = 0.01) -> None:
        """Drift a little towards the prior, so that an option ruled out is retried now and then."""
        self.accepted += weight * (self._prior[0] - self.accepted)
        self.judged += weight * (self._prior[1] - self.judged)


# A copied guess lands more often the longer the match behind it: MATCH_BUCKETS are the upper ends of
# the match lengths that share an estimate; longer matches share one more bucket.
MATCH_BUCKETS = (1, 2, 3, 5, 8, 12, 20)


@dataclass(frozen=True)
class Priors:
    """What auto believes before a conversation's own steps teach it. The class's own values are the
    hand-set ones of before (the hit rates of the longest earlier match on bench/prompts.jsonl's answers);
    PRIORS, which auto uses, are fitted on the fit fold of bench/corpus.jsonl, for greedy and for sampled
    answers apart: sampled copies hold less often."""

    match: tuple[float, ...] = (0.25, 0.6, 0.75, 0.85, 0.85, 0.85, 0.85, 0.85)  # per bucket, a copy from afar
    near: float = 0.6  # at least this for a copy that goes on where the last one left off, or after an edit
    weight: float = 4.0  # how many guesses' evidence a prior is worth
    drafter: float = 0.5  # a drafting model's per-token acceptance
    decay: float = 0.98  # how fast old evidence fades (the text changes)


def estimates(priors: Priors, drafters: Iterable[str]) -> tuple[dict[str, MatchAcceptance], dict[str, Acceptance]]:
    """Fresh estimates on these priors: for copies from the context, one per kind of match ("far", "near",
    "substitute"; the last two at least `near`), and one per drafting model."""
    p = priors
    lookup = {"far": MatchAcceptance(priors=p), "near": MatchAcceptance(p.near, p), "substitute": MatchAcceptance(p.near, p)}
    return lookup, {name: Acceptance(p.weight * p.drafter, p.weight, p.decay) for name in drafters}


# By greedy; Priors() are the hand-set values they replace. `bench/corpus fit` on the fit fold (70 greedy
# and 70 sampled answers, three cost curves) printed these.
PRIORS = {True: Priors(match=(0.1, 0.4, 0.4, 0.9, 0.9, 0.9, 0.9, 0.9), near=0.6, weight=8.0, drafter=0.8, decay=0.995),
          False: Priors(match=(0.1, 0.4, 0.4, 0.85, 0.85, 0.85, 0.85, 0.85), near=0.3, weight=4.0, drafter=0.5,
                        decay=0.98)}


@dataclass(frozen=True)
class PlaceShift:
    """What a copy's place says of it beyond its match length, as a shift of its estimate in log-odds: a logistic
    model's weights for three signals, fitted with one intercept per match length on the corpus's fit fold
    (`bench/corpus signals` prints them), and the fit fold's means, where the shift is 0. Auto's estimates,
    learnt online per match length, follow what holds in this answer on average; these vary from copy to copy:
    the share of the earlier places that match as long and go on with the copied token (where they disagree, the
    copy is a guess among several), whether it copies from the prompt, and how far back (log tokens)."""

    weights: tuple[float, float, float]
    means: tuple[float, float, float]

    def shift(self, agree: float, from_prompt: bool, back: int) -> float:
        values = (agree, float(from_prompt), math.log(back))
        return sum(w * (v - m) for w, v, m in zip(self.weights, values, self.means))


def log_odds(p: np.ndarray | float) -> np.ndarray:
    """A probability's log-odds, kept finite (clipped to 0.001..0.999)."""
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-3, 1 - 1e-3)
    return np.log(p / (1 - p))


def from_log_odds(z: np.ndarray) -> np.ndarray:
    """The probability of these log-odds (the inverse of log_odds, unclipped)."""
    return 1 / (1 + np.exp(-z))


def shifted(alphas: np.ndarray, shift: float) -> np.ndarray:
    """Acceptances moved by `shift` in log-odds."""
    return from_log_odds(log_odds(alphas) + shift)


# By greedy. Sampled answers are not shifted: replayed on the held-out fold, the shift fitted for them gained nothing
# on any curve and cost the worst answer on Apple's (0.98x to 0.96x); on greedy ones it took edits on this kind of
# CPU from 1.52x to 1.63x and cost no curve its worst answer (bench/results/signals.txt).
PLACE_SHIFTS: dict[bool, PlaceShift | None] = {True: PlaceShift((1.872, 0.301, 0.145), (0.848, 0.695, 4.087)),
                                                False: None}


def match_bucket(m: int) -> int:
    """The index of the MATCH_BUCKETS bucket that a match of m tokens falls in."""
    return bisect.bisect_left(MATCH_BUCKETS, m)


class MatchAcceptance:
    """Per-position acceptance of copied guesses, by the length of the match behind each one.

    Each landed guess lengthens the match for the next, so a guess deep in a long copy is judged
    by long-match evidence and a fresh 1-token match by short-match evidence: a proposal earns
    its length token by token, instead of from one average that mixes copies with paraphrase.
    `floor` raises the priors for matches that are likelier than their length says (copying on
    where the last guess left off)."""

    def __init__(self, floor: float = 0.0, priors: Priors = Priors()) -> None:
        self.buckets = [Acceptance(priors.weight * max(a, floor), priors.weight, priors.decay) for a in priors.match]

    def _bucket(self, m: int) -> Acceptance:
        return self.buckets[match_bucket(m)]

    def alphas(self, m: int, k: int) -> np.ndarray:
        """Acceptance of guesses 1..k copied after an m-token match (the j-th follows m + j - 1)."""
        return np.array([self._bucket(m + j).alpha for j in range(k)])

    def observe(self, m: int, drafted: int, accepted: int) -> None:
        for j in range(accepted):
            self._bucket(m + j).observe(1, False)
        if accepted < drafted:
            self._bucket(m + accepted).observe(0, True)

    def relax(self) -> None:
        for estimate in self.buckets:
            estimate.relax()


# The loss budget: what auto may lose against plain decoding. An answer's account opens with START_STEPS plain
# steps of room (at least one wrong single guess, so that guessing can begin) and earns LOSS_BUDGET of every
# token's plain cost on top of what its guesses gained. A step's worst case (every guess rejected) happens only
# when its first guess is rejected, so the budget weighs it by that chance, MISS_MARGIN times over (the estimate
# may be that many times too sure), and no step may overrun the allowance by more than the room an answer opens
# with (`affordable`). Counting every worst case in full instead held sure copies back after a single miss: on
# a 2-core EPYC a 120-token edit then sent nothing for 26 steps of copies estimated at 0.93-0.96 to hold.
# An N-token answer whose every guess failed ends within LOSS_BUDGET plus twice the opening room over N of
# plain decoding (one overrun, after which the account allows nothing until it has earned its way back); one
# whose guesses failed only as often as estimated, within about LOSS_BUDGET + START_STEPS / N: 5% at 20 tokens.
LOSS_BUDGET = 0.02
START_STEPS = 20 * (0.05 - LOSS_BUDGET)
# Chosen on the corpus's fit fold (4, 6 and 8 replayed on five curves): 8 kept the gain on edits that 4 gave and
# held the worst answer 0.01-0.03x higher; the held-out fold agreed (docs/results.md).
MISS_MARGIN = 8.0


def opening_s(cost: CostCurve) -> float:
    """The room an answer's account opens with, in the curve's terms: START_STEPS plain steps, or one
    wrong single guess where that costs more, so that guessing can begin."""
    # One wrong guess's cost beyond a plain step, as spent_s prices it (worst_loss's arrays: 0.15 ms a step).
    return max(START_STEPS * float(cost.verify(1)), cost.spent_s(1, 0, 0.0) - float(cost.verify(1)))


def affordable(worst: np.ndarray, first: float, allow: float, cost: CostCurve) -> np.ndarray:
    """Which of these worst cases (seconds beyond a plain step) a step may risk with `allow` left in its
    account, where its first guess holds with chance `first`: the worst case, weighed by MISS_MARGIN times
    the chance of that miss, fits the allowance, and the worst case itself overruns it by no more than the
    room an answer opens with. An empty account risks nothing, however sure the guess: so an answer overruns
    its allowance once at most before it has earned its way back."""
    weighed = worst * min(1.0, MISS_MARGIN * (1.0 - first))
    return (worst <= 0) | ((allow > 0) & (weighed <= allow) & (worst <= allow + opening_s(cost)))


@dataclass
class LossAccount:
    """Seconds that guessing has gained over plain decoding (negative: lost), for one answer and for the
    whole conversation. A guess is sent only if the lower of their allowances can afford it (`affordable`), so
    no answer can end more than about LOSS_BUDGET slower than plain decoding, and one overrun of the room it
    opens with at worst; once guesses have paid, the gain itself is what further guesses may risk."""

    gained: float = 0.0  # this answer
    plain: float = 0.0  # what plain decoding would have spent on this answer's tokens
    total_gained: float = 0.0  # the conversation
    total_plain: float = 0.0

    def start(self) -> None:
        """A new answer: its own account opens; the conversation's carries on."""
        self.gained = self.plain = 0.0

    def allowance(self, start_s: float) -> float:
        """The most the next step may lose against a plain step, in seconds, where each account opened with
        start_s of room."""
        answer = self.gained + LOSS_BUDGET * self.plain + start_s
        conversation = self.total_gained + LOSS_BUDGET * self.total_plain + start_s
        return max(0.0, min(answer, conversation))

    def settle(self, tokens: int, seconds: float, plain_s: float) -> None:
        """A step that made `tokens` tokens in `seconds`, where a plain step costs plain_s."""
        for_plain = tokens * plain_s
        self.gained += for_plain - seconds
        self.plain += for_plain
        self.total_gained += for_plain - seconds
        self.total_plain += for_plain


class Clock:
    """How much dearer than the curve plain steps run by the clock now: the median, over recent plain steps,
    of a step's measured time (proposing, verifying, handing the token on) over the curve's figure. The curve
    is the fastest of its measurements, kept apart from a busy moment's; this ratio is what the moment adds,
    measured where auto decides, so that the account can settle each step at its real time against plain
    decoding timed alike. 1 until a plain step is seen."""

    def __init__(self, size: int = 16) -> None:
        self._ratios: deque[float] = deque(maxlen=size)
        self.ratio = 1.0

    def plain(self, span_s: float, curve_s: float) -> None:
        """A plain step that took span_s where the curve says curve_s."""
        self._ratios.append(span_s / curve_s)
        self.ratio = statistics.median(self._ratios)


def step_allowance(account: LossAccount, cost: CostCurve, ratio: float) -> float:
    """What the next step may lose at worst, in the curve's terms: the account is in seconds by the clock
    (under a seed, by the curve: `ratio` 1), and the curve prices a worst case in its own, so by the ratio
    between (the clock's)."""
    return account.allowance(ratio * opening_s(cost)) / ratio


def settle_step(account: LossAccount, clock: Clock, cost: CostCurve, drafted: int, accepted: int, draft_s: float,
                span_s: float | None) -> None:
    """A step that sent `drafted` guesses (drafting them took draft_s) and kept `accepted`, settled in the
    account: by the clock where its span is known (a plain step is plain decoding: it settles even, and
    times the clock), else by the curve."""
    plain_s = float(cost.verify(1))
    seconds = cost.spent_s(drafted, accepted, draft_s)
    if span_s is not None:
        if not drafted:
            clock.plain(span_s, plain_s)
        plain_s *= clock.ratio
        seconds = span_s if drafted else plain_s
    account.settle(accepted + 1, seconds, plain_s)
