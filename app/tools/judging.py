"""Auto judged on recorded answers: each replayed as a fresh conversation builds it, with the draft model
as it guessed when the answer was recorded, against plain decoding and the oracle.
"""

from __future__ import annotations

import contextlib
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterable, Mapping, Sequence
from unittest import mock

import numpy as np

from specchat.decoding import policy
from specchat.decoding.events import DRAFTERS, Step
from specchat.decoding.guessers import AutoGuesser, BaseGuesser, LookupGuesser, Proposal
from specchat.decoding.policy import PLACE_SHIFTS, PRIORS, CostCurve, PlaceShift, Priors
from specchat.decoding.sampling import SamplingConfig
from specchat.llama.session import reusable
from specchat.tools.recorded import Answer
from specchat.tools.replay import oracle, replay


class RecordedDraft(BaseGuesser):
    """The draft model as it guessed on a recorded greedy answer: at answer position i its guess given the
    true text, which is what it sees while its earlier guesses hold (after a miss, the step ends anyway).
    Its cache is followed as the real draft's is, so that catching up after idle steps is charged as the
    engine pays it (the proposal's sync_s, by the curve)."""

    name = "draft"
    default_draft_length = 4

    def __init__(self, answer: Answer, curve: CostCurve) -> None:
        self.start, self.guess, self.p, self.curve = len(answer.prompt), answer.draft_guess, answer.draft_p, curve
        self.keep_going: Callable[[list[float]], bool] | None = None
        self._read: list[int] = []  # what its cache holds

    def prepare(self, context: Sequence[int]) -> None:
        self._read = list(context)

    def behind(self, context: Sequence[int]) -> int:
        return len(context) - reusable(self._read, context)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        sync_s = self.curve.catch_up_s("draft", self.behind(context))
        at = len(context) - self.start
        tokens: list[int] = []
        for j in range(min(k, len(self.guess) - at)):
            tokens.append(self.guess[at + j])
            if self.keep_going is not None and not self.keep_going(list(self.p[at:at + j + 1])):
                break
        self._read = [*context, *tokens[:-1]]  # each guess but the last went through its cache
        return Proposal(tokens, None, "draft", sync_s)


def auto_for(answer: Answer, curve: CostCurve, priors: Priors | None = None,
             piece: Callable[[int], bytes] | None = None,
             places: Mapping[bool, PlaceShift | None] = PLACE_SHIFTS) -> AutoGuesser:
    """Auto as a fresh conversation builds it, with the recorded draft where there is one (greedy only: a
    sampled draft's fate depends on both distributions, which are not recorded), on these priors (None:
    the defaults), with the target's token bytes where the caller has its model (`piece`), as the live
    registry passes them, and with these shifts by a copy's place (`places`: auto's own by default)."""
    drafters = {"draft": RecordedDraft(answer, curve)} if answer.draft_guess and answer.temperature == 0 else {}
    return AutoGuesser(curve, drafters, piece=piece, priors=PRIORS if priors is None else {True: priors, False: priors},
                       places=places)


@dataclass(frozen=True)
class Judged:
    """Plain, auto and the oracle on some answers: seconds summed, and each answer's auto speedup."""

    plain_s: float
    auto_s: float
    oracle_s: float
    worst: float  # the slowest answer's auto speedup
    answers: int

    @property
    def auto(self) -> float:
        return self.plain_s / self.auto_s

    @property
    def bound(self) -> float:
        return self.plain_s / self.oracle_s

    @property
    def share(self) -> float | None:
        """Auto's share of the oracle's gain over plain decoding (None where the oracle gains nothing)."""
        gain = self.bound - 1
        return (self.auto - 1) / gain if gain > 1e-9 else None


def judge(answers: Iterable[Answer], curve: CostCurve, priors: Priors | None = None, bound: bool = True,
          places: Mapping[bool, PlaceShift | None] = PLACE_SHIFTS, piece: Callable[[int], bytes] | None = None) -> Judged:
    """Each answer replayed as a fresh conversation under auto on these priors and shifts by a copy's place, with
    the target's token bytes where given (`piece`, as the live registry passes them), against plain decoding and
    (where `bound`) the oracle."""
    plain_s = auto_s = oracle_s = 0.0
    worst, n = float("inf"), 0
    for a in answers:
        plain = float(curve.verify(1)) * len(a.answer)
        auto, _ = replay(a, curve, auto_for(a, curve, priors, piece, places))
        plain_s, auto_s, oracle_s = plain_s + plain, auto_s + auto, oracle_s + (oracle(a, curve) if bound else 0.0)
        worst, n = min(worst, plain / auto), n + 1
    return Judged(plain_s, auto_s, oracle_s, worst if n else 1.0, n)


def clock_curve(steps: Sequence[Step], like: CostCurve, least: int = 3) -> CostCurve:
    """What these steps cost by the clock, as a curve to price a replay by: per number of positions verified, the
    mean seconds of the steps that verified that many, with what proposing took (every step pays it, a plain one
    too); per drafted token, the mean over drafting steps. A size seen fewer than `least` times is `like`'s, scaled
    by the median of the seen sizes' ratios to it. No rollback: a size's mean already holds what taking back cost."""
    by_size: dict[int, list[float]] = defaultdict(list)
    per_token: dict[str, list[float]] = defaultdict(list)
    for step in steps:
        token_s = step.drafted_token_s
        by_size[step.drafted + 1].append(step.verify_s + (step.draft_s if token_s is None else 0.0))
        if token_s is not None:
            per_token[step.guesser].append(token_s)
    seen = {n: statistics.fmean(times) for n, times in by_size.items() if len(times) >= least and n <= len(like.verify_s)}
    scale = statistics.median(seconds / like.verify_s[n - 1] for n, seconds in seen.items()) if seen else 1.0
    table = [seen.get(n, scale * seconds) for n, seconds in enumerate(like.verify_s, 1)]
    token = {name: statistics.fmean(per_token[name]) if per_token[name] else scale * like.token_s(name)
             for name in DRAFTERS}
    return CostCurve(table, token["draft"], token["mtp"])


def by_clock(answers: Sequence[Answer], decide: CostCurve, charged: CostCurve, plain_step_s: float,
             piece: Callable[[int], bytes] | None = None) -> float:
    """Auto's speedup over plain decoding on these answers, each replayed as a fresh conversation that decides by
    `decide` (the curve live auto ran on) and pays for every step what such steps cost by the clock (`charged`,
    a `clock_curve`), against plain decoding at plain_step_s a token, timed alike."""
    auto_s = sum(replay(a, charged, auto_for(a, decide, piece=piece))[0] for a in answers)
    return plain_step_s * sum(len(a.answer) for a in answers) / auto_s


# The fixed choices auto is judged against (issue 41's regret): plain decoding, and lookup and the draft at a small
# grid of lengths, each sending as many guesses as it has every step, whatever happened before.
FIXED_LENGTHS = {"lookup": (1, 2, 4, 8, 16), "draft": (1, 2, 3, 4)}


def fixed_choice(name: str, k: int, answer: Answer, curve: CostCurve) -> BaseGuesser | None:
    """The guesser that always sends up to k guesses of `name` ("lookup" or "draft"); None where the answer
    cannot replay it (no draft recorded: sampled answers)."""
    if name == "draft":
        if not answer.draft_guess or answer.temperature != 0:
            return None
        guesser: BaseGuesser = RecordedDraft(answer, curve)
    else:
        guesser = LookupGuesser()
    guesser.default_draft_length = k  # an instance's own length: the replay sends that many where it can
    return guesser


def fixed_speedups(answers: Sequence[Answer], curve: CostCurve) -> dict[str, float]:
    """Each fixed choice's speedup over plain decoding on these answers, seconds summed ("plain": 1), by name
    ("lookup k=4"); a choice some answer cannot replay is left out."""
    plain_s = sum(float(curve.verify(1)) * len(a.answer) for a in answers)
    found = {"plain": 1.0}
    for name, lengths in FIXED_LENGTHS.items():
        for k in lengths:
            guessers = [fixed_choice(name, k, a, curve) for a in answers]
            if answers and all(g is not None for g in guessers):
                found[f"{name} k={k}"] = plain_s / sum(replay(a, curve, g)[0] for a, g in zip(answers, guessers))
    return found


# The loss budget's settings that benches replay auto under, by label: what each changes of policy's LOSS_BUDGET,
# START_STEPS and MISS_MARGIN, the rest as the package has them. "Worst cases in full" is the budget before
# 2026-12-07, which counted every guess's worst case whatever the chance of its first miss.
BUDGETS: dict[str, dict[str, float]] = {
    "as it is": {},
    "worst cases in full": {"MISS_MARGIN": 1e9},
    "2 plain steps to open with": {"START_STEPS": 2.0},
    "4%": {"LOSS_BUDGET": 0.04},
    "4%, 0.2 plain steps to open with": {"LOSS_BUDGET": 0.04, "START_STEPS": 0.2},
    "no budget": {"LOSS_BUDGET": 1.0, "START_STEPS": 100.0},
}


def budget_as(changes: Mapping[str, float]) -> ContextManager[object]:
    """While the block runs, the loss budget with these of its settings changed: policy's module constants, which
    the account reads at every step. A what-if for benches, live or replayed; never for the engine."""
    return mock.patch.multiple(policy, **changes) if changes else contextlib.nullcontext()
