"""A guesser replayed on a fixed text, and the oracle that bounds it (specchat.tools.replay): no model,
made-up answers whose every guess's fate is known."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.guessers import AutoGuesser, BaseGuesser, Proposal
from specchat.decoding.policy import CostCurve, Rollback
from specchat.decoding.sampling import SamplingConfig
from specchat.tools.recorded import Answer
from specchat.tools.replay import lookup_copy, lookup_hits_by_match, oracle, replay

CPU = CostCurve([1.0, 1.57, 2.07, 2.7, 3.22, 3.55, 3.97, 4.4, 4.77, 4.97, 5.04, 5.11, 5.14, 5.18, 5.21, 5.26], 0.54)
FLAT = CostCurve([1.0 + 0.02 * n for n in range(16)], 0.1)
GPU = CostCurve([0.010 + 0.0002 * n for n in range(16)], draft_s=0.001)
PROMPT = tuple(range(1, 21))


def test_lookup_hits_by_match_length():
    # After "1 2 3 4", the answer "1 2 3 5": a 1-, 2- and 3-token match, the last one guessing wrong.
    assert lookup_hits_by_match([1, 2, 3, 4, 1, 2, 3, 5], 4) == [(1, True), (2, True), (3, False)]


def test_modelled_time_of_auto_on_a_fixed_text():
    curve = CostCurve(list(GPU.verify_s), GPU.draft_s)
    plain = 20 * float(curve.verify(1))
    # An answer that copies the prompt: auto's guesses land, and the modelled time falls well below plain.
    copied = Answer("rewrite", "fit", 0.0, PROMPT, PROMPT)
    seconds, _ = replay(copied, curve, AutoGuesser(CostCurve(list(curve.verify_s))))
    assert seconds < plain / 2 and seconds >= oracle(copied, curve) - 1e-9
    # An answer with nothing to copy: every step is a plain one.
    fresh = Answer("open", "fit", 0.0, PROMPT, tuple(range(21, 41)))
    seconds, steps = replay(fresh, curve, AutoGuesser(CostCurve(list(curve.verify_s))))
    assert seconds == pytest.approx(plain) and steps == 20


class Wrong(BaseGuesser):
    """Guesses one token no answer holds at every step, and keeps the sampling it was asked under."""

    default_draft_length = 4

    def __init__(self) -> None:
        self.heard: list[SamplingConfig] = []

    def propose(self, context, k, sampling, rng):  # type: ignore[no-untyped-def]
        self.heard.append(sampling)
        return Proposal([-1][:k], None, "lookup")


def test_a_replay_guesses_at_the_answers_temperature_under_a_seed():
    # A sampled answer is replayed as it was sampled (auto keeps apart what copies make of greedy and of
    # sampled text), and under a seed, so that auto's account prices its drafters by the curve.
    wrong = Wrong()
    replay(Answer("open", "fit", 0.7, PROMPT, (5, 6, 7)), CPU, wrong)
    assert [(s.temperature, s.seed) for s in wrong.heard] == [(0.7, 0)] * 3


def test_a_replay_charges_taking_back_a_rejected_guess_where_the_cache_cannot_drop_it():
    # A recurrent model's cache: every rejected guess costs saving the state, restoring it and decoding the
    # pending token again, as auto's account and the live step pay.
    rollback = CostCurve(list(CPU.verify_s), CPU.draft_s, rollback=Rollback(save_s=0.1, restore_s=0.2))
    seconds, steps = replay(Answer("open", "fit", 0.0, PROMPT, (5, 6, 7)), rollback, Wrong())
    one_miss = 1.57 + 0.1 + 0.2 + 1.0  # verify two positions, save, restore, decode the one kept again
    assert steps == 3 and seconds == pytest.approx(2 * one_miss + 1.0)  # the last step has no room to guess


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


def test_the_oracle_bound_is_never_slower_than_plain_decoding():
    """Knowing what the target accepts, the oracle copies only where that costs less per token: on a
    curve from a busy machine, where verifying two positions costs more than two plain steps, it decodes
    plainly (copying every accepted guess gave 0.89x plain in CI)."""
    busy = CostCurve([0.02, 0.05, 0.07, 0.075] + [0.08] * 12)
    # "5 6" stands in the prompt: both would hold, but 3 positions cost 0.07 against 3 plain steps' 0.06.
    assert oracle(Answer("edit", "fit", 0.0, PROMPT, (5, 6, 30, 31)), busy) == pytest.approx(4 * 0.02)
    copied = Answer("rewrite", "fit", 0.0, PROMPT, PROMPT)
    assert oracle(copied, busy) < 20 * 0.02  # long copies still pay
    assert oracle(copied, CPU) <= 20 * float(CPU.verify(1))


def test_the_oracle_knows_where_a_copy_starts_and_lookups_own_copy_does_not():
    # The answer copies the prompt's middle, "8 9 ... 20", after a token it never had. Prompt lookup's
    # copy needs the text before to match: it finds the passage from its second token on. The oracle copies
    # from the best earlier place with hindsight: the passage's first token too, in one step fewer.
    a = Answer("edit", "fit", 0.0, PROMPT, (99, *PROMPT[7:]))
    assert lookup_copy(a.seq, 21) == 0 and lookup_copy(a.seq, 22) == 12  # at "8": nothing; from "9" on, all
    assert oracle(a, FLAT) == pytest.approx(float(FLAT.verify(1)) + float(FLAT.verify(14)))
    assert oracle(a, FLAT, copies=lookup_copy) == pytest.approx(2 * float(FLAT.verify(1)) + float(FLAT.verify(13)))


def test_the_recorded_draft_catches_up_as_the_real_one_does():
    """The replay charges a draft's catching up as the engine pays it: after prepare it reads only the last
    token; after plain steps, each token it missed; after its own guesses, only what followed the last of
    them that went through its cache. A planted bug (behind always 1) fails the second figure."""
    from specchat.tools.judging import RecordedDraft

    curve = CostCurve([0.01 * (1 + 0.2 * n) for n in range(16)], draft_s=0.004)
    answer = Answer("open", "fit", 0.0, (1, 2, 3), (4, 5, 6, 7, 8, 9), (4, 5, 6, 0, 8, 9), (0.9,) * 6)
    draft = RecordedDraft(answer, curve)
    draft.prepare([1, 2, 3])
    assert draft.behind([1, 2, 3]) == 1
    assert draft.behind([1, 2, 3, 4, 5]) == 2  # two plain steps: 4 and 5 unread
    proposal = draft.propose([1, 2, 3, 4, 5], 3, SamplingConfig(), np.random.default_rng(0))
    assert proposal.tokens == [6, 0, 8] and proposal.sync_s == pytest.approx(curve.catch_up_s("draft", 2))
    assert proposal.sync_s > 0
    assert draft.behind([1, 2, 3, 4, 5, 6, 7]) == 1  # 6 held, 7 corrected the 0: only 7 to read
