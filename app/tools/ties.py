"""Telling a floating-point near-tie from a broken engine, where two greedy answers part.

llama.cpp's CPU kernels round differently when a position is evaluated alone or in a batch, so at a
near-tie speculative and plain greedy decoding can pick different tokens. A divergence is excused
only if each run's token is at the top of its own logits, and each leads the other by no more than
the noise allows and never more than a fixed ceiling. The noise (how much that position's logits move
between batchings of what comes before it) is measured on a fresh model that neither run touched; the leads are the runs'
own when they were recorded (the greedy-equivalence test records them), else those of the fresh
evaluations (the endurance check compares with another process, whose logits it never saw). The
ceiling is the part that cannot be argued with: a tolerance measured by comparing the two
evaluations grows with a kernel that corrupts batched logits, and would excuse it.

Where both runs prefilled the prompt alike (the greedy-equivalence test: the speculative run reuses
plain decoding's cache of it), what they batched otherwise is the answer and the prompt's last token,
which waits to be verified with the first guesses; so the fresh model prefills the prompt but its last
TAIL tokens once and varies the batching of those and the answer only, coming back to the head by a
rewind. On the default pair, 2026-12-05, two partings of a 148-token prompt (at answer tokens 33 and
55, leads of at most 0.16 and 0.10) moved by 0.49 and 0.65 so, against 0.58 and 0.66 with the whole
prefix batched every way (0.58 and 0.62 with 32 tokens), in 55 and 93 s against 185 and 214 s (one
thread; two give the same logits); at the 13 partings tests/decoding/test_greedy_qwen.py meets (9 of them
distinct), 0.49 to 0.71, with leads of 0.17 at most: the ceiling decides every one, as it did before.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal, Sequence

import numpy as np

from specchat.llama.model import Model
from specchat.llama.session import Session

# On good builds every parting was at a lead of at most 0.36 logits: 0.005 to 0.36 on this project's
# 2-core Intel Xeon (the default pair, 2026-12-01, tests/decoding/test_greedy_qwen.py), 0.05 to 0.06 on its AMD
# EPYC, up to 0.16 when evaluated anew on a fresh model. A kernel or a rule that is wrong moves logits
# by whole units (tests/decoding/test_greedy_check.py plants both).
CEILING = 0.5

# Of a prompt both runs prefilled alike, the last tokens whose batching the noise still varies: at least 16,
# so that a parting at the answer's first token (chosen from the prompt's last token, verified alone or
# with up to 16 guesses) sees batch noise too.
TAIL = 16


@dataclass(frozen=True)
class Parting:
    """Where two greedy answers part, and whether that is a near-tie."""

    position: int  # of the answer
    ours: int
    theirs: int
    leads: tuple[float, float]  # each run's token's lead over the other's, in its own (or fresh) logits
    noise: float  # the most that position's logits move between batchings, on a fresh model
    tie: bool

    def report(self) -> str:
        verdict = "a near-tie" if self.tie else "NOT a near-tie"
        return (f"{verdict}: the answers agree on {self.position} tokens, then give {self.ours} and {self.theirs}, "
                f"which lead by {self.leads[0]:.3f} and {self.leads[1]:.3f} in the logits that chose them; batchings "
                f"move that position's logits by up to {self.noise:.3f} on a fresh model, and the ceiling is {CEILING}")


def parting(path: Path, prompt: Sequence[int], ours: Sequence[int], theirs: Sequence[int], n_ctx: int = 4096,
            threads: int | None = None, rows: tuple[np.ndarray, np.ndarray] | None = None,
            reused: bool = False, alike: bool = False) -> Parting | None:
    """Judge where `ours` and `theirs` (two greedy answers to `prompt`) first differ; None if they do not.
    `rows`: the logits each run chose its token at that position from, if they were recorded. `reused`: a
    run may have reused a cache that earlier, longer prompts wrote, whose rounding the noise then includes.
    `alike`: both runs prefilled the prompt the same way, so the noise varies only the batching of its last
    TAIL tokens and the answer (see `both_ways`); otherwise, of everything before the parting.
    One answer that stops where the other goes on is never a tie."""
    i = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if i is None:
        if len(ours) == len(theirs):
            return None
        i = min(len(ours), len(theirs))
        return Parting(i, -1, -1, (float("inf"), float("inf")), 0.0, False)
    x, y = int(ours[i]), int(theirs[i])
    head = max(0, len(prompt) - TAIL) if alike else 0
    # With the runs' own rows the verdict is settled once 2 * noise reaches the ceiling: more ways cannot
    # change it, and the rest of them are not measured (the noise reported is then at least that).
    enough = CEILING / 2 if rows is not None else float("inf")
    batched, single, noise = both_ways(path, tuple(prompt), tuple(ours[:i]), n_ctx, threads, reused, head, enough)
    mine, other = rows if rows is not None else (batched, single)
    # Each run must have emitted the top of the logits it chose from, and lead the other's token by little.
    tops = int(mine.argmax()) == x and int(other.argmax()) == y if rows is not None else \
        all(max(row[x], row[y]) >= row.max() - 2 * noise for row in (mine, other))
    leads = (abs(float(mine[x] - mine[y])), abs(float(other[y] - other[x])))
    tie = tops and max(leads) <= min(2 * noise, CEILING)
    return Parting(i, x, y, leads, noise, tie)


BATCHINGS = 16  # random ways of cutting the tokens into batches, besides all in one and one at a time
LARGE_BATCH = 128  # rows: llama.cpp's CPU kernels round a batch of 64 rows or more otherwise than a smaller one


def batchings(n: int, seed: int | Sequence[int], count: int = BATCHINGS, most: int = 16,
              reused: bool = True) -> list[tuple[list[int], int]]:
    """Ways to decode n tokens, as prefills, reused caches and verifications cut them: (batch sizes, pad). All
    in one batch, one at a time, and `count` random cuts into batches of 1 to `most`, seeded (the same tokens
    are measured the same way); and (`reused`) two where the first batch is the head of a longer one, `pad`
    more rows taken back after it, as a cache reused from an earlier, longer prompt holds it. Two or five ways
    saw less than half the noise: on an Intel Xeon 0.0031 where 18 saw 0.0047 (tests/helpers/rollback.py); on an AMD
    EPYC the ways in batches of up to 16 all gave SmolLM2 the same logits, and a prompt whose first 14 tokens
    came from an earlier prefill of 93 moved a row by 0.11 (a batch of 64 rows or more rounds otherwise)."""
    rng = np.random.default_rng(seed)

    def cut(first: int = 0) -> list[int]:
        sizes = [first] if first else []
        while sum(sizes) < n:
            sizes.append(min(int(rng.integers(1, most + 1)), n - sum(sizes)))
        return sizes

    ways = [([n], 0), ([1] * n, 0), *((cut(), 0) for _ in range(count))]
    if reused and n:
        head = int(rng.integers(1, n + 1))
        ways += [([n], max(0, LARGE_BATCH - n)), (cut(head), max(0, LARGE_BATCH - head))]
    return ways


def decode_as(session: Session, tokens: Sequence[int], sizes: Sequence[int], pad: int = 0,
              logits: Literal["none", "all"] = "none") -> np.ndarray:
    """Decode `tokens` after what the session holds, in batches of these sizes, the first followed by `pad`
    rows (the tokens again) that are taken back after it; the logits of every token where asked."""
    rows, at = [], 0
    for i, size in enumerate(sizes):
        batch = list(tokens[at:at + size])
        extra = (list(tokens) * (pad // max(1, len(tokens)) + 1))[:pad] if i == 0 else []
        start = len(session.tokens)
        out = session.decode(batch + extra, logits)
        if logits == "all":
            rows.append(np.array(out[:size]))
        if extra:
            session.rewind(start + size)
        at += size
    return np.concatenate(rows) if rows else np.empty((0, session.model.n_vocab), dtype=np.float32)


# The model that judgements decode on, loaded once per file and settings and kept between them: loading
# the default pair's target takes 1.5 to 4 s here (its weights are repacked for the CPU's kernels), and the greedy
# tests judge a dozen partings. Each judgement starts from a cleared cache, which holds nothing of what was
# decoded before, as a new model's holds nothing (`both_ways` clears it between batchings already); no run
# being judged ever decodes on it.
_fresh: dict[tuple[str, int, int | None], Model] = {}


def fresh_model(path: Path, n_ctx: int, threads: int | None) -> Model:
    """A model of this file that no run being judged has touched, its cache empty."""
    key = (str(path), n_ctx, threads)
    if key not in _fresh:
        close_fresh()  # one file's at a time: the default pair's target holds a gigabyte
        _fresh[key] = Model(path, n_ctx=n_ctx, n_threads=threads)
    model = _fresh[key]
    model.session.clear()
    return model


@atexit.register
def close_fresh() -> None:
    """Close the kept model: before another file's is loaded, and at exit."""
    while _fresh:
        _fresh.popitem()[1].close()


# A fresh model gives the same logits for the same tokens, and the greedy tests judge the same parting
# once for each guesser that meets it (a model load and passes over the answer each), with others between:
# tests/decoding/test_greedy_qwen.py meets 13 partings, 9 of them distinct, and 4 entries kept 1 of the 4
# repeats (2026-12-05). An entry is two rows of logits.
@lru_cache(maxsize=16)
def both_ways(path: Path, prompt: tuple[int, ...], answer: tuple[int, ...], n_ctx: int, threads: int | None,
              reused: bool = False, head: int = 0, enough: float = float("inf")) -> tuple[np.ndarray, np.ndarray, float]:
    """The logits after prompt + answer on a fresh model: with everything before the last token in one
    batch, and with the answer one token at a time after the prompt (as plain decoding does); and the most
    they move over every batching of what comes before the last token (the noise; `reused`, see `batchings`).
    `head`: that many of the prompt's first tokens are decoded once, in one batch, and every way comes back
    to them (a rewind) and batches only what follows. `enough`: no more ways once the noise reaches it."""
    prefix = list(prompt + answer)
    tail = len(prefix) - 1 - head  # the tokens before the last whose batching varies
    session = fresh_model(path, n_ctx, threads).session
    if head:
        session.decode(prefix[:head], "none")
        session.checkpoint(lasting=True)  # what a memory that cannot cut comes back to

    def last(sizes: list[int], pad: int = 0) -> np.ndarray:
        if head:
            session.rewind(head)
        else:
            session.clear()
        decode_as(session, prefix[head:-1], sizes, pad)
        return np.array(session.decode([prefix[-1]], "last")[0])

    batched = last([tail])
    before = len(prompt) - 1 - head  # of the prompt, after the head and before its last token
    single = last([*([before] if before > 0 else []), *[1] * (tail - max(0, before))])
    noise = float(np.abs(single - batched).max())
    for sizes, pad in batchings(tail, prefix, reused=reused):
        if noise >= enough:
            break
        noise = max(noise, float(np.abs(last(sizes, pad) - batched).max()))
    batched.flags.writeable = single.flags.writeable = False  # shared by every caller of the cache
    return batched, single, noise
