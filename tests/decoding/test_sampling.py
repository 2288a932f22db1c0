import numpy as np
import pytest
from scipy.stats import chisquare

from specchat.decoding.sampling import SamplingConfig, logits_to_probs, sample
from specchat.errors import SpecchatError


def test_greedy_is_one_hot_at_argmax():
    probs = logits_to_probs(np.array([0.1, 3.0, -1.0, 2.9]), SamplingConfig(temperature=0))
    assert probs.tolist() == [0, 1, 0, 0]


def test_temperature_one_is_softmax():
    logits = np.array([1.0, 2.0, 3.0])
    expected = np.exp(logits) / np.exp(logits).sum()
    np.testing.assert_allclose(logits_to_probs(logits, SamplingConfig(temperature=1.0)), expected)


def test_top_k_keeps_k_largest():
    probs = logits_to_probs(np.array([1.0, 5.0, 3.0, 4.0, 2.0]), SamplingConfig(temperature=1.0, top_k=2))
    assert np.flatnonzero(probs).tolist() == [1, 3]
    assert probs.sum() == pytest.approx(1.0)


def test_top_p_keeps_smallest_set_reaching_mass():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    probs = logits_to_probs(np.log(p), SamplingConfig(temperature=1.0, top_p=0.75))
    # 0.5 alone is below 0.75, 0.5 + 0.3 reaches it: two tokens survive.
    assert np.flatnonzero(probs).tolist() == [0, 1]
    np.testing.assert_allclose(probs[:2], [0.5 / 0.8, 0.3 / 0.8])


def test_top_p_on_large_vocab_matches_full_sort():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=150_000) * 0.5  # flat: the nucleus is far beyond the first 256 tokens
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.9))
    base = np.exp(logits - logits.max())
    base /= base.sum()
    order = np.argsort(-base)
    n_keep = int(np.searchsorted(np.cumsum(base[order]), 0.9)) + 1
    assert set(np.flatnonzero(probs)) == set(order[:n_keep])


def test_min_p_drops_tokens_far_below_the_best():
    p = np.array([0.6, 0.3, 0.05, 0.05])
    probs = logits_to_probs(np.log(p), SamplingConfig(temperature=1.0, min_p=0.1))
    assert np.flatnonzero(probs).tolist() == [0, 1]


def test_temperature_sharpens_after_filters():
    logits = np.array([2.0, 1.0, 0.0])
    hot, cold = (logits_to_probs(logits, SamplingConfig(temperature=t)) for t in (2.0, 0.5))
    assert cold[0] > hot[0]


def test_rows_are_independent():
    logits = np.array([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])
    probs = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=1))
    assert probs.tolist() == [[0, 0, 1], [1, 0, 0]]


def test_sample_follows_distribution():
    rng = np.random.default_rng(0)
    p = np.array([0.2, 0.0, 0.5, 0.3])
    counts = np.bincount([sample(p, rng) for _ in range(20_000)], minlength=4) / 20_000
    assert counts[1] == 0
    np.testing.assert_allclose(counts, p, atol=0.015)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5),
                                    dict(min_p=1.0)])
def test_invalid_settings_are_clear_errors(kwargs):
    with pytest.raises(SpecchatError):
        SamplingConfig(**kwargs)


def _whole_row_probs(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The filters as defined, on whole rows: a mask over every token, the base distribution over every token."""
    keep = np.ones(len(logits), dtype=bool)
    if cfg.top_k and cfg.top_k < len(logits):
        keep &= logits >= np.sort(logits)[-cfg.top_k]
    base = np.where(keep, np.exp(logits - logits[keep].max()), 0.0)
    base /= base.sum()
    if cfg.min_p > 0:
        keep &= base >= cfg.min_p * base.max()
    if cfg.top_p < 1:
        order = np.argsort(-base, kind="stable")
        nucleus = np.zeros(len(logits), dtype=bool)
        nucleus[order[np.cumsum(base[order]) - base[order] < cfg.top_p]] = True
        keep &= nucleus
    weights = np.where(keep, np.exp((logits - logits[keep].max()) / cfg.temperature), 0.0)
    return weights / weights.sum()


def test_each_row_is_what_the_filters_define_on_the_whole_row():
    """400 rows of 1 to 600 tokens, under every combination of the filters: the same tokens kept and the same
    probabilities as masks over the whole row give, which is what the filters mean (the row's own code works on the
    tokens kept), ties included: top-k keeps them all, and the nucleus takes tied tokens in the order they come. A
    top-k that drops ties, or a nucleus judged after min-p, fails here."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        n = int(rng.integers(1, 600))
        logits = np.round(rng.normal(0, 3, n), int(rng.integers(0, 3)))  # rounded: ties
        cfg = SamplingConfig(float(rng.choice([0.3, 0.7, 1.0, 1.5])), int(rng.choice([0, 1, 5, 40])),
                             float(rng.choice([1.0, 0.5, 0.9, 0.95])), float(rng.choice([0.0, 0.05, 0.2])))
        got, want = logits_to_probs(logits, cfg), _whole_row_probs(logits, cfg)
        assert (np.flatnonzero(got) == np.flatnonzero(want)).all(), cfg
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15, err_msg=str(cfg))


def test_top_k_on_large_vocabularies_keeps_what_the_whole_row_keeps():
    """Rows of 2k to 160k tokens, long enough for top-k's bound by the blocks' maxima: the same tokens and
    probabilities as the whole-row definition, whether the largest logits are spread one to a block (the bound is
    then exactly the k-th), packed into one block (sorted rows), tied, or next to forbidden tokens (-inf). A bound
    one place too high, or candidates that miss a tie, fail here."""
    rng = np.random.default_rng(11)
    for case in range(60):
        n = int(rng.integers(2_000, 160_000))
        logits = rng.normal(0, 3, n)
        if case % 4 == 1:
            logits = np.sort(logits)
        elif case % 4 == 2:
            logits = np.round(logits, 0)  # thousands of ties at every value
        elif case % 4 == 3:
            logits[rng.random(n) < 0.9] = -np.inf
        cfg = SamplingConfig(1.0, int(rng.choice([1, 2, 5, 40, 100])))
        got, want = logits_to_probs(logits, cfg), _whole_row_probs(logits, cfg)
        assert (np.flatnonzero(got) == np.flatnonzero(want)).all(), (case, cfg)
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-15)


def test_sample_on_a_large_vocabulary_follows_the_distribution_and_never_draws_a_zero():
    """150k tokens, most of probability 0 and the rest spread over a few blocks of the block-wise draw, some at the
    ends of blocks: 40,000 draws follow p, and none is a token of probability 0."""
    rng = np.random.default_rng(0)
    p = np.zeros(150_000)
    support = np.array([0, 1023, 1024, 5000, 70_000, 70_001, 149_999])
    p[support] = rng.dirichlet(np.ones(len(support)))
    draws_rng = np.random.default_rng(1)
    draws = np.array([sample(p, draws_rng) for _ in range(40_000)])
    assert set(draws) <= set(support)
    assert chisquare([np.sum(draws == t) for t in support], p[support] * 40_000).pvalue > 1e-3
