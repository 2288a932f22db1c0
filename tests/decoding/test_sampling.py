import numpy as np
import pytest

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
