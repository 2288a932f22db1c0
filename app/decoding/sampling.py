"""Sampling transforms as pure numpy functions.

The same `SamplingConfig` is applied to the target's and the draft's logits before the
acceptance rule: the exactness guarantee is about the distributions actually compared.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specchat.errors import SpecchatError


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature 0 means greedy decoding; top_k 0, top_p 1 and min_p 0 disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise SpecchatError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise SpecchatError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise SpecchatError(f"top-p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p < 1:
            raise SpecchatError(f"min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """Rows of logits (..., V) -> probabilities after top-k, top-p, min-p and temperature.

    The filters are judged on the untempered distribution and temperature is applied last,
    the order llama.cpp's default sampler chain uses, so settings mean the same as there.
    Greedy configs give a one-hot at the argmax, so the acceptance rule needs no special case.
    """
    logits = np.asarray(logits)  # float32 from llama.cpp: each row is made float64 once, where it is worked on
    if cfg.greedy:
        probs = np.zeros(logits.shape)
        np.put_along_axis(probs, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return probs
    if logits.ndim != 1:
        return np.stack([_row_probs(row, cfg) for row in logits.reshape(-1, logits.shape[-1])]).reshape(logits.shape)
    return _row_probs(logits, cfg)


def _row_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """One row (V,), every step's: the filters work on the few tokens they keep, not on whole rows, and the row is
    copied once (a fresh 1.2 MB array costs more in page faults than the arithmetic on it). On the default target's
    rows a token then costs 0.2-0.4 ms with the draw, where whole-row masks made it 1.0-3.9 ms, up to 13% of a CPU's
    step (`bench/sampling`)."""
    kept = None  # the indices kept (None: all)
    if cfg.top_k and cfg.top_k < len(logits):
        kept = _top_k(logits, cfg.top_k)
    if cfg.top_p < 1 or cfg.min_p > 0:
        among = logits if kept is None else logits[kept]
        base = np.exp(np.subtract(among, among.max(), dtype=np.float64))
        base /= base.sum()
        keep = np.ones(len(among), dtype=bool) if cfg.top_p == 1 else np.zeros(len(among), dtype=bool)
        if cfg.top_p < 1:
            keep[_nucleus(base, cfg.top_p)] = True
        if cfg.min_p > 0:
            keep &= base >= cfg.min_p * base.max()
        within = np.flatnonzero(keep)
        kept = within if kept is None else kept[within]
    if kept is None:  # no filter: every token, tempered
        # Shift by the largest logit before dividing: logits / T overflows to inf for a tiny T (1e-310), and
        # inf - inf is NaN. Then the values are <= 0 and one of them is 0 (a value that overflows to -inf is
        # meant: its weight is 0).
        x = np.subtract(logits, logits.max(), dtype=np.float64)
        with np.errstate(over="ignore"):
            np.divide(x, cfg.temperature, out=x)
        np.exp(x, out=x)
        x /= x.sum()
        return x
    chosen = logits[kept].astype(np.float64)
    with np.errstate(over="ignore"):
        weights = np.exp((chosen - chosen.max()) / cfg.temperature)
    probs = np.zeros(len(logits))
    probs[kept] = weights / weights.sum()
    return probs


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Logits (..., V) with what a grammar forbids at -inf, before any sampling transform: the filters and the
    temperature then act among the allowed tokens, so their probabilities are the target's renormalised over
    what is allowed (and greedy is the argmax among them). `allowed` (..., W) may be narrower than the
    logits (a vocabulary's padding) or wider (tokens this model has not): beyond its width nothing is allowed."""
    logits = np.asarray(logits, dtype=np.float64)
    width = logits.shape[-1]
    allow = np.zeros(logits.shape, dtype=bool)
    n = min(width, allowed.shape[-1])
    allow[..., :n] = allowed[..., :n]
    if not allow.any(-1).all():
        raise SpecchatError("the grammar allows no token at a position it reached; the constraint cannot be met "
                            "with this vocabulary")
    return np.where(allow, logits, -np.inf)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a probability vector, by inverse CDF: one uniform draw, no Python loop. On a large vocabulary
    the cumulative sum runs over blocks' sums, then over one block (a cumulative sum of 150k entries costs 0.5 ms,
    these a tenth of that); never a token of probability 0."""
    n = len(probs)
    if n <= 4 * _BLOCK:
        cdf = np.cumsum(probs)
        return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), n - 1))
    cdf = np.cumsum(np.add.reduceat(probs, np.arange(0, n, _BLOCK)))
    u = rng.random() * cdf[-1]
    b = int(min(np.searchsorted(cdf, u, side="right"), len(cdf) - 1))  # cdf[b - 1] <= u < cdf[b]: mass in block b
    below = cdf[b - 1] if b else 0.0
    block = probs[b * _BLOCK:(b + 1) * _BLOCK]
    within = np.cumsum(block)
    # Where u falls in the block, as a fraction of its mass (the two sums round apart), then among its own tokens;
    # rounding up at the block's end must not land on a token of probability 0 after its last token with any.
    j = int(np.searchsorted(within, (u - below) / (cdf[b] - below) * within[-1], side="right"))
    return b * _BLOCK + min(j, int(np.flatnonzero(block)[-1]))


_BLOCK = 1024


def _top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest logits, and of every tie with the k-th, in index order. Partitioning a whole
    150k row cost 0.8 ms a token; the blocks' maxima bound it first: the k largest of them are k different tokens,
    so the k-th largest logit is at least the k-th largest maximum, and only the few tokens above that are
    partitioned."""
    candidates = None
    blocks = len(logits) // _TOPK_BLOCK
    if blocks >= 4 * k:  # with fewer blocks the k-th maximum lies deep in the row and most of it is above it
        maxima = logits[:blocks * _TOPK_BLOCK].reshape(blocks, _TOPK_BLOCK).max(1)
        candidates = np.flatnonzero(logits >= np.partition(maxima, -k)[-k])
    among = logits if candidates is None else logits[candidates]
    kth = np.partition(among, -k)[-k]
    return np.flatnonzero(logits >= kth)  # ties with the k-th are all kept


_TOPK_BLOCK = 256


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    """The smallest set of most likely tokens whose mass reaches top_p (at least one). Only tokens above
    (1 - top_p) / n can be in it (those below hold less than 1 - top_p between them, so the tokens above already
    reach top_p), and sorting those few is what costs: all 150k took 20 ms."""
    n = probs.shape[-1]
    top = np.flatnonzero(probs >= (1 - top_p) / n * probs.sum())
    top = top[np.argsort(-probs[top], kind="stable")]
    mass_before = np.cumsum(probs[top]) - probs[top]
    return top[mass_before < top_p]
