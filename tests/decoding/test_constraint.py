"""Exactness under a grammar: with a constraint, speculative sampling gives the *constrained* target's
distribution (the target's, masked to what the grammar allows and renormalised), whatever the guesses, on
scripted models with a real llguidance matcher over their letters. The joint distribution of the first three
tokens at T=1 against the exact one, with a draft that proposes refused tokens, one whose own
distribution is masked under the grammar, lookup copying refused text, and a tree of both; a planted bug (the mask applied to
the draft but not to the target's rule) must fail. Then the matcher's bookkeeping: consumed and rolled back
in step with the cache, a refused copy cut, the end allowed only where the grammar accepts."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from fakes import ScriptedModel
from fakes import tokenizer as toy
from pooled import chi_square

import specchat.decoding.verify as verify_module
from specchat.decoding.constraint import Constraint
from specchat.decoding.engine import Engine, GenerationConfig, final, fitted
from specchat.decoding.guessers import AutoGuesser, DraftGuesser, LookupGuesser, Proposal
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig, logits_to_probs, masked, sample
from specchat.decoding.verify import Tree, verify_logits
from specchat.errors import SpecchatError

V = ScriptedModel().n_vocab  # six tokens, 'a' to 'f'
# What the grammar allows at each of the first positions: a different half of the vocabulary each time, so
# that a draft or a copy often guesses a refused token. It accepts only after five tokens, past max_tokens.
ALLOWED = ({0, 1, 2}, {1, 3, 4}, {0, 2, 4}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4})
GRAMMAR = 'start: /[abc][bde][ace][a-e]{2,}/'
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # lookup proposes 3 ('d', refused first), 1, 2, ... here
TARGET_SEED, DRAFT_SEED = 11, 12
N = 2000


def p_value(counts: np.ndarray, want: np.ndarray) -> float:
    """The chi-square's p-value over the cells the grammar allows; 0 if a refused cell was ever seen."""
    return 0.0 if counts[want == 0].any() else chi_square(counts[want > 0], want[want > 0])


def constraint() -> Constraint:
    return Constraint.lark(GRAMMAR, toy.letters(V), "the test grammar")


def mask(position: int) -> np.ndarray:
    return np.isin(np.arange(V), sorted(ALLOWED[position]))


def exact_first_three(target: ScriptedModel) -> np.ndarray:
    """The constrained target's joint distribution of the first three tokens, cell (a * V + b) * V + c."""
    joint = np.zeros(V ** 3)
    for a, b, c in itertools.product(range(V), repeat=3):
        p, context = 1.0, list(PROMPT)
        for i, t in enumerate((a, b, c)):
            p *= logits_to_probs(masked(target.logits(context), mask(i)), SamplingConfig(1.0))[t]
            context.append(t)
        joint[(a * V + b) * V + c] = p
    return joint


def sample_first_three(target, guesser, k: int, n: int = N) -> tuple[np.ndarray, int, int]:
    engine, grammar = Engine(target, guesser), constraint()
    counts, rejected, accepted = np.zeros(V ** 3), 0, 0
    for seed in range(n):
        config = GenerationConfig(SamplingConfig(1.0, seed=seed), max_tokens=5, draft_length=k, constraint=grammar)
        done = final(engine.generate(PROMPT, config))
        a, b, c = done.token_ids[:3]
        counts[(a * V + b) * V + c] += 1
        rejected += done.stats.rejections
        accepted += done.stats.accepted
    return counts, rejected, accepted


class UnmaskedDraft(DraftGuesser):
    """The draft without the grammar's masks: it proposes refused tokens, which only the target's rule stops."""

    def constrain(self, allowed) -> None:
        pass


class TreeGuesser:
    """Lookup's copy (deterministic, its first token refused) beside two independent draws from the unmasked
    draft, each followed by one more: a mixed tree through the engine's tree step."""

    name, default_draft_length = "tree", 2

    def __init__(self, draft: ScriptedModel) -> None:
        self.draft = draft

    def prepare(self, context) -> None:
        pass

    def propose(self, context, k, sampling, rng) -> Proposal:
        if k < 2:
            return Proposal.empty()
        copy = LookupGuesser().propose(context, 2, sampling, rng).tokens
        tokens, parents, drafts = list(copy), list(range(-1, len(copy) - 1)), [None] * len(copy)
        for _ in range(2):
            q = logits_to_probs(self.draft.logits(list(context)), sampling)
            x = sample(q, rng)
            q2 = logits_to_probs(self.draft.logits([*context, x]), sampling)
            tokens += [x, sample(q2, rng)]
            parents += [-1, len(tokens) - 2]
            drafts += [q, q2]
        return Proposal(tokens, None, "tree", tree=Tree(tuple(tokens), tuple(parents), tuple(drafts)))

    def observe(self, *args) -> None:
        pass


def guesser(kind: str):
    draft = ScriptedModel(DRAFT_SEED, 1.0)
    return {"draft": DraftGuesser(draft), "unmasked draft": UnmaskedDraft(draft), "lookup": LookupGuesser(),
            "tree": TreeGuesser(draft)}[kind]


@pytest.mark.parametrize("kind,k", [("draft", 3), ("unmasked draft", 3), ("lookup", 4), ("tree", 2)])
def test_speculation_under_a_grammar_gives_the_constrained_targets_distribution(kind, k):
    target = ScriptedModel(TARGET_SEED, 1.5)
    counts, rejected, accepted = sample_first_three(target, guesser(kind), k)
    assert rejected > 100 and accepted > 100, (rejected, accepted)  # both branches of the rule, often
    assert counts.reshape(V, V, V)[[3, 5]].sum() == 0  # nothing the grammar refuses, ever ('d' or 'f' first)
    assert p_value(counts, exact_first_three(target)) > 1e-3


def first_tokens(draft_masked: bool, n: int = 20_000) -> np.ndarray:
    """The rule alone, on fixed rows: the target's logits at three positions (each conditioned on the drafts
    before it), a chain of two drafted tokens sampled from q (masked to the grammar or not); counts of the
    first token the step yields, which must be distributed as the constrained target's first."""
    gen = np.random.default_rng(5)
    p_logits, q_logits = gen.normal(0, 1.5, (3, V)), gen.normal(0, 1.0, (2, V))
    allowed = np.stack([mask(0), mask(1), mask(2)])
    q = logits_to_probs(masked(q_logits, allowed[:2]) if draft_masked else q_logits, SamplingConfig(1.0))
    rng, counts = np.random.default_rng(6), np.zeros(V)
    for _ in range(n):
        drafted = [sample(q[0], rng), sample(q[1], rng)]
        v = verify_logits(Tree.chain(drafted, q), p_logits, SamplingConfig(1.0), rng, allowed)
        counts[drafted[0] if v.path else v.token] += 1
    return counts, logits_to_probs(masked(p_logits[0], mask(0)), SamplingConfig(1.0))


@pytest.mark.parametrize("draft_masked", [False, True])
def test_the_rule_under_a_mask_gives_the_constrained_targets_first_token(draft_masked):
    counts, want = first_tokens(draft_masked)
    assert p_value(counts, want) > 1e-3


@pytest.mark.parametrize("draft_masked", [False, True])
def test_a_mask_on_the_draft_but_not_on_the_targets_rule_is_caught(monkeypatch, draft_masked):
    """The control: the target's rows left unmasked, the rule's test above must fail (the draft masked or
    not), and the engine must refuse to go on with a token the grammar refuses rather than answer with it."""
    monkeypatch.setattr(verify_module, "masked", lambda logits, allowed: logits)
    counts, want = first_tokens(draft_masked)
    assert p_value(counts, want) < 1e-6
    with pytest.raises(SpecchatError, match="the test grammar refused token"):
        sample_first_three(ScriptedModel(TARGET_SEED, 1.5), guesser("draft" if draft_masked else "unmasked draft"), 3)


def test_a_draft_under_a_grammar_samples_from_its_masked_distribution_and_says_so():
    matcher, draft = constraint().start(), DraftGuesser(ScriptedModel(DRAFT_SEED, 1.0))
    matcher.consume([1])  # 'b'
    draft.constrain(matcher.after)
    rng, seen = np.random.default_rng(0), set()
    for _ in range(200):
        proposal = draft.propose(PROMPT + [1], 3, SamplingConfig(1.0), rng)
        for i, (t, q) in enumerate(zip(proposal.tokens, proposal.probs)):
            assert t in ALLOWED[i + 1] and q[~mask(i + 1)].sum() == 0 and abs(q.sum() - 1) < 1e-9
            seen.add((i, t))
    assert seen == {(i, t) for i in range(3) for t in ALLOWED[i + 1]}  # every allowed token, at every position
    assert matcher.consumed == 1
    greedy = draft.propose(PROMPT + [1], 3, SamplingConfig(), rng).tokens
    assert all(t in ALLOWED[i + 1] for i, t in enumerate(greedy))
    draft.constrain(None)  # the next generation's, unconstrained: the draft's own choice again
    assert any(draft.propose(PROMPT + [1], 1, SamplingConfig(1.0), rng).tokens[0] not in ALLOWED[1] for _ in range(100))


def test_auto_passes_the_grammar_to_its_drafters_and_the_engine_sets_it_for_every_generation():
    draft = DraftGuesser(ScriptedModel(DRAFT_SEED, 1.0))
    auto = AutoGuesser(CostCurve([0.01] * 16), {"draft": draft})
    engine = Engine(ScriptedModel(TARGET_SEED, 1.5), auto)
    final(engine.generate(PROMPT, GenerationConfig(max_tokens=2, constraint=constraint())))
    assert draft.allowed is not None and not draft.allowed([3])[0]  # 'd' first is refused: nothing after it
    final(engine.generate(PROMPT, GenerationConfig(max_tokens=2)))
    assert draft.allowed is None


def test_greedy_under_a_grammar_is_the_masked_argmax_with_any_guesser():
    target = ScriptedModel(TARGET_SEED, 1.5)
    context, want = list(PROMPT), []
    for i in range(5):
        want.append(int(masked(target.logits(context), mask(i)).argmax()))
        context.append(want[-1])
    for kind in ("draft", "unmasked draft", "lookup", "tree"):
        done = final(Engine(target, guesser(kind)).generate(
            PROMPT, GenerationConfig(max_tokens=5, draft_length=3, constraint=constraint())))
        assert list(done.token_ids) == want, kind


def test_a_copy_is_cut_at_its_first_refused_token_and_a_sampled_guess_is_left_to_the_rule():
    matcher = constraint().start()
    assert fitted(Proposal([0, 3, 0, 1, 5], None, "lookup"), matcher).tokens == [0, 3, 0, 1]  # 'f' is refused
    assert fitted(Proposal([3, 1], None, "lookup"), matcher).tokens == []
    sampled = Proposal([3, 1], np.full((2, V), 1 / V), "draft")
    assert fitted(sampled, matcher) is sampled  # cutting a draw would change the residual the rule samples
    tree = Tree((3, 0, 0, 2, 3), (-1, -1, 1, 1, 3), (None, None, None, np.full(V, 1 / V), None))
    pruned = fitted(Proposal(list(tree.tokens), None, "tree", tree=tree), matcher).tree
    # refused copies go: "d" at the root, "a a", and "a c d" after the refused draw "a c", which stays
    assert (pruned.tokens, pruned.parents) == ((0, 2), (-1, 0))
    assert matcher.consumed == 0


def test_the_matcher_walks_each_guess_and_comes_back():
    matcher = constraint().start()
    matcher.consume([1])  # 'b' so far
    tree = Tree((3, 0, 0, 5), (-1, 0, -1, 1), (None,) * 4)  # 'd', 'd a', 'a' (refused), 'd a f' (refused)
    rows = matcher.masks(tree)[:, :V]
    assert matcher.consumed == 1 and matcher.valid_prefix([3, 0]) == 2  # back where it was
    assert rows[0].tolist() == mask(1).tolist()
    assert rows[1].tolist() == mask(2).tolist() and rows[2].tolist() == mask(3).tolist()
    assert rows[3].all() and rows[4].all()  # after a refused guess: never read


def test_guesses_past_an_end_token_leave_the_matcher_where_it_was():
    """llguidance does not count an end token it consumed when rolling back (1.9.1): walking a guess through
    one and back took a token of the answer back with it. The matcher never consumes one."""
    tokenizer = toy.text()
    matcher, end = Constraint.lark('start: "ok" "!"?', tokenizer, "ok").start(), 257
    matcher.consume(tokenizer.tokenize_str("ok"))
    rows = matcher.masks(Tree.chain([ord("!"), end, ord("x")]))
    assert rows[0, end] and rows[0, ord("!")] and rows[1, end] and not rows[1, ord("!")] and rows[2:].all()
    assert matcher.masks(Tree.chain([end, ord("!")]))[1:].all()  # the end straight away: nothing after it is read
    assert not matcher.after([ord("!"), end]).any()  # nothing follows the end: a drafter stops there
    matcher.consume([ord("!")])
    assert np.flatnonzero(matcher.allowed()).tolist() == [end] and matcher.consumed == 3


def test_a_cancelled_generation_leaves_the_next_one_at_the_grammars_start():
    target, cancel = ScriptedModel(TARGET_SEED, 1.5), threading.Event()
    engine, grammar = Engine(target, LookupGuesser()), constraint()
    events = engine.generate(PROMPT, GenerationConfig(SamplingConfig(1.0, seed=1), max_tokens=5, draft_length=4,
                                                       constraint=grammar), cancel)
    next(events), next(events)  # the prompt, then one step
    cancel.set()
    assert final(events).reason == "cancelled"
    for seed in range(20):
        done = final(engine.generate(PROMPT, GenerationConfig(SamplingConfig(1.0, seed=seed), max_tokens=3,
                                                               draft_length=4, constraint=grammar)))
        assert all(t in ALLOWED[i] for i, t in enumerate(done.token_ids))


def test_the_answer_ends_only_where_the_grammar_accepts():
    """On the text model (whose last token ends a turn): a grammar of 'ok' then an optional '!' ends after 'ok'
    or 'ok!', whatever the model prefers; and with the grammar met, only the end is allowed."""
    target = ScriptedModel(3, 2.0, text=True, order=1)
    grammar = Constraint.lark('start: "ok" "!"?', toy.text(), "ok")
    seen = set()
    for seed in range(30):
        done = final(Engine(target).generate(target.tokenize("<|im_start|>assistant\n"), GenerationConfig(
            SamplingConfig(1.0, seed=seed), max_tokens=8, constraint=grammar)))
        assert done.reason == "eog" and done.text in ("ok", "ok!"), done
        seen.add(done.text)
    assert seen == {"ok", "ok!"}


def test_the_mask_acts_before_the_filters_and_across_vocabulary_widths():
    logits = np.array([3.0, 2.0, 1.0, 0.0])
    # top-k 1 among the allowed: the best allowed token, not an empty set after the best overall was cut
    probs = logits_to_probs(masked(logits, np.array([False, True, True, False])), SamplingConfig(1.0, top_k=1))
    assert probs.tolist() == [0, 1, 0, 0]
    wider = masked(logits, np.array([False, False, False, True, True]))  # a token this model has not: ignored
    assert np.isneginf(wider[:3]).all() and wider[3] == 0.0
    narrower = masked(logits, np.array([True, False]))  # the vocabulary's padding: refused
    assert narrower[0] == 3.0 and np.isneginf(narrower[1:]).all()
    with pytest.raises(SpecchatError, match="^the grammar allows no token at a position it reached"):
        masked(logits, np.array([False, False, False, False, True]))


def test_a_grammar_that_does_not_compile_is_one_line():
    with pytest.raises(SpecchatError, match="^the test grammar cannot be compiled: .*") as caught:
        Constraint.lark("start: <nonsense", toy.letters(V), "the test grammar")
    assert "\n" not in str(caught.value)


def test_without_a_constraint_nothing_loads_llguidance():
    import subprocess
    import sys

    code = ("import sys; from specchat.decoding.engine import Engine, GenerationConfig; "
            "print('llguidance' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
