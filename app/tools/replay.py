"""What a guesser would have done on a fixed text: its every guess's fate can be read off the text
(`specchat.tools.recorded` says why, greedy or sampled), so speculation can be replayed, costed on a cost
curve and bounded by an oracle, without timing noise. `bench` judges auto on plain's answer by `replay`
and `oracle`, `bench/corpus` judges it on recorded answers by the same two, and `measure` counts tokens
per step by `replay_greedy` and `replay_lookup`.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from specchat.decoding.events import DRAFTERS
from specchat.decoding.guessers import Guesser, lookup, lookup_match
from specchat.decoding.policy import CostCurve, expected_tokens
from specchat.decoding.sampling import SamplingConfig
from specchat.tools.recorded import Answer


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


def replay(answer: Answer, curve: CostCurve, guesser: Guesser) -> tuple[float, int]:
    """Seconds the answer takes under the guesser's choices, every step costed by the curve (as auto's own
    account costs it: drafting, a draft's catching up, verifying, and taking back what a cache cannot drop),
    and steps. The guesser learns as it would live, at the answer's temperature, told no step's time: its
    account is by the curve too."""
    seq, start = answer.seq, len(answer.prompt)
    sampling = SamplingConfig(answer.temperature, seed=0)
    rng = np.random.default_rng(0)
    guesser.prepare(seq[:start])
    i, seconds, steps = start, 0.0, 0
    while i < len(seq):
        guess = guesser.propose(seq[:i], min(guesser.default_draft_length, len(seq) - i - 1), sampling, rng)
        r = accepted(guess.tokens, seq, i)
        drafting = len(guess.tokens) * curve.token_s(guess.guesser) + guess.sync_s \
            if guess.guesser in DRAFTERS else 0.0
        step = curve.spent_s(len(guess.tokens), r, drafting)
        guesser.observe(len(guess.tokens), r)
        seconds += step
        i += r + 1
        steps += 1
    return seconds, steps


# Where a controller that knows the future may copy from: given the text and a position i, how many of the
# tokens from seq[i] on its copy would guess.
Copies = Callable[[Sequence[int], int], int]


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


def lookup_copy(seq: Sequence[int], i: int) -> int:
    """How many of the tokens from seq[i] on prompt lookup's own copy would have guessed: the one after the
    longest earlier match of the text before i (up to 32 tokens), the latest among equals."""
    return accepted(lookup(seq[:i], 64, 32), seq, i)


def oracle(answer: Answer, curve: CostCurve, draft: bool = True, copies: Copies = longest_copy) -> float:
    """Seconds for a controller that knows, at every step, how many of the upcoming tokens its copy would
    guess (by default the longest run any copy of earlier text would) and how many of the draft model's
    guesses the target will keep (greedy answers with a recorded draft, unless `draft` is off), and sends
    whichever costs least per token (nothing if none pays: on a curve measured on a busy machine verifying
    two can cost more than two plain steps). It sees the future but chooses step by step, so it is the
    yardstick auto's share is measured against, not a proof that nothing could do better."""
    seq, start = answer.seq, len(answer.prompt)
    guesses = answer.draft_guess if draft and answer.temperature == 0 else ()
    i, seconds = start, 0.0
    while i < len(seq):
        runs = [(copies(seq, i), 0.0)]
        if guesses:
            runs.append((accepted(guesses[i - start:i - start + 16], seq, i), curve.draft_s))
        step, kept = _cheapest_step(curve, runs)
        seconds += step
        i += kept + 1
    return seconds


def _cheapest_step(curve: CostCurve, runs: Sequence[tuple[int, float]]) -> tuple[float, int]:
    """Of a plain step and sending the first j guesses of each run (j guesses that will all be kept, each
    drafted at that run's cost per token), the one that costs least per token made, the first among equals:
    its seconds and the guesses it keeps."""
    kept = [np.arange(1, r + 1) for r, _ in runs]
    seconds = np.concatenate([curve.verify(np.arange(1, 2)),
                              *(j * token_s + curve.verify(j + 1) for j, (_, token_s) in zip(kept, runs))])
    sizes = np.concatenate([[0], *kept])
    best = int(np.argmin(seconds / (sizes + 1)))
    return float(seconds[best]), int(sizes[best])


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
