"""Which signals, known before the target verifies, tell whether a copied guess will hold: found on recorded
answers before any is built into auto (issue 27). Auto judges a copy by the length of the match behind it;
here a logistic model per temperature adds, one at a time, what else a live controller could know at that
moment, is fitted on the corpus's fit fold and is scored on the held-out fold by how much better than the
match length alone it predicts each guess's fate.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from specchat.decoding.guessers import BaseGuesser, Proposal
from specchat.decoding.guessers.copying import lookup_match, matches
from specchat.decoding.policy import MATCH_BUCKETS, CostCurve, best_length, from_log_odds, log_odds, match_bucket
from specchat.decoding.sampling import SamplingConfig
from specchat.tools.recorded import Answer
from specchat.tools.replay import lookup_copy, oracle

# What a controller knows at answer position i before verifying a copy of the token there:
SIGNALS = {
    "confidence": "the target's probability of its top token at the last position (T = 1)",
    "recent": "the mean of that over the last four positions",
    "run": "how many copies in a row held just before (log)",
    "copied": "the share of the answer so far that copies held for",
    "agree": "the share of the earlier places that match as long whose next token is the copied one",
    "places": "how many earlier places match as long (log)",
    "prompt": "whether the copy is from the prompt, not the answer so far",
    "distance": "how far back the copy is (log tokens)",
    "draft": "whether the draft model's greedy guess is the copied token (greedy answers only)",
}


@functools.lru_cache(maxsize=512)
def position_signals(answer: Answer, cap: int = 32) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Per answer position: each of SIGNALS as known there, the match-length bucket of the copy prompt lookup
    would send (the longest earlier match, the latest among equals; -1 where nothing matches), and whether
    that copy's token is the answer's. Needs an answer recorded with the target's confidence."""
    if len(answer.target_p) != len(answer.answer):
        raise ValueError("an answer has no recorded confidence: run bench/corpus confidence")
    seq, start, n = answer.seq, len(answer.prompt), len(answer.answer)
    conf = np.asarray(answer.target_p, dtype=np.float64)
    rows = {name: np.zeros(n) for name in SIGNALS}
    bucket, held = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=bool)
    run = hits = 0
    for at in range(n):
        i = start + at
        if at:
            rows["confidence"][at] = log_odds(conf[at - 1])
            rows["recent"][at] = log_odds(conf[max(0, at - 4):at].mean())
            rows["copied"][at] = hits / at
        rows["run"][at] = np.log1p(run)
        ends, lengths = matches(seq[:i], cap)
        if not len(ends):
            run = 0
            continue
        best = len(ends) - 1 - int(lengths[::-1].argmax())
        end = int(ends[best])
        guess = seq[end]
        bucket[at], held[at] = match_bucket(int(lengths[best])), guess == seq[i]
        longest = ends[lengths == lengths[best]]
        rows["agree"][at] = np.mean([seq[e] == guess for e in longest])
        rows["places"][at] = np.log(len(longest))
        rows["prompt"][at] = float(end < start)
        rows["distance"][at] = np.log(i - end)
        rows["draft"][at] = float(bool(answer.draft_guess) and answer.draft_guess[at] == guess)
        run, hits = (run + 1, hits + 1) if held[at] else (0, hits)
    return rows, bucket, held


@dataclass(frozen=True)
class Events:
    """One row per answer position where the text before it has an earlier match: which match-length bucket,
    each of SIGNALS, and whether the copy's token is the answer's (the fate of a first guess there)."""

    bucket: np.ndarray  # (n,) int
    signals: dict[str, np.ndarray]  # name -> (n,)
    held: np.ndarray  # (n,) bool


def copy_events(answers: Sequence[Answer]) -> Events:
    """Every answer position where prompt lookup has a copy to send, with what was known there."""
    parts = [position_signals(a) for a in answers]
    where = [bucket >= 0 for _, bucket, _ in parts]
    return Events(np.concatenate([b[w] for (_, b, _), w in zip(parts, where)]),
                  {s: np.concatenate([rows[s][w] for (rows, _, _), w in zip(parts, where)]) for s in SIGNALS},
                  np.concatenate([h[w] for (_, _, h), w in zip(parts, where)]))


def design(events: Events, signals: Sequence[str]) -> np.ndarray:
    """One intercept per match-length bucket (what auto has today), then the chosen signals."""
    onehot = np.eye(len(MATCH_BUCKETS) + 1)[events.bucket]
    return np.column_stack([onehot, *(events.signals[s] for s in signals)])


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1.0, iterations: int = 50) -> np.ndarray:
    """Weights of a logistic model by Newton's method, with a light L2 penalty so that an empty bucket
    stays finite."""
    w = np.zeros(x.shape[1])
    for _ in range(iterations):
        p = from_log_odds(x @ w)
        grad = x.T @ (p - y) + l2 * w
        hess = (x * (p * (1 - p))[:, None]).T @ x + l2 * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w


def log_loss(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    """Mean bits per event of the model's predictions."""
    p = np.clip(from_log_odds(x @ w), 1e-9, 1 - 1e-9)
    return float(-np.mean(y * np.log2(p) + (1 - y) * np.log2(1 - p)))


class Predicted(BaseGuesser):
    """A causal predictor replayed on one recorded answer: at each position prompt lookup's copy, sent as far
    as the fitted model's acceptance makes it pay on the curve. It knows only what a live controller could
    know there (the signals are of the text before the position), and no loss budget holds it back: its
    share of the oracle's gain says what better prediction alone could take, beside auto's."""

    name = "predicted"
    default_draft_length = 16

    def __init__(self, answer: Answer, weights: np.ndarray, signals: Sequence[str], curve: CostCurve) -> None:
        self.rows, self.bucket, _ = position_signals(answer)
        self.answer, self.weights, self.signals, self.curve = answer, weights, list(signals), curve
        self.start = len(answer.prompt)

    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig,
                rng: np.random.Generator) -> Proposal:
        at = len(context) - self.start
        if k <= 0 or self.bucket[at] < 0:
            return Proposal.empty()
        tokens, alphas = self.weigh(at, *lookup_match(context, k, 32))
        n, _ = best_length(alphas, self.curve, 0.0)
        # Its own label, not lookup's: what it sends is lookup's copy, but cut by a model no guesser has. As a
        # copy, it drafts nothing: the replay charges its verification only.
        return Proposal(tokens[:n], None, self.name)

    def weigh(self, at: int, tokens: list[int], m: int) -> tuple[list[int], np.ndarray]:
        """The copied tokens worth weighing at answer position `at` after an m-token match, and their acceptance."""
        return tokens, self.alphas(at, tokens, m, self.weights, self.signals)

    def alphas(self, at: int, tokens: list[int], m: int, weights: np.ndarray, signals: Sequence[str]) -> np.ndarray:
        """The model's acceptance of each copied token, the j-th after an (m + j)-token match."""
        x = np.zeros((len(tokens), len(MATCH_BUCKETS) + 1 + len(signals)))
        drafted = self.answer.draft_guess
        for j, token in enumerate(tokens):
            x[j, match_bucket(m + j)] = 1.0
            for c, s in enumerate(signals, len(MATCH_BUCKETS) + 1):
                x[j, c] = float(at + j < len(drafted) and drafted[at + j] == token) if s == "draft" else self.rows[s][at]
        return from_log_odds(x @ weights)


class Checked(Predicted):
    """The draft's agreement at its price: where the match length alone gives the first copied token at least
    `gate`, the draft model reads up to `span` tokens of the copy in one batch before the step, and the model
    with the draft's agreement decides how many to send; elsewhere the match length alone decides. A check is
    charged as that many draft tokens on the target curve's shape (draft_s * verify(n) / verify(1)), and
    nothing for keeping the draft's cache in step with the tokens it did not read, which favours it."""

    def __init__(self, answer: Answer, weights: np.ndarray, plain_weights: np.ndarray, curve: CostCurve,
                 gate: float, span: int = 8) -> None:
        super().__init__(answer, weights, ["draft"], curve)
        self.plain_weights, self.gate, self.span = plain_weights, gate, span
        self.check_s = 0.0  # what the checks cost, for the caller to add to the replay's seconds

    def weigh(self, at: int, tokens: list[int], m: int) -> tuple[list[int], np.ndarray]:
        alphas = self.alphas(at, tokens, m, self.plain_weights, [])
        if alphas[0] < self.gate:
            return tokens, alphas
        tokens = tokens[:self.span]
        self.check_s += self.curve.draft_s * float(self.curve.verify(len(tokens)) / self.curve.verify(1))
        return tokens, self.alphas(at, tokens, m, self.weights, self.signals)


def own_copy_oracle(answer: Answer, curve: CostCurve) -> float:
    """Seconds for a controller that copies from where prompt lookup copies (the longest earlier match, the
    latest among equals) and knows how many of its tokens will hold: the bound for choosing how much of
    lookup's copy to send, where the oracle also picks the best place to copy from with hindsight."""
    return oracle(answer, curve, draft=False, copies=lookup_copy)
