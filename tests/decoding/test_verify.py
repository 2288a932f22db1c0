"""The acceptance rule on hand-built distributions, and its exactness by sampling."""

import numpy as np
import pytest

from specchat.decoding.verify import verify, verify_greedy

P = np.array([0.40, 0.25, 0.15, 0.10, 0.07, 0.03])
Q_BAD = np.array([0.10, 0.10, 0.30, 0.30, 0.10, 0.10])  # a bad draft, on purpose
N = 100_000


def _first_token_frequencies(draws: np.ndarray) -> np.ndarray:
    return np.bincount(draws, minlength=len(P)) / len(draws)


def test_draft_proposals_reproduce_target_distribution():
    rng = np.random.default_rng(0)
    target = np.stack([P, P])
    out, accepted = [], 0
    for _ in range(N):
        x = int(rng.choice(6, p=Q_BAD))
        v = verify([x], Q_BAD[None], target, rng)
        accepted += v.n_accepted
        out.append(x if v.n_accepted else v.token)
    tv = 0.5 * np.abs(_first_token_frequencies(np.array(out)) - P).sum()
    assert tv < 0.01
    # and the acceptance rate is sum(min(p, q)), as the theory says
    assert accepted / N == pytest.approx(np.minimum(P, Q_BAD).sum(), abs=0.01)


@pytest.mark.parametrize("guess", [0, 2, 5])
def test_point_mass_proposals_reproduce_target_distribution(guess):
    rng = np.random.default_rng(guess)
    target = np.stack([P, P])
    out = []
    for _ in range(N):
        v = verify([guess], None, target, rng)
        out.append(guess if v.n_accepted else v.token)
    freqs = _first_token_frequencies(np.array(out))
    assert 0.5 * np.abs(freqs - P).sum() < 0.01


def test_all_accepted_takes_bonus_from_last_row():
    target = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    v = verify([0, 1], None, target, np.random.default_rng(0))
    assert (v.n_accepted, v.token) == (2, 0)
    assert v.bonus(2)


def test_rejection_never_returns_the_rejected_point_mass():
    target = np.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    rng = np.random.default_rng(3)
    for _ in range(200):
        v = verify([1], None, target, rng)
        if v.n_accepted == 0:
            assert v.token == 0


def test_residual_is_max_p_minus_q():
    target = np.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    draft = np.array([[0.0, 1.0, 0.0]])
    rng = np.random.default_rng(0)
    # p(1)/q(1) = 0.5; on rejection the residual max(0, p - q) puts all its mass on token 0.
    verdicts = [verify([1], draft, target, rng) for _ in range(2_000)]
    rejected = [v for v in verdicts if v.n_accepted == 0]
    assert rejected and all(v.token == 0 for v in rejected)
    assert len(rejected) / 2_000 == pytest.approx(0.5, abs=0.05)


def test_greedy_accepts_exactly_the_argmax_run():
    assert verify_greedy([3, 4, 9], [3, 4, 5, 6]).n_accepted == 2
    assert verify_greedy([3, 4, 9], [3, 4, 5, 6]).token == 5
    v = verify_greedy([3, 4], [3, 4, 7])
    assert (v.n_accepted, v.token) == (2, 7)
    assert verify_greedy([], [8]).token == 8


def test_greedy_one_hot_through_general_rule_matches_greedy_rule():
    target = np.eye(4)[[2, 1, 3]]
    draft = np.eye(4)[[2, 0]]
    v = verify([2, 0], draft, target, np.random.default_rng(0))
    assert (v.n_accepted, v.token) == (1, 1)


@pytest.mark.parametrize("draft_width", [4, 6, 9])  # narrower than the target, equal, wider
def test_drafts_with_another_vocabulary_size_reproduce_the_target(draft_width):
    """A draft whose vocabulary is shorter (tokens only the target has get q = 0) or longer (tokens
    the target cannot emit, which are drafted and must be rejected) than the target's: the output
    is still distributed as p, and acceptance is sum(min(p, q)) over the shared tokens."""
    rng = np.random.default_rng(draft_width)
    q = np.resize(Q_BAD, draft_width) if draft_width != len(P) else Q_BAD.copy()
    q = q / q.sum()
    target = np.stack([P, P])
    out, accepted = [], 0
    for _ in range(N):
        x = int(rng.choice(draft_width, p=q))
        v = verify([x], q[None], target, rng)
        accepted += v.n_accepted
        out.append(x if v.n_accepted else v.token)
    out = np.array(out)
    assert out.max() < len(P)  # never a token the target cannot emit
    assert 0.5 * np.abs(_first_token_frequencies(out) - P).sum() < 0.01
    shared = min(draft_width, len(P))
    assert accepted / N == pytest.approx(np.minimum(P[:shared], q[:shared]).sum(), abs=0.01)


@pytest.mark.parametrize("temperature, grammar", [(1.0, False), (1.0, True), (0.0, True)])
def test_verification_reads_only_the_rows_on_its_path(monkeypatch, temperature, grammar):
    """A row of a real vocabulary costs about 0.4 ms to make probabilities of, and more to mask for a grammar, so the
    rule works on the rows it reads only: a 16-token guess whose first token the target rules out reads one row,
    not 17; one whose first 5 tokens hold, 6. Sampled, and greedy or sampled under a grammar (counted where the
    row is masked). What the rule decides is checked by the tests above and tests/decoding/test_exact.py. Planting
    the old way, every row made up front, makes 17."""
    import specchat.decoding.verify as verify_module
    from specchat.decoding.sampling import SamplingConfig, logits_to_probs, masked
    from specchat.decoding.verify import Tree, verify_logits

    made = []
    if grammar:
        monkeypatch.setattr(verify_module, "masked", lambda logits, allowed: made.append(1) or masked(logits, allowed))
    else:
        monkeypatch.setattr(verify_module, "logits_to_probs", lambda logits, cfg: made.append(1) or logits_to_probs(logits, cfg))
    logits = np.full((17, 50), -30.0)
    logits[np.arange(17), np.arange(17)] = 30.0  # the target is sure of token i at row i
    allowed = np.ones((17, 50), dtype=bool) if grammar else None
    rng = np.random.default_rng(0)
    sampling = SamplingConfig(temperature)
    assert verify_logits(Tree.chain([40] * 16), logits, sampling, rng, allowed).path == ()
    assert len(made) == 1
    made.clear()
    assert len(verify_logits(Tree.chain([*range(5), *[40] * 11]), logits, sampling, rng, allowed).path) == 5
    assert len(made) == 6
