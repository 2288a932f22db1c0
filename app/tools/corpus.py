"""Recorded answers, and auto replayed on them: how much of the oracle's gain a controller takes on text
it was not tuned on, on any cost curve, without timing noise.

`record` has the target answer each prompt of a corpus plainly (greedy, and sampled) and keeps, per answer
position, what the draft model would have guessed there and how sure each model was. Every guess's fate
can then be read off the text: a copy or a greedy draft is kept while it equals the answer, and at T > 0 a
copied token is kept exactly when it equals the token sampled there (the exact rule keeps a point-mass
guess x with probability p(x), and the residual never gives x: "kept" and "sampled x" are one event). So
`replay` runs the real AutoGuesser over a recorded answer, step by step, costed on a curve.

Each prompt falls in one of two folds by a hash of its text: priors are fitted on "fit" and every figure
that judges them is quoted on "held-out".
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from specchat.decoding.guessers import AutoGuesser, BaseGuesser, Guesser, Proposal
from specchat.decoding.policy import PRIORS, CostCurve, Priors
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.tools.replay import accepted

FOLDS = ("fit", "held-out")


def fold(prompt: str) -> str:
    """The prompt's fold, fixed by its text: the same on every machine and in every run."""
    return FOLDS[hashlib.sha256(prompt.encode("utf-8")).digest()[0] % 2]


@dataclass(frozen=True)
class Answer:
    """One recorded answer: the prompt's tokens, the target's answer, and per answer position the draft's
    greedy guess and its probability (empty where no draft was recorded) and the target's probability of its
    most likely token there, at T = 1 (its confidence; empty where not recorded)."""

    task: str
    fold: str
    temperature: float
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    draft_guess: tuple[int, ...] = ()
    draft_p: tuple[float, ...] = ()
    target_p: tuple[float, ...] = ()

    @property
    def seq(self) -> list[int]:
        return [*self.prompt, *self.answer]

    def to_json(self) -> str:
        return json.dumps({"task": self.task, "fold": self.fold, "temperature": self.temperature,
                           "prompt": self.prompt, "answer": self.answer, "draft_guess": self.draft_guess,
                           "draft_p": [round(p, 4) for p in self.draft_p],
                           "target_p": [round(p, 4) for p in self.target_p]})


def load_answers(path: Path) -> list[Answer]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecchatError(f"cannot read recorded answers {path}: {e.strerror} (record them with bench/corpus record)")
    answers = []
    for n, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            answers.append(Answer(d["task"], d["fold"], float(d["temperature"]), tuple(d["prompt"]),
                                  tuple(d["answer"]), tuple(d.get("draft_guess", ())), tuple(d.get("draft_p", ())),
                                  tuple(d.get("target_p", ()))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise SpecchatError(f"{path}:{n}: not a recorded answer ({e}); record again with bench/corpus record")
    return answers


def draft_guesses(model, prompt: Sequence[int], answer: Sequence[int]) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
    """The model's greedy guess at every answer position given the true text before it, and its probability
    (for the target, the second is its confidence at each position)."""
    session = model.session
    session.prefill(list(prompt))
    logits = np.asarray(session.decode([prompt[-1], *answer[:-1]], "all"), dtype=np.float64)
    session.rewind(len(prompt) - 1)
    top = logits.max(-1, keepdims=True)
    p = 1.0 / np.exp(logits - top).sum(-1)
    return logits.argmax(-1).tolist(), p.tolist()


# --- replay ----------------------------------------------------------------------------------------


class RecordedDraft(BaseGuesser):
    """The draft model as it guessed on a recorded greedy answer: at answer position i its guess given the
    true text, which is what it sees while its earlier guesses hold (after a miss, the step ends anyway)."""

    name = "draft"
    default_draft_length = 4

    def __init__(self, answer: Answer) -> None:
        self.start, self.guess, self.p = len(answer.prompt), answer.draft_guess, answer.draft_p
        self.keep_going: Callable[[list[float]], bool] | None = None

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        at = len(context) - self.start
        tokens: list[int] = []
        for j in range(min(k, len(self.guess) - at)):
            tokens.append(self.guess[at + j])
            if self.keep_going is not None and not self.keep_going(list(self.p[at:at + j + 1])):
                break
        return Proposal(tokens, None, "draft")


def auto_for(answer: Answer, curve: CostCurve, priors: Priors | None = None) -> AutoGuesser:
    """Auto as a fresh conversation builds it, with the recorded draft where there is one (greedy only: a
    sampled draft's fate depends on both distributions, which are not recorded), on these priors (None:
    the defaults)."""
    drafters = {"draft": RecordedDraft(answer)} if answer.draft_guess and answer.temperature == 0 else {}
    return AutoGuesser(curve, drafters, priors=PRIORS if priors is None else {True: priors, False: priors})


def replay(answer: Answer, curve: CostCurve, guesser: Guesser) -> tuple[float, int]:
    """Seconds the answer takes under the guesser's choices, every step costed by the curve, and steps.
    The guesser learns as it would live; under a seed, so its account is by the curve too."""
    seq, start = answer.seq, len(answer.prompt)
    sampling = SamplingConfig(answer.temperature, seed=0)
    rng = np.random.default_rng(0)
    guesser.prepare(seq[:start])
    i, seconds, steps = start, 0.0, 0
    while i < len(seq):
        guess = guesser.propose(seq[:i], min(guesser.default_draft_length, len(seq) - i - 1), sampling, rng)
        r = accepted(guess.tokens, seq, i)
        drafting = len(guess.tokens) * curve.token_s(guess.guesser) if guess.guesser in ("draft", "mtp") else 0.0
        step = curve.spent_s(len(guess.tokens), r, drafting)
        guesser.observe(len(guess.tokens), r, drafting)
        seconds += step
        i += r + 1
        steps += 1
    return seconds, steps


def longest_copy(seq: Sequence[int], i: int, cap: int = 64) -> int:
    """How many of the tokens from seq[i] on the best copy of the text before i would have guessed: the
    longest run of them that stands anywhere earlier (ending before i, where a copy can read it)."""
    arr = np.asarray(seq, dtype=np.int64)
    starts = np.flatnonzero(arr[:i] == arr[i]) if i < len(arr) else np.zeros(0, np.int64)
    best = 0
    for j in starts:  # vectorizing over starts buys little: a text has few earlier places per token
        n = min(cap, i - j, len(arr) - i)
        same = arr[j:j + n] == arr[i:i + n]
        best = max(best, n if same.all() else int(same.argmin()))
    return best


def oracle(answer: Answer, curve: CostCurve, draft: bool = True) -> float:
    """Seconds for a controller that knows, at every step, the longest run of upcoming tokens that any copy
    of earlier text would guess and how many of the draft model's guesses the target will keep, and sends
    whichever costs least per token (nothing if none pays). It sees the future but chooses step by step, so
    it is the yardstick auto's share is measured against, not a proof that nothing could do better."""
    seq, start = answer.seq, len(answer.prompt)
    use_draft = draft and bool(answer.draft_guess) and answer.temperature == 0
    i, seconds = start, 0.0
    plain = float(curve.verify(1))
    while i < len(seq):
        best_per_token, best = plain, (plain, 0)
        r = longest_copy(seq, i)
        for j in range(1, r + 1):
            cost = float(curve.verify(j + 1))
            if cost / (j + 1) < best_per_token:
                best_per_token, best = cost / (j + 1), (cost, j)
        if use_draft:
            at = i - start
            r = accepted(answer.draft_guess[at:at + 16], seq, i)
            for j in range(1, r + 1):
                cost = j * curve.draft_s + float(curve.verify(j + 1))
                if cost / (j + 1) < best_per_token:
                    best_per_token, best = cost / (j + 1), (cost, j)
        seconds += best[0]
        i += best[1] + 1
    return seconds


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


def judge(answers: Iterable[Answer], curve: CostCurve, priors: Priors | None = None, bound: bool = True) -> Judged:
    """Each answer replayed as a fresh conversation under auto on these priors, against plain decoding and
    (where `bound`) the oracle."""
    plain_s = auto_s = oracle_s = 0.0
    worst, n = float("inf"), 0
    for a in answers:
        plain = float(curve.verify(1)) * len(a.answer)
        auto, _ = replay(a, curve, auto_for(a, curve, priors))
        plain_s, auto_s, oracle_s = plain_s + plain, auto_s + auto, oracle_s + (oracle(a, curve) if bound else 0.0)
        worst, n = min(worst, plain / auto), n + 1
    return Judged(plain_s, auto_s, oracle_s, worst if n else 1.0, n)


# The values each prior may take while fitting, and which match-length buckets move together (a short
# match, 2 to 3 tokens, and longer): a coarse grid over few values finds what the fold prefers and keeps
# the fit from learning what is only noise in it.
GRID = {"short": (0.1, 0.25, 0.4, 0.55, 0.7, 0.85), "mid": (0.4, 0.55, 0.7, 0.8, 0.9, 0.95),
        "long": (0.7, 0.8, 0.85, 0.9, 0.95, 0.98), "near": (0.3, 0.45, 0.6, 0.75, 0.9),
        "weight": (1.0, 2.0, 4.0, 8.0, 16.0), "drafter": (0.3, 0.5, 0.65, 0.8, 0.9), "decay": (0.9, 0.95, 0.98, 0.995)}
BUCKETS = {"short": (0,), "mid": (1, 2), "long": (3, 4, 5, 6, 7)}


def with_value(p: Priors, name: str, value: float) -> Priors:
    """The priors with one of GRID's values set (a bucket group sets every bucket in it)."""
    if name in BUCKETS:
        return replace(p, match=tuple(value if i in BUCKETS[name] else a for i, a in enumerate(p.match)))
    return replace(p, **{name: value})


_fitting: tuple[list[Answer], list[CostCurve]] = ([], [])


def _cost(p: Priors) -> float:
    """Auto's time on the answers being fitted, as a share of plain decoding's, summed over the curves."""
    answers, curves = _fitting
    return sum(j.auto_s / j.plain_s for j in (judge(answers, c, p, bound=False) for c in curves))


def _start_fitting(answers: list[Answer], curves: list[CostCurve]) -> None:
    global _fitting
    _fitting = answers, curves


def fit_priors(answers: Sequence[Answer], curves: Sequence[CostCurve], start: Priors, fields: Sequence[str],
               rounds: int = 2, say: Callable[[str], None] = lambda line: None) -> Priors:
    """Coordinate descent over GRID: the priors under which auto decodes `answers` fastest, the time on each
    curve taken as a share of plain decoding's there (so that no curve's seconds outweigh another's). The
    grid's values for one field are tried in parallel, one process a core."""
    with ProcessPoolExecutor(os.cpu_count(), initializer=_start_fitting, initargs=(list(answers), list(curves))) as pool:
        best = start
        best_cost = next(pool.map(_cost, [start]))
        say(f"start {best_cost / len(curves):.4f} of plain")
        for _ in range(rounds):
            changed = False
            for name in fields:
                trials = [with_value(best, name, v) for v in GRID[name]]
                for trial, c in zip(trials, pool.map(_cost, trials)):
                    if c < best_cost - 1e-6:
                        best, best_cost, changed = trial, c, True
                say(f"{name}: {best_cost / len(curves):.4f} of plain")
            if not changed:
                break
    return best


# --- cost curves users have --------------------------------------------------------------------------


def load_curves(path: Path) -> dict[str, tuple[CostCurve, str]]:
    """Named cost curves with their sources: {name: {"verify_ratio": [...], "draft_ratio": r, "source": s}},
    each as a curve whose one position costs 1 (only ratios decide)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SpecchatError(f"cannot read cost curves {path}: {e}")
    return {name: (CostCurve(list(map(float, c["verify_ratio"])), float(c["draft_ratio"])), str(c["source"]))
            for name, c in data.items()}


def by(answers: Sequence[Answer], task: str | None = None, fold_: str | None = None,
       temperature: float | None = None) -> list[Answer]:
    return [a for a in answers if (task is None or a.task == task) and (fold_ is None or a.fold == fold_)
            and (temperature is None or a.temperature == temperature)]
