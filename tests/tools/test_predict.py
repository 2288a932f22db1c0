"""Which signals predict a copy's fate (specchat.tools.predict): no model, made-up answers whose every
guess's fate is known."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.policy import CostCurve
from specchat.tools.predict import SIGNALS, Checked, Predicted, fit_logistic, position_signals
from specchat.tools.recorded import Answer
from specchat.tools.replay import replay

FLAT = CostCurve([1.0 + 0.02 * n for n in range(16)], 0.1)


def test_the_signals_at_a_position_know_nothing_of_it_or_after():
    # What a controller knows before verifying position i may come only from the text and the target's
    # confidences before i: a signal that read position i itself would predict its own label.
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
    rng = np.random.default_rng(3)
    x = np.column_stack([np.ones(20_000), rng.normal(size=20_000)])
    y = (rng.random(20_000) < 1 / (1 + np.exp(-(x @ np.array([0.5, -2.0]))))).astype(float)
    assert fit_logistic(x, y) == pytest.approx([0.5, -2.0], abs=0.1)


def test_the_drafts_check_stops_a_copy_where_the_draft_disagrees_and_is_charged_for():
    # A one-token edit inside a copied passage: lookup's copy misses at the edit, and the draft (whose
    # guesses are the answer) says so. Checked by the draft, the copy stops there; its checks cost draft tokens.
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
