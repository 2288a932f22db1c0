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
    logits = np.asarray(logits, dtype=np.float64)
    if cfg.greedy:
        probs = np.zeros_like(logits)
        np.put_along_axis(probs, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return probs
    keep = np.ones(logits.shape, dtype=bool)
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = np.partition(logits, -cfg.top_k, axis=-1)[..., -cfg.top_k, None]
        keep &= logits >= kth
    if cfg.top_p < 1 or cfg.min_p > 0:
        base = _softmax(np.where(keep, logits, -np.inf))
        if cfg.min_p > 0:
            keep &= base >= cfg.min_p * base.max(-1, keepdims=True)
        if cfg.top_p < 1:
            keep &= _top_p_mask(base, cfg.top_p)
    # Shift by the largest kept logit before dividing: logits / T overflows to inf for a tiny T
    # (1e-310), and inf - inf is NaN. Then the kept values are <= 0 and one of them is 0.
    shifted = logits - np.where(keep, logits, -np.inf).max(-1, keepdims=True)
    with np.errstate(over="ignore"):  # a value that overflows to -inf is meant: its weight is 0
        return _softmax(np.where(keep, shifted / cfg.temperature, -np.inf))


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
    """One token from a probability vector (inverse CDF: one uniform draw, no Python loop)."""
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of most likely tokens whose mass reaches top_p (at least one)."""
    mask = np.zeros(probs.shape, dtype=bool)
    for row, out in zip(probs.reshape(-1, probs.shape[-1]), mask.reshape(-1, probs.shape[-1])):
        out[_nucleus(row, top_p)] = True
    return mask


def _nucleus(probs: np.ndarray, top_p: float) -> np.ndarray:
    # Sorting 150k entries per token costs milliseconds; the nucleus is nearly always
    # inside the top few hundred, so sort those and fall back to a full sort only if not.
    n = probs.shape[-1]
    for size in (min(256, n), n):
        top = np.argpartition(-probs, size - 1)[:size] if size < n else np.arange(n)
        top = top[np.argsort(-probs[top], kind="stable")]
        mass_before = np.cumsum(probs[top]) - probs[top]
        if size == n or mass_before[-1] + probs[top[-1]] >= top_p:
            return top[mass_before < top_p]
    raise AssertionError("unreachable")
