"""Recorded answers and auto replayed on them (specchat.tools.corpus): no model, made-up answers whose
every guess's fate is known."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specchat.decoding.policy import CostCurve, Priors
from specchat.errors import SpecchatError
from specchat.tools.corpus import Answer, auto_for, fit_priors, fold, judge, load_answers, oracle, replay

CPU = CostCurve([1.0, 1.57, 2.07, 2.7, 3.22, 3.55, 3.97, 4.4, 4.77, 4.97, 5.04, 5.11, 5.14, 5.18, 5.21, 5.26], 0.54)
FLAT = CostCurve([1.0 + 0.02 * n for n in range(16)], 0.1)


def test_a_prompt_falls_in_the_same_fold_everywhere():
    assert fold("Translate this notice into Spanish.") == fold("Translate this notice into Spanish.")
    folds = [fold(f"prompt {n}") for n in range(200)]
    assert 70 < folds.count("fit") < 130  # about half each, from the hash


def test_the_oracle_takes_the_draft_only_where_its_tokens_are_cheap_enough():
    rng = np.random.default_rng(0)
    answer = rng.permutation(np.arange(100, 900))[:60].tolist()  # no token twice: nothing to copy
    guesses = [t if i % 10 else 0 for i, t in enumerate(answer)]  # the draft misses every tenth token
    a = Answer("open", "fit", 0.0, (1, 2, 3), tuple(answer), tuple(guesses), (0.9,) * 60)
    plain = len(answer)
    # Nothing to copy from: what the oracle gains is the draft's, on a flat curve where a draft token costs 0.1.
    assert plain / oracle(a, FLAT) > 2.5
    assert oracle(a, FLAT, draft=False) == pytest.approx(plain)
    # Where a draft token costs 0.54 of a step and verifying 4 costs 2.7, even a 90% draft only just pays.
    assert plain / oracle(a, CPU) < 1.1


def test_replay_follows_the_recorded_draft_and_auto_learns_to_use_it():
    rng = np.random.default_rng(1)
    answer = rng.integers(100, 900, 200).tolist()
    a = Answer("open", "fit", 0.0, (1, 2, 3), tuple(answer), tuple(answer), (0.95,) * 200)  # a perfect draft
    seconds, steps = replay(a, FLAT, auto_for(a, FLAT, Priors(drafter=0.8)))
    assert steps < 200 / 3 and len(answer) * 1.0 / seconds > 2.0
    # The same answer with a draft that is always wrong: auto stops drafting within its loss budget.
    wrong = Answer("open", "fit", 0.0, (1, 2, 3), tuple(answer), tuple(t + 1 for t in answer), (0.95,) * 200)
    seconds, _ = replay(wrong, FLAT, auto_for(wrong, FLAT, Priors(drafter=0.8)))
    assert len(answer) / seconds > 0.95


def test_fitting_the_priors_finds_that_copies_hold_on_text_that_copies():
    rng = np.random.default_rng(2)
    answers = []
    for n in range(4):  # edits: a passage copied with one word changed in every 40 tokens
        passage = rng.integers(100, 900, 160).tolist()
        copy = [t if i % 40 != 39 else t + 1 for i, t in enumerate(passage)]
        answers.append(Answer("edit", "fit", 0.0, tuple([1, *passage, 2]), tuple(copy)))
    start = Priors()
    fitted = fit_priors(answers, [CPU], start, ["long"], rounds=1)
    assert fitted.match[3] > start.match[3]
    assert judge(answers, CPU, fitted, bound=False).auto > judge(answers, CPU, start, bound=False).auto


def test_a_damaged_recording_is_one_line_that_says_what_to_do(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"task": "open", "fold": "fit", "temperature": 0.0, "prompt": [1]}) + "\n")
    with pytest.raises(SpecchatError, match=r"answers.jsonl:1: not a recorded answer .*record again with bench/corpus"):
        load_answers(path)
    with pytest.raises(SpecchatError, match="cannot read recorded answers"):
        load_answers(tmp_path / "missing.jsonl")


def test_the_signals_at_a_position_know_nothing_of_it_or_after():
    # What a controller knows before verifying position i may come only from the text and the target's
    # confidences before i: a signal that read position i itself would predict its own label.
    from specchat.tools.predict import SIGNALS, position_signals

    rng = np.random.default_rng(2)
    prompt = tuple(rng.integers(10, 30, 40).tolist())
    answer = rng.integers(10, 30, 50).tolist()
    conf = rng.uniform(0.05, 0.99, 50).tolist()
    base = Answer("rewrite", "fit", 0.0, prompt, tuple(answer), tuple(answer), (0.5,) * 50, tuple(conf))
    rows, bucket, held = position_signals(base)
    assert set(rows) == set(SIGNALS) and (bucket >= 0).sum() > 40  # most positions have a match to copy
    for t in (0, 17, 49):
        changed = list(answer), list(conf)
        changed[0][t], changed[1][t] = 99, 0.5  # a token no earlier text holds, at another confidence
        after = position_signals(Answer("rewrite", "fit", 0.0, prompt, tuple(changed[0]), tuple(changed[0]),
                                        (0.5,) * 50, tuple(changed[1])))
        for name in SIGNALS:
            assert np.array_equal(after[0][name][:t + 1], rows[name][:t + 1]), (name, t)
        assert np.array_equal(after[1][:t + 1], bucket[:t + 1])
        assert not after[2][t] and np.array_equal(after[2][:t], held[:t])  # its own fate is the new token's
    # And what they say, on a text small enough to read: "5 6 7 | 5 6 8": copies hold at 6, miss at 8.
    small = Answer("edit", "fit", 0.0, (5, 6, 7), (5, 6, 8, 1), (5, 6, 7, 1), (0.5,) * 4, (0.9, 0.8, 0.3, 0.2))
    rows, bucket, held = position_signals(small)
    assert bucket.tolist() == [-1, 0, 1, -1] and held.tolist() == [False, True, False, False]
    assert rows["confidence"][2] == pytest.approx(np.log(0.8 / 0.2)) and rows["recent"][2] == pytest.approx(
        np.log(0.85 / 0.15))
    assert rows["run"].tolist() == pytest.approx([0, 0, np.log(2), 0]) and rows["copied"][3] == pytest.approx(1 / 3)
    assert rows["draft"].tolist() == [0, 1, 1, 0]  # the draft guesses what the copy does, right (6) or not (7)
    # Both copies come from the prompt's one "5 6 7", 3 tokens back; at 8 nothing earlier matches.
    assert rows["agree"].tolist() == [0, 1, 1, 0] and rows["places"].tolist() == [0, 0, 0, 0]
    assert rows["prompt"].tolist() == [0, 1, 1, 0] and rows["distance"].tolist() == pytest.approx([0, np.log(3), np.log(3), 0])
    # Two earlier places after "1": one goes on with 2, the other with 3; the latest (3) is copied.
    rows = position_signals(Answer("edit", "fit", 0.0, (1, 2, 1, 3), (1, 4), (0, 0), (0.5,) * 2, (0.9, 0.8)))[0]
    assert rows["agree"][1] == 0.5 and rows["places"][1] == pytest.approx(np.log(2)) and rows["prompt"][1] == 1


def test_the_logistic_fit_recovers_the_weights_that_made_the_data():
    from specchat.tools.predict import fit_logistic

    rng = np.random.default_rng(3)
    x = np.column_stack([np.ones(20_000), rng.normal(size=20_000)])
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(x @ np.array([0.5, -2.0]))))).astype(float)
    assert fit_logistic(x, y) == pytest.approx([0.5, -2.0], abs=0.1)


def test_the_drafts_check_stops_a_copy_where_the_draft_disagrees_and_is_charged_for():
    # A one-token edit inside a copied passage: lookup's copy misses at the edit, and the draft (whose
    # guesses are the answer) says so. Checked by the draft, the copy stops there; its checks cost draft tokens.
    from specchat.tools.predict import Checked, Predicted

    prompt = tuple(range(10, 40))
    answer = (*prompt[:10], 99, *prompt[11:])
    a = Answer("edit", "fit", 0.0, prompt, answer, answer, (0.5,) * len(answer), (0.5,) * len(answer))
    sure = np.full(8, 5.0)  # the match length alone: every copied token holds
    with_draft = np.concatenate([np.full(8, -5.0), [10.0]])  # a copied token holds where the draft agrees
    free, paid = CostCurve(FLAT.verify_s, 0.0), CostCurve(FLAT.verify_s, 0.5)
    unchecked, _ = replay(a, free, Predicted(a, sure, [], free))
    checked = Checked(a, with_draft, sure, free, gate=0.0, span=16)
    assert replay(a, free, checked)[0] < unchecked and checked.check_s == 0.0
    charged = Checked(a, with_draft, sure, paid, gate=0.0, span=16)
    assert replay(a, paid, charged)[0] == replay(a, free, Checked(a, with_draft, sure, free, gate=0.0, span=16))[0]
    assert charged.check_s >= 2 * 0.5  # at least the check at the passage's start and the one after the edit
    never = Checked(a, with_draft, sure, paid, gate=1.0, span=16)  # no first token is that sure: never checked
    assert replay(a, paid, never)[0] == unchecked and never.check_s == 0.0
