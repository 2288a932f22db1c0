"""What a guesser would have done on a fixed text: greedy answers make every guess's fate readable
off the text, so speculation can be replayed, costed on a cost curve and bounded by an oracle,
without timing noise. The measuring commands (`bench`, `measure`) build on these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from specchat.decoding.guessers import Guesser, lookup, lookup_match
from specchat.decoding.policy import CostCurve, expected_tokens
from specchat.decoding.sampling import SamplingConfig

if TYPE_CHECKING:  # replaying needs no llama.cpp
    from specchat.llama.model import Model


def tokens_per_step_formula(alpha: float, k: int) -> float:
    """Expected tokens per target step with k drafts accepted i.i.d. with probability alpha."""
    return float(expected_tokens(alpha, k))


def replay_greedy(match: Sequence[bool], k: int) -> tuple[int, int]:
    """(tokens, steps) of greedy speculation with k drafts, given per-position draft matches."""
    i, steps, n = 0, 0, len(match)
    while i < n:
        r = 0
        while r < k and i + r < n and match[i + r]:
            r += 1
        i += r + 1
        steps += 1
    return n, steps


def accepted(guesses: Sequence[int], seq: Sequence[int], i: int) -> int:
    """How many of the guesses for seq[i:] greedy verification accepts: the answer is fixed, so
    their fate can be read off the text."""
    r = 0
    while r < len(guesses) and i + r < len(seq) and guesses[r] == seq[i + r]:
        r += 1
    return r


def replay_lookup(seq: Sequence[int], start: int, max_ngram: int = 3, num: int = 10) -> tuple[int, int]:
    """(tokens, steps) of prompt lookup as deployed, replayed over seq[start:]."""
    i, steps = start, 0
    while i < len(seq):
        i += accepted(lookup(seq[:i], num, max_ngram), seq, i) + 1
        steps += 1
    return len(seq) - start, steps


def oracle_lookup_seconds(seq: Sequence[int], start: int, curve: CostCurve, max_ngram: int = 3) -> float:
    """Decode time of seq[start:] for a controller that knows, at every step, how many of prompt
    lookup's guesses the target will accept, and drafts as many of those as cost least per token (none
    if copying does not pay: on a curve measured on a busy machine verifying two can cost more than two
    plain steps, and a bound that copied anyway fell below plain decoding)."""
    i, seconds = start, 0.0
    while i < len(seq):
        r = accepted(lookup(seq[:i], 64, max_ngram), seq, i)
        sizes = np.arange(1, r + 2)
        steps = curve.verify(sizes)
        j = int(np.argmin(steps / sizes))  # guesses kept: j + 1 tokens this step
        seconds += float(steps[j])
        i += j + 1
    return seconds


def modelled_seconds(seq: Sequence[int], start: int, guesser: Guesser, curve: CostCurve) -> float:
    """Decode time of seq[start:] under the guesser's own choices (greedy), if every step cost
    what the curve says: the controller's decisions judged without timing noise, on the same
    text and curve as the oracle bound. The guesser learns as it would live."""
    rng, greedy = np.random.default_rng(0), SamplingConfig()
    guesser.prepare(seq[:start])
    i, seconds = start, 0.0
    while i < len(seq):
        guess = guesser.propose(seq[:i], min(guesser.default_draft_length, len(seq) - i - 1), greedy, rng)
        r = accepted(guess.tokens, seq, i)
        step = float(curve.verify(len(guess.tokens) + 1))
        guesser.observe(len(guess.tokens), r, 0.0)
        seconds += step
        i += r + 1
    return seconds


def lookup_2gram_hits(seq: Sequence[int], start: int) -> int:
    """Positions whose token a 2-gram lookup (most recent earlier occurrence) predicts."""
    hits = 0
    for i in range(start, len(seq)):
        a, b = seq[i - 2], seq[i - 1]
        guess = next((seq[j + 2] for j in range(i - 3, -1, -1) if seq[j] == a and seq[j + 1] == b), None)
        hits += guess == seq[i]
    return hits


def lookup_hits_by_match(seq: Sequence[int], start: int, cap: int = 32) -> list[tuple[int, bool]]:
    """For each position of seq[start:]: the length of the longest earlier match of the text before
    it, and whether its latest occurrence guesses the token (positions without a match are left out)."""
    out = []
    for i in range(start, len(seq)):
        guess, m = lookup_match(seq[:i], 1, cap)
        if m:
            out.append((m, guess[0] == seq[i]))
    return out


def position_probs(model: Model, prompt: Sequence[int], answer: Sequence[int]) -> np.ndarray:
    """The model's T=1 distribution at each answer position, (len(answer), V)."""
    session = model.session
    session.prefill(prompt)
    logits = np.array(session.decode([prompt[-1], *answer[:-1]], "all"), dtype=np.float64)
    session.rewind(len(prompt) - 1)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
