"""The chi-square test the exactness tests share, how many answers it needs to see a given error, the
exact joint distribution of a llama.cpp model's first tokens to judge sampled answers against, and the
sampled answers themselves."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import brentq
from scipy.stats import chi2, chisquare, ncx2

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import Guesser
from specchat.decoding.sampling import SamplingConfig, logits_to_probs, masked
from specchat.llama.model import Model

if TYPE_CHECKING:
    from specchat.decoding.constraint import Constraint


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of the counts against the distribution `probs` (cell for cell), the cells expected fewer
    than five times pooled into one, as the test wants."""
    counts, probs = np.asarray(counts, dtype=float).ravel(), np.asarray(probs, dtype=float).ravel()
    n = counts.sum()
    big = probs * n >= 5
    observed, wanted = counts[big], probs[big] * n
    if not big.all():  # (an empty pool would be a cell of 0 against 0)
        observed, wanted = np.append(observed, counts[~big].sum()), np.append(wanted, probs[~big].sum() * n)
    return float(chisquare(observed, wanted).pvalue)


def _noncentrality(cells: int, alpha: float, power: float) -> float:
    """The chi-square noncentrality at which a test over `cells` cells rejects at `alpha` with `power`."""
    df = cells - 1
    critical = chi2.isf(alpha, df)
    return float(brentq(lambda lam: ncx2.sf(critical, df, lam) - power, 1e-6, 1e6))


def answers_for(tv: float, cells: int, alpha: float = 1e-3, power: float = 0.9) -> int:
    """How many answers a chi-square over `cells` cells needs to reject, at `alpha` and with `power`, every
    sampler whose joint is `tv` or more (total variation) away from the target's.

    With n answers, a sampler giving q where the target gives p moves the statistic's noncentrality to
    n * sum((q - p)^2 / p). For a given total variation that sum is smallest when q moves half the mass
    by tv, in proportion to p (Cauchy-Schwarz: sum(d^2 / p) >= (sum |d|)^2 / sum p over each half), where
    it is 4 tv^2. So n = noncentrality / (4 tv^2) answers see the hardest error of that size; any other
    is seen sooner."""
    return int(np.ceil(_noncentrality(cells, alpha, power) / (4 * tv * tv)))


def detectable(n: int, cells: int, alpha: float = 1e-3, power: float = 0.9) -> float:
    """The smallest total variation that n answers see as `answers_for` does (its inverse)."""
    return float(np.sqrt(_noncentrality(cells, alpha, power) / (4 * n)))


def exact_joint(path: Path, prompt: list[int], depth: int, sampling: SamplingConfig = SamplingConfig(1.0),
                constraint: Constraint | None = None) -> dict[tuple[int, ...], float]:
    """The target's probability of every answer of `depth` tokens under `sampling` (shorter where one ends),
    each conditional from a fresh model's decode of prompt and prefix: no checkpoint, no rewind, none of
    the machinery the sampled answers go through. Under `constraint` each conditional is the target's
    masked to what the grammar allows after that prefix, from a matcher of its own that walks only the
    prefix (none of the engine's walks over guesses and back)."""
    fresh = Model(path, n_ctx=256, n_threads=1)
    try:
        def probs(prefix: tuple[int, ...]) -> np.ndarray:
            fresh.session.clear()
            logits = np.array(fresh.session.decode(prompt + list(prefix), "last")[0])
            if constraint is not None:
                matcher = constraint.start()
                matcher.consume(prefix)  # (never an end token: an answer ends there, and is no prefix)
                logits = masked(logits, matcher.allowed())
            return logits_to_probs(logits, sampling)

        joint: dict[tuple[int, ...], float] = {}
        frontier = {(): 1.0}
        for level in range(depth):
            grown = {}
            for prefix, mass in frontier.items():
                p = probs(prefix)
                for t in np.flatnonzero(p):
                    key = prefix + (int(t),)
                    (joint if fresh.is_eog(int(t)) or level == depth - 1 else grown)[key] = mass * float(p[t])
            frontier = grown
        return joint
    finally:
        fresh.close()


def total_variation(a: dict[tuple[int, ...], float], b: dict[tuple[int, ...], float]) -> float:
    return 0.5 * sum(abs(a.get(key, 0.0) - b.get(key, 0.0)) for key in a.keys() | b.keys())


def sampled_against(joint: dict[tuple[int, ...], float], answers: list[tuple[int, ...]]) -> float:
    """chi_square of the answers' counts against the exact joint (an answer it gives no chance: p = 0)."""
    cells = {answer: i for i, answer in enumerate(joint)}
    if any(answer not in cells for answer in answers):
        return 0.0
    counts = np.zeros(len(cells))
    for answer in answers:
        counts[cells[answer]] += 1
    return chi_square(counts, np.array(list(joint.values())))


@dataclass
class Sampled:
    """Answers sampled with a guesser, and which branches of the rule they took."""

    answers: list[tuple[int, ...]] = field(default_factory=list)
    rejected: int = 0
    accepted: int = 0
    bonus: int = 0  # answers made whole in one step: every guess kept, then the target's own token


def sample_answers(model: Model, guesser: Guesser, prompt: list[int], n: int, sampling: SamplingConfig,
                   max_tokens: int, draft_length: int, constraint: Constraint | None = None) -> Sampled:
    """n answers of at most max_tokens tokens, the i-th under seed i (under `constraint`'s grammar, if given)."""
    out = Sampled()
    for seed in range(n):
        config = GenerationConfig(replace(sampling, seed=seed), max_tokens=max_tokens, draft_length=draft_length,
                                  constraint=constraint)
        done = final(Engine(model, guesser).generate(prompt, config))
        out.answers.append(done.token_ids)
        out.rejected += done.stats.rejections
        out.accepted += done.stats.accepted
        out.bonus += done.stats.steps == 1 and len(done.token_ids) == max_tokens
    return out
