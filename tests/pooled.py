"""The chi-square test the exactness tests share."""

from __future__ import annotations

import numpy as np
from scipy.stats import chisquare


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
