"""Auto and its policy (specchat.decoding.guessers.auto, specchat.decoding.policy): the pure functions over a cost curve, and
the auto guesser's choices on given costs."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.guessers import AutoGuesser
from specchat.decoding.guessers.sources import Copy, Passage
from specchat.decoding.policy import (
    LOSS_BUDGET,
    PLACE_SHIFTS,
    START_STEPS,
    Acceptance,
    CostCurve,
    LossAccount,
    MatchAcceptance,
    Rollback,
    best_drafter,
    best_k,
    best_length,
    expected_tokens,
    keep_drafting,
    opening_s,
    rate_bound,
    tree_rate,
    tree_tokens,
)
from specchat.decoding.sampling import SamplingConfig
from specchat.tools.judging import auto_for
from specchat.tools.recorded import Answer
from specchat.tools.replay import accepted, replay

# Shapes measured on this project's machines: a 2-core CPU, where verifying 5 positions costs
# about 3.6 single steps, and a GPU-like curve that is nearly flat.
CPU = CostCurve([0.0276, 0.0437, 0.0578, 0.072, 0.100, 0.104, 0.113, 0.121, 0.135, 0.149, 0.152, 0.156,
                 0.154, 0.152, 0.150, 0.149], draft_s=0.0148)
GPU = CostCurve([0.010 + 0.0002 * n for n in range(16)], draft_s=0.001)
# A laptop GPU under CUDA (bench/curves.json): 8 positions cost 2.4 times one.
LAPTOP = CostCurve([0.010 * (1 + 0.2 * n) for n in range(16)], draft_s=0.0044)


def test_expected_tokens_matches_simulation():
    rng = np.random.default_rng(0)
    for alpha, k in [(0.6, 2), (0.8, 4), (0.9, 8)]:
        acc = rng.random((200_000, k)) < alpha
        run = np.where(acc.all(1), k, acc.argmin(1))
        assert float(expected_tokens(alpha, k)) == pytest.approx((run + 1).mean(), abs=0.02)
    assert float(expected_tokens(1.0, 4)) == 5


def test_cpu_curve_rules_out_the_draft_and_gpu_curve_drafts_long():
    k_cpu, _ = best_k(0.8, 16, CPU, CPU.draft_s)
    k_gpu, _ = best_k(0.8, 16, GPU, GPU.draft_s)
    assert k_cpu == 0
    assert k_gpu >= 4
    # Free guesses (lookup) that land almost always are worth a long proposal even on the CPU.
    assert best_k(0.95, 16, CPU, 0.0)[0] >= 8


def test_a_draft_left_idle_is_priced_with_its_catching_up():
    """A draft that has not run for 30 tokens reads them in one batch before its first guess: on a laptop's
    curve that costs more than its guesses would gain, so auto leaves it idle, where the same draft that ran
    at the last step is sent. (Ignoring the catching up, as auto did, fails the second.)"""
    plain = 1 / float(LAPTOP.verify(1))
    assert best_drafter({"draft": 0.8}, lambda name: 1, 4, LAPTOP, float("inf"), plain) is not None
    assert best_drafter({"draft": 0.8}, lambda name: 30, 4, LAPTOP, float("inf"), plain) is None


class Prepared:
    """A drafter that records the prompts it was brought up to, and is always current after."""

    keep_going = None

    def __init__(self) -> None:
        self.prepared: list[int] = []

    def prepare(self, context) -> None:
        self.prepared.append(len(context))

    def constrain(self, allowed) -> None:
        pass

    def behind(self, context) -> int:
        return 1


def test_a_draft_that_cannot_pay_is_not_brought_up_to_the_prompt():
    """On the 2-core CPU's curve a draft token costs half a step and never pays, so reading the prompt into it would
    only delay the first token; on a GPU's it pays, and it reads the prompt before the first step. (Preparing
    every drafter, as auto did, fails the first.)"""
    for curve, expected in ((CPU, []), (GPU, [40])):
        draft = Prepared()
        auto = AutoGuesser(CostCurve(list(curve.verify_s), curve.draft_s), {"draft": draft})
        auto.prepare(list(range(40)))
        assert draft.prepared == expected


def test_curve_extrapolates():
    curve = CostCurve([0.01, 0.02, 0.03])
    assert float(curve.verify(5)) == pytest.approx(0.05)


def test_draft_stops_when_its_confidence_drops():
    assert keep_drafting([0.95], GPU)
    assert not keep_drafting([0.95, 0.1], GPU)
    assert not keep_drafting([0.99], CPU)


def test_acceptance_estimate_learns_and_relaxes():
    est = Acceptance()
    for _ in range(50):
        est.observe(4, False)
    assert est.alpha > 0.95
    low = Acceptance(3.0, 4.0)
    for _ in range(50):
        low.observe(0, True)
    before = low.alpha
    for _ in range(500):
        low.relax()
    assert before < 0.1 and low.alpha == pytest.approx(0.75, abs=0.05)  # back near its own prior


def test_longer_matches_earn_longer_proposals_on_the_cpu():
    est = MatchAcceptance()
    assert best_length(est.alphas(1, 16), CPU, 0.0)[0] == 0  # a 1-token match elsewhere: not worth it
    assert best_length(est.alphas(8, 16), CPU, 0.0)[0] >= 2
    # Each guess is judged by the match it would extend, so acceptance grows along a proposal.
    assert list(est.alphas(1, 4)) == sorted(est.alphas(1, 4)) and est.alphas(1, 4)[0] < est.alphas(1, 4)[3]


def test_match_acceptance_learns_per_match_length():
    est = MatchAcceptance()
    long_before = est.alphas(10, 1)[0]
    for _ in range(30):
        est.observe(1, drafted=1, accepted=0)  # 1-token matches keep missing
    assert est.alphas(1, 1)[0] < 0.05 and est.alphas(10, 1)[0] == long_before
    for _ in range(30):
        est.observe(2, drafted=8, accepted=8)  # a copy that held from a 2-token match on
    assert est.alphas(2, 1)[0] > 0.9 and est.alphas(9, 1)[0] > 0.9


def test_best_length_with_a_constant_acceptance_is_best_k():
    for alpha in (0.3, 0.7, 0.95):
        assert best_length(np.full(16, alpha), GPU, 0.001) == best_k(alpha, 16, GPU, 0.001)


def test_the_budget_weighs_a_worst_case_by_the_chance_of_its_first_miss():
    """Every guess of a step is rejected only if its first is. So a copy whose first guess is nearly sure may risk
    more than the allowance, by the room an answer opens with at most; a likelier miss risks its worst case in
    full. On the CPU curve with 0.02 s allowed: 1 guess costs 0.0161 s at worst, 2 cost 0.0302, 3 cost 0.0444."""
    allow = 0.02
    assert allow + opening_s(CPU) < float(CPU.worst_loss(3, 0.0)[-1])
    sure, likely = np.full(8, 0.96), np.full(8, 0.8)
    assert best_length(sure, CPU, 0.0)[0] > 2 and best_length(likely, CPU, 0.0)[0] == 2  # unbounded
    assert best_length(sure, CPU, 0.0, allow)[0] == 2  # 0.04 x MISS_MARGIN of its worst case weighed; the overrun caps it at 2
    assert best_length(likely, CPU, 0.0, allow)[0] == 1  # 0.8 of it: only one guess fits
    assert best_length(np.ones(8), CPU, 0.0, 0.0)[0] == 0  # an empty account risks nothing, however sure the guess


@pytest.mark.parametrize("rollback", [None, Rollback(0.004, 0.006, 1)])
def test_the_cheap_bound_never_rules_out_a_guess_that_pays(rollback):
    """Auto skips best_length where rate_bound says no length beats a plain step (it is asked every step, and
    best_length's arrays cost tens of microseconds): the bound is never below best_length's rate, on random
    curves, acceptances and loss bounds, rollback or not. So what auto sends is what it sent without it."""
    rng = np.random.default_rng(3)
    for _ in range(500):
        curve = CostCurve(list(np.cumsum(rng.uniform(0.001, 0.05, 32))), draft_s=rng.uniform(0, 0.02),
                          rollback=rollback)
        alphas = rng.uniform(0, 1, int(rng.integers(1, 17))) ** rng.uniform(0.1, 2)
        draft_s = float(rng.choice([0.0, curve.draft_s]))
        n, rate = best_length(alphas, curve, draft_s, rng.uniform(0, 0.3), rng.uniform(0, 0.02))
        assert n == 0 or rate <= rate_bound(alphas, curve, draft_s) + 1e-12
    assert opening_s(CPU) == pytest.approx(max(START_STEPS * CPU.verify_s[0], CPU.verify_s[1] - CPU.verify_s[0]))


def test_a_trees_branches_share_one_chance_at_their_first_token():
    """The branches' first tokens differ, so at most one holds: each estimated as if sent alone, their
    chances are scaled to sum to one where they sum to more, and counted as they stand where they do not.
    The tree is priced as one step over all its nodes, within the loss budget as a single guess is."""
    sure = np.array([1.0, 1.0])
    assert tree_tokens([sure, sure]) == pytest.approx(3.0)  # one branch's two tokens and the step's own, not five
    assert tree_tokens([np.array([0.9, 0.5]), np.array([0.6])]) == pytest.approx(1 + (0.9 + 0.45 + 0.6) / 1.5)
    assert tree_tokens([np.array([0.3, 0.5]), np.array([0.2])]) == pytest.approx(1 + 0.3 + 0.15 + 0.2)
    flat, alphas = CostCurve([0.01] * 16), np.array([0.9, 0.8, 0.7])
    assert tree_rate([alphas], flat) == pytest.approx(best_length(alphas, flat, 0.0)[1])  # a lone branch is a chain
    assert tree_rate([sure, sure], CPU) == pytest.approx(3.0 / float(CPU.verify(5)))
    # Within the loss budget: a tree whose first position is likely rejected risks its worst case in full; one
    # whose first surely holds may overrun the allowance by the room an answer opens with, no more.
    worst, unsure = float(CPU.worst_loss(4, 0.0)[-1]), np.array([0.1, 0.5])
    assert tree_rate([unsure, unsure], CPU, worst) > 0 and tree_rate([unsure, unsure], CPU, worst * 0.99) == -np.inf
    overrun = worst - opening_s(CPU)
    assert tree_rate([sure, sure], CPU, overrun) > 0 and tree_rate([sure, sure], CPU, overrun * 0.99) == -np.inf


def test_auto_uses_lookup_when_copying_and_plain_when_nothing_matches():
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    copy = [5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 5, 6, 7]
    proposal = auto.propose(copy, 8, greedy, rng)
    assert proposal.guesser == "lookup" and proposal.tokens[:2] == [8, 9]
    assert auto.propose([1, 2, 3, 4], 8, greedy, rng).guesser == "none"


def test_auto_learns_to_stop_guessing_what_is_always_rejected():
    auto = AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    ctx = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3, 4, 5]  # a 5-token match: its prior says a copy should hold
    tried = 0
    for _ in range(40):
        proposal = auto.propose(ctx, 8, greedy, rng)
        if proposal.tokens:
            tried += 1
            auto.observe(len(proposal.tokens), 0)
        else:
            auto.observe(0, 0)
    assert 0 < tried < 10


def test_a_copy_auto_passes_up_is_judged_by_what_the_step_committed():
    # On the CPU curve a copy after a 1-token match is not worth sending, but the next context shows
    # whether it would have held: evidence for free, in the bucket it came from and nowhere else.
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    ctx = [5, 6, 7, 8, 1, 5]  # the earlier "5" went on with 6 7 8
    # (what the step committed, the buckets judged: 1 and 2 of a 1-token match held, a third missed)
    for committed, judged in (([6], [0]), ([9], [0]), ([6, 7, 3], [0, 1, 2])):
        auto = AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s))
        auto.prepare(ctx)
        buckets = auto.lookup_acceptance["far"].buckets
        before = [(b.accepted, b.judged) for b in buckets]
        assert auto.propose(ctx, 8, greedy, rng).guesser == "none"
        auto.observe(0, 0)
        auto.propose(ctx + committed, 8, greedy, rng)
        assert [i for i, b in enumerate(buckets) if (b.accepted, b.judged) != before[i]] == judged, committed
        assert (buckets[0].alpha > before[0][0] / before[0][1]) == (committed[0] == 6), committed
    # A copy that was sent is learned from once, by observe, not again when the next context shows it.
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    ctx = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5]
    auto.prepare(ctx)
    sent = auto.propose(ctx, 3, greedy, rng)
    assert sent.guesser == "lookup" and sent.tokens == [6, 7, 8]
    auto.observe(3, 3)
    judged = [b.judged for b in auto.lookup_acceptance["far"].buckets]
    auto.propose(ctx + [6, 7, 8, 2], 8, greedy, rng)
    assert [b.judged for b in auto.lookup_acceptance["far"].buckets] == judged


def test_auto_prefers_the_passage_being_copied_over_the_latest_occurrence():
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    context = [1, 2, 3, 7, 7, 1, 2, 4, 8, 1, 2]
    assert auto.passage.find(context) == Copy("lookup", 7, "far", 2)  # the latest "1 2" continues with 4
    auto.passage.cursor = 2  # the answer was copying from the first "1 2": it continues with 3
    assert auto.passage.find(context) == Copy("lookup", 2, "near", 2)
    # A longer match elsewhere wins over a shorter one near the cursor.
    auto.passage.cursor = 8
    assert auto.passage.find([5, 6, 1, 2, 3, 7, 7, 1, 2, 4, 8, 5, 6, 1, 2]) == Copy("lookup", 4, "far", 4)


def test_auto_guesses_a_substitution_after_an_edit_inside_a_copy():
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    passage = [10, 11, 12, 40, 13, 14, 15, 16, 17]  # 40: an identifier the answer renames to 41
    answer = passage + [99] + [10, 11]
    auto.prepare(answer)
    first = auto.propose(answer, 8, greedy, rng)
    assert first.tokens[:3] == [12, 40, 13]
    auto.observe(len(first.tokens), 1)  # 12 accepted; the target said 41, not 40
    resumed = auto.propose(answer + [12, 41], 8, greedy, rng)
    assert resumed.guesser == "lookup" and resumed.tokens[:3] == [13, 14, 15]  # copying on after 40
    # A miss at the very first guessed token may only mean the wrong occurrence: no substitution then.
    auto.prepare(answer)
    auto.propose(answer, 8, greedy, rng)
    auto.observe(len(first.tokens), 0)
    assert auto.propose(answer + [77], 8, greedy, rng).guesser == "none"


def test_auto_resumes_after_the_text_a_fixed_typo_replaced():
    pieces = {10: b" The", 11: b" app", 12: b" is", 13: b" avail", 14: b"ble", 15: b" for", 16: b" download",
              17: b" available", 99: b"\n"}
    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s), piece=pieces.__getitem__)
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    passage = [10, 11, 12, 13, 14, 15, 16]
    answer = passage + [99, 10, 11]
    auto.prepare(answer)
    first = auto.propose(answer, 8, greedy, rng)
    assert first.tokens[:3] == [12, 13, 14]
    auto.observe(len(first.tokens), 1)  # " is" accepted; the target wrote " available"
    resumed = auto.propose(answer + [12, 17], 8, greedy, rng)
    # " available" stands for " avail" "ble": copying resumes at " for", not at "ble".
    assert resumed.guesser == "lookup" and resumed.tokens[:2] == [15, 16]


def _two_places(then: int) -> list[int]:
    """Two earlier places that match the end as long (7 8 9, after different tokens), the latest going on with
    `then`, the other with 30."""
    return [100, 7, 8, 9, 30, 31, 32, 33, 34, 35, 36, 37, 60, 61, 101, 7, 8, 9, then, 41, 42, 43, 44, 45, 46, 47, 62, 63,
            102, 7, 8, 9]


def test_a_copy_whose_earlier_places_disagree_is_sent_shorter_in_a_greedy_answer():
    """Where the other places that match as long go on differently, the copy is one guess among several: auto
    trusts it less (policy.PLACE_SHIFTS), in greedy answers; sampled ones are not shifted."""
    sent = {}
    for then in (30, 40):
        for sampling in (SamplingConfig(), SamplingConfig(0.7, seed=1)):
            auto, context = AutoGuesser(LAPTOP), _two_places(then)
            auto.prepare(context)
            sent[then, sampling.greedy] = len(auto.propose(context, 16, sampling, np.random.default_rng(0)).tokens)
    assert sent[30, True] > sent[40, True] >= 1, sent
    assert sent[30, False] == sent[40, False] == sent[30, True], sent


def test_a_copys_place_is_read_off_the_matches_and_the_prompts_end():
    context = _two_places(40)
    passage = Passage()
    passage.restart(prompt_end=18)  # the answer began where the second place goes on: a copy from the answer
    copy = passage.find(context)
    assert copy is not None and copy.start == 18 and copy.m == 3
    assert passage.place(context, copy) == (0.5, False, len(context) - 18)
    passage.restart(prompt_end=len(context))
    assert passage.place(context, passage.find(context)) == (0.5, True, len(context) - 18)
    assert passage.place(_two_places(30), passage.find(_two_places(30)))[0] == 1.0
    # At the fit fold's means the shift is nothing; agreeing places raise a copy's estimate, disagreeing ones lower it.
    shift = PLACE_SHIFTS[True]
    assert shift is not None and PLACE_SHIFTS[False] is None
    assert shift.shift(*shift.means[:2], round(np.exp(shift.means[2]))) == pytest.approx(0.0, abs=0.01)
    assert shift.shift(1.0, True, 14) > 0 > shift.shift(0.5, True, 14)


# A chat as token ids: 1 and 2 stand for <|im_start|> and <|im_end|>, control tokens, which llama.cpp gives no text;
# 3 for the role "assistant", 4 for a newline. Both questions end with 72, as two questions may end with "?".
def _piece(token: int) -> bytes:
    return b"" if token in (1, 2) else b"<%d>" % token


SECOND_TURN = [1, 8, 4, 90, 2, 4,  # the system message
               1, 9, 4, 70, 71, 72, 2, 4,  # the first question
               1, 3, 4, 50, 51, 52, 53, 2, 4,  # the first answer
               1, 9, 4, 80, 81, 72, 2, 4,  # the second question
               1, 3, 4]  # the header the second answer follows


def test_a_match_stops_at_the_chat_templates_structure():
    passage = Passage(piece=_piece)
    passage.restart(len(SECOND_TURN))
    # The header "assistant\n" and what precedes it match where the first answer began, six tokens back; they say only
    # that both are answers: one token of match.
    assert Passage().find(SECOND_TURN) == Copy("lookup", 17, "far", 6)
    assert passage.find(SECOND_TURN).m == 1
    # Once the answer opens as the first did, its own tokens count.
    assert passage.find(SECOND_TURN + [50, 51]) == Copy("lookup", 19, "far", 3)
    # A control token inside the answer stops a match too, and raw text (nothing without text) does not.
    assert passage.find(SECOND_TURN + [50, 2, 51]).m == 1
    raw = Passage(piece=_piece)
    raw.restart(5)
    assert raw.find([70, 71, 72, 73, 74, 70, 71, 72]).m == 3


def test_a_chats_second_answer_does_not_open_on_a_copy_of_the_first():
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    blind = AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s))  # no tokens' text: the header is a long match
    blind.prepare(SECOND_TURN)
    assert blind.propose(SECOND_TURN, 8, greedy, rng).tokens[:1] == [50]
    auto = AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s), piece=_piece)
    auto.prepare(SECOND_TURN)
    assert auto.propose(SECOND_TURN, 8, greedy, rng).guesser == "none"


def test_a_token_the_answer_wrote_as_another_is_copied_so_until_a_step_rejects_it():
    """A rename seen once is written by later copies; a swap that a step rejects is dropped."""
    prompt = [10, 11, 12, 40, 13, 14, 15, 16, 40, 17, 18, 99]  # 40: an identifier the answer renames to 41
    passage = Passage()
    passage.restart(prompt_end=len(prompt))
    context = prompt + [10, 11]
    copy = passage.find(context)
    assert passage.guesses(context, copy, 3) == [12, 40, 13]
    passage.landed(copy.start, 3, 1)  # 12 held; the target wrote 41 for 40
    context += [12, 41]
    copy = passage.find(context)
    passage.landed(copy.start, 2, 2)
    assert passage.swaps.written == {}  # a swap only once the answer has gone on with the passage after it
    context += [13, 14, 15]
    copy = passage.find(context)
    assert passage.swaps.written == {(40,): (41,)}
    assert passage.guesses(context, copy, 4) == [16, 41, 17, 18]
    passage.landed(copy.start, 4, 1)  # 16 held; here the target did not write 41
    assert passage.swaps.written == {} and passage.cursor == 8
    passage.restart(prompt_end=5)  # a new answer starts with none; one rejected as a copy's first guess is dropped
    assert passage.swaps.written == {}
    passage.swaps.add((40,), (41,))
    context = [10, 11, 40, 13, 99, 10, 11]
    copy = passage.find(context)
    assert passage.guesses(context, copy, 2) == [41, 13]
    passage.landed(copy.start, 2, 0)
    assert passage.swaps.written == {}
    # Where the answer does not go on with the passage, what it wrote is no swap (an insertion, a rewording).
    passage.restart(prompt_end=len(prompt))
    context = prompt + [10, 11]
    passage.landed(passage.find(context).start, 3, 1)
    context += [12, 41]
    passage.find(context)
    for more in (77, 78, 79, 80, 81, 13, 14):
        passage.find(context := [*context, more])
    assert passage.swaps.written == {}


def test_a_copy_through_a_swap_writes_the_longest_and_keeps_its_place_in_the_passage():
    prompt = [10, 11, 12, 40, 41, 13, 14, 15, 99]
    passage = Passage()
    passage.restart(prompt_end=len(prompt))
    passage.swaps.add((40, 41), (42,))  # two tokens written as one: the longer span is the one the answer changed
    passage.swaps.add((40,), (50,))
    context = prompt + [10, 11]
    copy = passage.find(context)
    assert passage.guesses(context, copy, 4) == [12, 42, 13, 14]
    passage.landed(copy.start, 4, 3)  # 12 42 13 held, 14 did not: the passage's 14 is at 6, not 2 + 3
    assert passage.cursor == passage.replaced == 6


@pytest.mark.parametrize("old, new", [((40,), (41,)), ((40, 41), (42, 43)), ((40,), (42, 43)), ((40, 41), (42,))],
                         ids=["one for one", "two for two", "two for one", "one for two"])
def test_a_renamed_identifier_ends_one_copy_not_every_one(old: tuple[int, ...], new: tuple[int, ...]):
    """Replayed: a passage that uses one name six times, copied with it changed (a renamed identifier, a changed
    name). Once the answer has changed it, copies through its later uses write the new name and hold."""
    rng = np.random.default_rng(5)
    passage: list[int] = []
    for _ in range(6):
        passage += [*rng.integers(100, 900, 18).tolist(), *old]
    renamed: list[int] = []
    uses = []  # where in the answer each use of the new name begins
    for at in range(0, len(passage), 18 + len(old)):
        renamed += passage[at:at + 18]
        uses.append(len(renamed))
        renamed += new
    answer = Answer("edit", "held-out", 0.0, tuple([1, *passage, 2]), tuple(renamed))
    auto = auto_for(answer, LAPTOP)
    at, missed, observe = 0, set(), auto.observe  # where in the answer each step begins; uses a copy missed

    def counting(drafted: int, accepted: int, span_s: float | None = None) -> None:
        nonlocal at
        wrong = at + accepted
        if accepted < drafted:
            missed.update(use for use in uses if use <= wrong < use + len(new))
        at += accepted + 1
        observe(drafted, accepted, span_s)

    auto.observe = counting  # type: ignore[method-assign]
    replay(answer, LAPTOP, auto)
    assert missed == {uses[0]}, (missed, uses)


def test_auto_verifies_two_continuations_as_a_tree_only_where_the_curve_makes_it_pay():
    # "1 2" was followed once by 3 4 5 and once by 7 8 9: two places to copy from that disagree.
    context = [1, 2, 3, 4, 5, 0, 1, 2, 7, 8, 9, 0, 6, 1, 2]
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    flat = CostCurve([0.01] * 16)  # verifying more positions costs nothing more: a second branch is free
    proposal = AutoGuesser(flat, tree_branches=4).propose(context, 8, greedy, rng)
    assert proposal.guesser == "tree" and proposal.tree is not None
    tree = proposal.tree
    firsts = sorted(tree.tokens[i] for i in tree.children(-1))
    assert firsts == [3, 7] and proposal.tokens == list(tree.tokens)
    # each branch is the copy, as a chain under its first token
    assert sorted([tree.tokens[n] for n in tree.path(leaf)] for leaf in range(len(tree.tokens))
                  if not tree.children(leaf))[0][:3] == [3, 4, 5]
    # A cache that cannot hold two sequences, or this CPU's curve: one copy, no tree.
    assert AutoGuesser(flat).propose(context, 8, greedy, rng).guesser == "lookup"
    assert AutoGuesser(CostCurve(list(CPU.verify_s), CPU.draft_s), tree_branches=4).propose(
        context, 8, greedy, rng).tree is None


def test_auto_credits_the_branch_of_a_tree_that_held():
    context = [1, 2, 3, 4, 5, 0, 1, 2, 7, 8, 9, 0, 6, 1, 2]
    auto = AutoGuesser(CostCurve([0.01] * 16), tree_branches=4)
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    proposal = auto.propose(context, 8, greedy, rng)
    tree = proposal.tree
    assert tree is not None
    drafted = {tree.tokens[c]: 1 + sum(1 for i in range(len(tree.tokens)) if c in tree.path(i)[:-1])
               for c in tree.children(-1)}  # each branch's length, by its first token
    heard = []
    auto.lookup_acceptance["far"].observe = lambda m, d, a: heard.append((d, a))
    auto.observe(len(proposal.tokens), 3)  # three tokens of one branch held
    assert heard == []  # which one is not known yet
    auto.propose(context + [7, 8, 9, 0], 8, greedy, rng)  # the next step shows it: 7 8 9
    # the branch that held is credited with them, the other with a miss; copying goes on from there
    assert sorted(heard) == sorted([(drafted[3], 0), (drafted[7], 3)])
    assert auto.passage.cursor == context.index(7) + 3


def test_a_tree_that_ended_a_generation_is_not_credited_from_the_next_one():
    context = [1, 2, 3, 4, 5, 0, 1, 2, 7, 8, 9, 0, 6, 1, 2]
    auto = AutoGuesser(CostCurve([0.01] * 16), tree_branches=4)
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    assert auto.propose(context, 8, greedy, rng).tree is not None
    heard = []
    auto.lookup_acceptance["far"].observe = lambda m, d, a: heard.append((d, a))
    auto.observe(6, 3)
    other = [4, 4, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]  # a new prompt: position 15 says nothing
    auto.prepare(other)
    auto.propose(other, 8, greedy, rng)
    assert heard == []


def _adversarial(seed: int = 27, n: int = 500, vocabulary: int = 8) -> Answer:
    """Text over a few tokens: earlier matches abound and their continuations are right only by chance, so
    every prior that trusts a long match is wrong here."""
    seq = np.random.default_rng(seed).integers(0, vocabulary, n).tolist()
    return Answer("open", "held-out", 0.0, tuple(seq[:100]), tuple(seq[100:]))


@pytest.mark.parametrize("curve", [CPU, LAPTOP], ids=["cpu", "laptop"])
def test_the_loss_budget_holds_auto_near_plain_whatever_its_priors(monkeypatch, curve):
    answer = _adversarial()
    plain = float(curve.verify(1)) * len(answer.answer)
    auto = auto_for(answer, curve)
    # At worst the budget's share of the answer's plain time is lost, the room it opens with, and one overrun of it.
    floor = plain / (plain + LOSS_BUDGET * plain + 2 * opening_s(curve))
    seconds, _ = replay(answer, curve, auto)
    assert plain / seconds >= floor - 1e-9
    assert auto.account.gained < 0  # it did guess, and lost: the floor is the budget's, not plain decoding's
    # The control: the same text without the budget loses more than the budget allows.
    monkeypatch.setattr(LossAccount, "allowance", lambda self, plain_s: float("inf"))
    unbudgeted, _ = replay(answer, curve, auto_for(answer, curve))
    assert plain / unbudgeted < floor


def test_the_loss_budget_lets_a_copy_that_pays_run_long():
    # A passage copied whole: once its first guesses hold, the gain pays for long ones.
    passage = np.random.default_rng(3).integers(10, 500, 120).tolist()
    answer = Answer("rewrite", "held-out", 0.0, tuple([1, *passage, 2]), tuple(passage))
    seconds, steps = replay(answer, CPU, auto_for(answer, CPU))
    assert float(CPU.verify(1)) * len(passage) / seconds > 2.0 and steps < len(passage) / 4


def _timed_replay(answer: Answer, curve: CostCurve, auto: AutoGuesser, slower: float, extra_s: float,
                  told: bool = True) -> float:
    """The answer decoded under auto unseeded, each step taking `slower` times the curve's price (a machine
    slower than at calibration) and `extra_s` more where it guessed (what the curve leaves out: proposing,
    taking back); auto is told each step's time (`told`) or not. Returns the seconds by that clock."""
    seq, start = answer.seq, len(answer.prompt)
    sampling, rng = SamplingConfig(answer.temperature), np.random.default_rng(0)
    auto.prepare(seq[:start])
    i, seconds = start, 0.0
    while i < len(seq):
        guess = auto.propose(seq[:i], min(16, len(seq) - i - 1), sampling, rng)
        kept = accepted(guess.tokens, seq, i)
        span = slower * curve.spent_s(len(guess.tokens), kept, 0.0) + (extra_s if guess.tokens else 0.0)
        auto.observe(len(guess.tokens), kept, span if told else None)
        seconds += span
        i += kept + 1
    return seconds


@pytest.mark.parametrize("curve", [LAPTOP, GPU], ids=["laptop", "gpu"])  # (on the CPU's, this text is hardly guessed)
def test_the_budget_holds_by_the_clock_where_guessing_costs_more_than_the_curve_says(curve):
    """Unseeded, the account settles each step at its measured time against plain steps timed alike: on a
    text where every prior is wrong, with every step 1.3 times its calibrated price and a guessing step
    a third of a plain step dearer still, auto ends within the budget of plain decoding by the clock. The
    control: settled by the curve, as under a seed, the same run loses more than that."""
    answer, slower, extra = _adversarial(), 1.3, float(curve.verify(1)) / 3
    plain = slower * float(curve.verify(1)) * len(answer.answer)
    auto = auto_for(answer, curve)
    floor = plain / (plain + LOSS_BUDGET * plain + 2 * slower * opening_s(curve))
    seconds = _timed_replay(answer, curve, auto, slower, extra)
    assert auto.account.gained < 0 < auto.account.plain  # it guessed, and lost
    assert plain / seconds >= floor - 1e-9
    assert plain / _timed_replay(answer, curve, auto_for(answer, curve), slower, extra, told=False) < floor


def test_the_account_prices_each_step_by_the_curve_under_a_seed():
    account = AutoGuesser(CPU).account
    account.settle(3, float(CPU.verify(3)), float(CPU.verify(1)))  # 3 tokens for the price of verifying 3
    assert account.gained == pytest.approx(3 * float(CPU.verify(1)) - float(CPU.verify(3)))
    account.start()
    assert account.gained == 0 and account.total_gained == pytest.approx(3 * CPU.verify_s[0] - CPU.verify_s[2])


def test_auto_takes_a_plain_step_when_it_has_gone_long_without_one():
    """A long, sure copy would guess at every step; a plain step every PLAIN_EVERY keeps what plain decoding
    costs now measured (the speedup's baseline), and loses a step's extra tokens at most."""
    from specchat.decoding.guessers.auto import PLAIN_EVERY

    auto = AutoGuesser(CostCurve(list(GPU.verify_s), GPU.draft_s))
    greedy, rng = SamplingConfig(), np.random.default_rng(0)
    text = list(range(10, 1200))
    context = text + text[:4]  # the answer copies the prompt, and every guess holds
    auto.prepare(context)
    plain = []
    for n in range(3 * PLAIN_EVERY):
        proposal = auto.propose(context, 4, greedy, rng)
        plain += [n] if not proposal.tokens else []
        auto.observe(len(proposal.tokens), len(proposal.tokens))
        context += proposal.tokens + [text[len(context) - len(text) + len(proposal.tokens)]]
    assert plain == [PLAIN_EVERY, 2 * PLAIN_EVERY + 1]
