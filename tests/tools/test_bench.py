"""`specchat bench`'s figures that are computed, not timed: plain's answer recorded as `bench/corpus` records one
(specchat.tools.reading) and judged by the same function (specchat.tools.judging.judge). The timed run is in
tests/test_cli.py."""

from __future__ import annotations

import pytest
from fakes.model import ScriptedModel

from specchat.decoding.events import Stats, Step
from specchat.decoding.policy import CostCurve
from specchat.tools.bench import AGAIN, _report
from specchat.tools.judging import by_clock, clock_curve, judge
from specchat.tools.reading import recorded
from specchat.tools.recorded import Answer
from specchat.tools.replay import lookup_copy, oracle

FLAT = CostCurve([1.0 + 0.02 * n for n in range(16)], 0.1)
PROMPT = tuple(range(1, 21))


def modelled(answer: Answer) -> tuple[float, float, float]:
    """Plain decoding, the oracle bound and auto on the answer, in seconds by FLAT, as `bench` judges plain's."""
    judged = judge([answer], FLAT, piece=ScriptedModel(vocab=9).piece)
    return judged.plain_s, judged.oracle_s, judged.auto_s


def test_bench_bounds_plains_answer_by_the_oracle_the_corpus_quotes():
    # The answer copies the prompt's middle after a token it never had: the oracle copies from the best
    # earlier place with hindsight, its first token too, where prompt lookup's own copy starts a token late.
    answer = Answer("edit", "fit", 0.0, PROMPT, (99, *PROMPT[7:]))
    plain, bound, auto = modelled(answer)
    assert plain == pytest.approx(14 * float(FLAT.verify(1)))
    assert bound == oracle(answer, FLAT) and bound < oracle(answer, FLAT, copies=lookup_copy)
    assert bound <= auto < plain  # auto, replayed, copies the passage too, from where lookup can find it


def test_plains_answer_is_recorded_with_the_drafts_greedy_guess_at_every_position():
    draft, answer = ScriptedModel(seed=1, vocab=9), (3, 1, 4, 1, 5, 2, 6)
    plain = recorded("edit", "a prompt", 0.0, PROMPT[:5], answer, draft)
    seq = [*PROMPT[:5], *answer]
    assert plain.draft_guess == tuple(int(draft.logits(seq[:i]).argmax()) for i in range(5, len(seq)))
    assert plain.answer == answer and len(plain.draft_p) == len(answer)
    # a sampled draft's fate is not recorded
    assert recorded("edit", "a prompt", 0.7, PROMPT[:5], answer, draft).draft_guess == ()


def test_the_modelled_auto_drafts_as_the_live_one_does():
    # Nothing earlier to copy from, and a draft that guesses every token: only drafting can beat plain decoding.
    answer = Answer("open", "fit", 0.0, PROMPT, tuple(range(30, 70)), draft_guess=tuple(range(30, 70)),
                    draft_p=(0.99,) * 40)
    plain, bound, auto = modelled(answer)
    assert bound == oracle(answer, FLAT) < oracle(answer, FLAT, draft=False) == plain  # the bound drafts too
    assert auto < 0.8 * plain  # and so does auto, replayed


def step(drafted: int, verify_s: float, propose_s: float = 0.001, guesser: str = "lookup", sync_s: float = 0.0) -> Step:
    return Step((), "", drafted, 0, propose_s, verify_s, guesser if drafted else "none", sync_s=sync_s)


def test_the_clock_curve_prices_each_size_at_what_its_steps_cost_proposing_included():
    steps = [step(0, 1.0), step(0, 1.2), step(0, 1.1), *(step(2, 3.0) for _ in range(3)), step(5, 9.0),
             *(step(3, 5.0, propose_s=0.3, guesser="draft", sync_s=0.06) for _ in range(3))]
    curve = clock_curve(steps, FLAT)
    assert curve.verify_s[0] == pytest.approx(1.101)  # the mean, with what proposing took
    assert curve.verify_s[2] == pytest.approx(3.001)
    # a drafter's proposing is its drafting, charged per token (less its catching up, which the replay charges apart)
    assert curve.verify_s[3] == pytest.approx(5.0) and curve.draft_s == pytest.approx(0.08)
    # a size seen once is the prior's, scaled as the sizes seen are (the median of their ratios to it)
    ratios = sorted([1.101 / FLAT.verify_s[0], 3.001 / FLAT.verify_s[2], 5.0 / FLAT.verify_s[3]])
    assert curve.verify_s[5] == pytest.approx(ratios[1] * FLAT.verify_s[5])
    assert curve.rollback is None  # a size's mean holds what taking back cost


def test_by_the_clock_a_replay_priced_at_the_curve_it_decides_by_is_the_judged_one():
    answer = Answer("edit", "fit", 0.0, PROMPT, (99, *PROMPT[7:]))
    piece = ScriptedModel(vocab=9).piece
    assert by_clock([answer], FLAT, FLAT, float(FLAT.verify(1)), piece) == pytest.approx(judge([answer], FLAT, piece=piece).auto)
    # dearer guesses by the clock than the curve says: the same choices, a smaller speedup
    dear = CostCurve([FLAT.verify_s[0], *(1.3 * s for s in FLAT.verify_s[1:])], FLAT.draft_s)
    assert by_clock([answer], FLAT, dear, float(FLAT.verify(1)), piece) < judge([answer], FLAT, piece=piece).auto


def test_a_guesser_is_measured_against_plain_timed_on_both_sides_of_it():
    def answered(tokens_per_s: float) -> list[list[Stats]]:
        return [[Stats(n_tokens=100, steps=100, verify_s=100 / tokens_per_s)]]

    # The machine sped up during the repeat: plain at 10 tok/s before auto and 14 after it.
    runs = {"edit": {"plain": answered(10.0), "auto": answered(12.0), AGAIN: answered(14.0)}}
    report = _report(runs, {}, {}, {}, {}, {"plain": 0, "auto": 16, AGAIN: 0})["edit"]
    assert report["auto"]["speedup_vs_plain"] == pytest.approx(1.0)  # not 1.2x: it ran midway between them
    assert report[AGAIN]["speedup_vs_plain"] == pytest.approx(1.4)  # this run's noise, plain against itself
    assert report["plain"]["speedup_vs_plain"] == pytest.approx(1.0)
