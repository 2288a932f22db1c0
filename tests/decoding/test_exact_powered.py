"""Exactness with the power to see a small error: at T=1 (top-k 3), the first three tokens of as many
answers as a chi-square needs to see any sampler 0.03 (total variation) away from the target, per
guesser, against the target's exact joint; and a sampler that far away, planted, rejected. The MTP head
likewise at its default draft length, over the four tokens that reaches.

The models are generated llama GGUFs (tests/helpers/tiny_gguf.py, random weights, 40 tokens) run by llama.cpp
through the same session, rewinds and verification as any other model; they decode in well under a
millisecond, so the 13,000 answers per guesser that the power computation asks for take seconds. The
same count on SmolLM2 (tests/decoding/test_engine.py) would take about 15 minutes per guesser here;
its 500 answers judge a trained model's logits, and see an error of about 0.14.

The only tiny model with an MTP head is the constructed cycle model (tests/helpers/cycle.py). Its soft form ties
every token but the successor at logit 0, so top-k keeps them all and four tokens would make 8^4 cells
(some 114,000 answers); written with a spread (tiny_gguf.cycle_logits) the others fall along the cycle,
in the target and its head alike, and top-k 3 keeps 3^4 = 81 cells: about 20,000 answers, 1.6 ms each.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cycle
import numpy as np
import pytest
import tiny_gguf
from pooled import Sampled, answers_for, exact_joint, sample_answers, sampled_against, total_variation
from tempered import Tempered

import specchat.decoding.verify as verify_module
from specchat.decoding.guessers import AutoGuesser, DraftGuesser, Guesser, LookupGuesser, MtpGuesser, build
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig, logits_to_probs
from specchat.llama.model import Model
from specchat.service.pair import LoadedPair

TV = 0.03  # the smallest error the test must see
ALPHA = 1e-3  # the p-value below which it fails
SAMPLING = SamplingConfig(1.0, top_k=3)  # 27 answers of three tokens, all likely enough to be judged
# On this target, lookup's two copied tokens hold about 0.76 and then 0.52 of the time (the second
# is the bonus token's chance to come after), so its acceptances, rejections and bonuses are all common.
TEXT = "milmilmilmilmi"
# A GPU's shape, on which auto guesses on every step.
FLAT = CostCurve([0.010 + 0.0002 * n for n in range(16)], draft_s=0.001)
PLANTED_T = 1.08  # the target's probabilities at this temperature: 0.031 away on this model
# The successor's lead and the others' fall along the cycle: p(successor) about 0.74 of the three top-k
# keeps, and the head, a mixture of its units' rows, gives it about 0.47 (its first guess on MTP_TEXT),
# so its guesses are rejected about 0.6 times an answer, kept 2.4 times, and all three held in 0.57.
MTP_LEAD, MTP_SPREAD = 1.0, 0.5
MTP_TEXT = " et\n et"  # on the cycle, so that the head's first draft lines up


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_gguf.write("llama", tmp_path_factory.mktemp("powered") / "llama-40.gguf", vocab=40, seed=1)


@pytest.fixture(scope="module")
def models(target):
    """The target and, for the draft, a second copy of it seen sharper (logits doubled)."""
    loaded = Model(target, n_ctx=256, n_threads=1), Model(target, n_ctx=256, n_threads=1)
    yield loaded
    for m in loaded:
        m.close()


def prompt_of(model: Model) -> list[int]:
    return [1, *model.tokenize(TEXT, add_bos=False)]


def guesser(name: str, draft: Model) -> Guesser:
    sharper = DraftGuesser(Tempered(draft, 0.5))
    return {"draft": sharper, "lookup": LookupGuesser(),
            "auto": AutoGuesser(FLAT.copy(), {"draft": sharper})}[name]


def sample(model: Model, guesser: Guesser, n: int) -> Sampled:
    """n answers of three tokens, two guesses a step (so the bonus token is the third whenever both
    hold)."""
    return sample_answers(model, guesser, prompt_of(model), n, SAMPLING, max_tokens=3, draft_length=2)


@pytest.fixture(scope="module")
def joint(target, models) -> dict[tuple[int, ...], float]:
    return exact_joint(target, prompt_of(models[0]), 3, SAMPLING)


@pytest.fixture(scope="module")
def cycle_files(tmp_path_factory) -> tuple[Path, Path]:
    return cycle.write_pair(tmp_path_factory.mktemp("mtp"), cycle=MTP_LEAD, vocab=8, spread=MTP_SPREAD)


@pytest.fixture(scope="module")
def mtp(cycle_files):
    """The cycle target, with its MTP head, and the llama cycle draft (unused here)."""
    with cycle.loaded(*cycle_files) as pair:
        yield pair


def mtp_prompt(pair: LoadedPair) -> list[int]:
    return pair.target.tokenize(MTP_TEXT, add_bos=False)


@pytest.fixture(scope="module")
def mtp_joint(cycle_files, mtp) -> dict[tuple[int, ...], float]:
    """The first tokens the head's default draft length reaches in one step: its guesses and the bonus."""
    return exact_joint(cycle_files[0], mtp_prompt(mtp), MtpGuesser.default_draft_length + 1, SAMPLING)


@pytest.mark.parametrize("of", ["joint", "mtp_joint"])
def test_the_answer_count_sees_the_hardest_error_of_that_size(request, of):
    """The count from the power computation, checked by simulation: a joint moved 0.03 the hardest way
    (half the mass shifted in proportion to p) is rejected in at least 85 of 100 simulated runs, while
    the exact joint is rejected about ALPHA of the time; with a quarter of the count, far less often.
    Checked on each joint the tests judge, as pooling its rare cells is part of what the count must survive."""
    joint = request.getfixturevalue(of)
    p = np.array(list(joint.values()))
    order = np.argsort(p)
    low = np.zeros(len(p), dtype=bool)
    low[order[np.cumsum(p[order]) <= 0.5]] = True  # one half of the mass (about), the other moves against it
    moved = np.where(low, p * (1 + TV / p[low].sum()), p * (1 - TV / p[~low].sum()))
    assert abs(0.5 * np.abs(moved - p).sum() - TV) < 1e-9
    n = answers_for(TV, len(joint), ALPHA)
    rng = np.random.default_rng(0)
    keys = list(joint)

    def rejected(q: np.ndarray, count: int) -> int:
        runs = [rng.multinomial(count, q / q.sum()) for _ in range(100)]
        return sum(sampled_against(joint, [k for k, c in zip(keys, r) for _ in range(c)]) < ALPHA for r in runs)

    assert rejected(moved, n) >= 85
    assert rejected(p, n) <= 2
    assert rejected(moved, n // 4) <= 40


@pytest.mark.parametrize("name", ["draft", "lookup", "auto"])
def test_the_first_three_tokens_are_the_targets_to_within_what_a_bug_of_tv_003_would_show(models, joint, name):
    target, draft = models
    n = answers_for(TV, len(joint), ALPHA)
    assert len(joint) == 27 and n > 13_000
    got = sample(target, guesser(name, draft), n)
    # Every path of the rule taken often: the residual, a kept guess, and the bonus token among the judged.
    assert got.rejected > n / 10 and got.accepted > n / 2 and got.bonus > n / 10, got
    p = sampled_against(joint, got.answers)
    assert p > ALPHA, f"{name}: the first three tokens of {n} answers are not the target's (p = {p:.2g})"


@pytest.mark.parametrize("plant", ["target at T=1.08", "residual from p"])
def test_the_same_count_rejects_a_planted_error(models, joint, target, monkeypatch, plant):
    """The controls: the verification given the target's probabilities at T=1.08 instead of 1 (its
    answers then follow that joint exactly, 0.031 away: at the threshold), and each correction drawn
    from p instead of the residual max(p - q, 0)."""
    if plant == "target at T=1.08":
        planted = exact_joint(target, prompt_of(models[0]), 3, replace(SAMPLING, temperature=PLANTED_T))
        assert TV <= total_variation(planted, joint) < TV + 0.005
        monkeypatch.setattr(verify_module, "logits_to_probs",
                            lambda logits, cfg: logits_to_probs(logits, replace(cfg, temperature=PLANTED_T)))
    else:
        monkeypatch.setattr(verify_module, "_residual", lambda p, q, x: p)
    n = answers_for(TV, len(joint), ALPHA)
    p = sampled_against(joint, sample(models[0], guesser("draft", models[1]), n).answers)
    assert p < ALPHA, f"{plant} passed (p = {p:.2g})"


def sample_mtp(pair: LoadedPair, n: int) -> Sampled:
    """n answers as long as one step of the MTP head at its default draft length makes: every guess and the
    bonus token, judged whether the guesses hold or not."""
    guesser = build("mtp", pair.inputs())
    k = guesser.default_draft_length
    return sample_answers(pair.target, guesser, mtp_prompt(pair), n, SAMPLING, max_tokens=k + 1, draft_length=k)


@pytest.mark.parametrize("plant", [None, "residual from p"])
def test_mtp_at_its_default_draft_length_is_the_target_to_within_what_a_bug_of_tv_003_would_show(
        mtp, mtp_joint, monkeypatch, plant):
    """The first four tokens (three guesses and the bonus) of as many answers as see an error of 0.03, the
    MTP head drafting at its default length; the control draws each correction from p instead of the
    residual max(p - q, 0), and the same count rejects it."""
    if plant:
        monkeypatch.setattr(verify_module, "_residual", lambda p, q, x: p)
    n = answers_for(TV, len(mtp_joint), ALPHA)
    assert MtpGuesser.default_draft_length == 3 and len(mtp_joint) == 3 ** 4 and n > 19_000
    got = sample_mtp(mtp, n)
    p = sampled_against(mtp_joint, got.answers)
    if plant:
        assert p < ALPHA, f"{plant} passed (p = {p:.2g})"
        return
    assert got.rejected > n / 10 and got.accepted > n / 2 and got.bonus > n / 10, (got.rejected, got.accepted,
                                                                                    got.bonus)
    assert p > ALPHA, f"mtp: the first four tokens of {n} answers are not the target's (p = {p:.2g})"
