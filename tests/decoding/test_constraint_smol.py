"""Exactness under a grammar on a real trained model: SmolLM2-135M at T=1 (top-k 3), the first two tokens of
constrained answers, with a tempered draft and with lookup, against the constrained target's exact joint (each
conditional from a fresh model's logits masked to what the grammar allows after that prefix:
`pooled.exact_joint`). The grammar (colour words, never " blue") refuses the target's own likely tokens: after
the prompt the target's top three are " green" 0.38, " blue" 0.15, " red" 0.06, and after " green" or " red"
its favourite is " blue" (0.67, 0.35; 2026-12-06), so the mask cuts one of the three at the first and second
positions, and lookup's copy " green blue" is cut to " green". The joint has 9 cells; the 367 answers
`pooled.answers_for` asks of them see an error of 0.15 (total variation, `pooled.detectable`), a gross one, as
test_engine.py's unconstrained test does on this model; tests/decoding/test_constraint_powered.py sees 0.03 on
a generated model. Two tokens, not three, keep the file near 30 s on two cores (three: 27 cells, 526 answers,
70 s). A target whose rule is left unmasked (the guesses still masked) must not get through."""

from __future__ import annotations

import numpy as np
import pytest
from pooled import answers_for, exact_joint, sample_answers, sampled_against
from tempered import guesser

import specchat.decoding.verify as verify_module
from specchat.decoding.constraint import Constraint, tokenizer_of
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError

pytestmark = pytest.mark.real

TV, ALPHA = 0.15, 1e-3
SAMPLING = SamplingConfig(1.0, top_k=3)  # among the allowed: at most 9 answers of two tokens
DEPTH = 2  # tokens an answer has, both drafted in one step (draft_length 2): a chain the rule judges
TEXT = "red green blue, red green blue, red green blue, red"
GRAMMAR = 'start: /( red| green| yellow| orange|,)+/'


@pytest.fixture(scope="module")
def grammar(smol) -> Constraint:
    return Constraint.lark(GRAMMAR, tokenizer_of(smol), "the colour grammar")


@pytest.fixture(scope="module")
def prompt(smol) -> list[int]:
    return smol.tokenize(TEXT, add_bos=False)


@pytest.fixture(scope="module")
def joint(smol_path, prompt, grammar) -> dict[tuple[int, ...], float]:
    return exact_joint(smol_path, prompt, DEPTH, SAMPLING, grammar)


def refused_of_top(smol_path, prompt: list[int], grammar: Constraint) -> dict[tuple[int, ...], int]:
    """How many of the unconstrained target's top three the grammar refuses after each prefix it allows of
    fewer than two tokens (the first and second positions)."""
    free = exact_joint(smol_path, prompt, 2, SAMPLING)
    tops = {(): {answer[0] for answer in free}}
    for answer in free:
        if len(answer) == 2:
            tops.setdefault(answer[:1], set()).add(answer[1])

    def allows(tokens: tuple[int, ...]) -> bool:
        return grammar.start().valid_prefix(tokens) == len(tokens)

    return {prefix: sum(not allows(prefix + (t,)) for t in top) for prefix, top in tops.items() if allows(prefix)}


def test_the_grammar_cuts_the_targets_own_top_tokens(smol_path, prompt, grammar, joint):
    """The premise: at the first position and at the second (after each allowed first token) the mask cuts one
    or two of the target's top three, and the constrained joint still branches."""
    refused = refused_of_top(smol_path, prompt, grammar)
    assert set(refused) >= {()} and len(refused) > 1, refused
    assert all(1 <= n <= 2 for n in refused.values()), refused
    firsts = {answer[0] for answer in joint}
    assert len(firsts) >= 2 and len(joint) >= 6, joint


@pytest.mark.parametrize("name", ["draft", "lookup"])
def test_constrained_answers_follow_the_constrained_smollm2(smol, smol_draft, prompt, grammar, joint, name):
    """Both branches of the rule taken often, no answer the grammar refuses, and the answers' counts the
    constrained joint's (chi-square). Drawing a rejection's correction from r instead of its residual gave
    p = 2e-7 (draft) and 4e-10 (lookup) here; the target's rows unmasked, the engine's refusal of " blue"."""
    n = answers_for(TV, len(joint), ALPHA)
    out = sample_answers(smol, guesser(name, smol_draft), prompt, n, SAMPLING, DEPTH, 2, constraint=grammar)
    assert out.rejected > n // 20 and out.accepted > n // 5, (out.rejected, out.accepted)  # both branches
    assert all(grammar.start().valid_prefix(a) == len(a) for a in out.answers)  # nothing the grammar refuses
    assert set(out.answers) <= set(joint)
    p = sampled_against(joint, out.answers)
    assert p > ALPHA, (p, np.unique(np.array(out.answers), axis=0, return_counts=True))


@pytest.mark.parametrize("name", ["draft", "lookup"])
def test_an_unmasked_targets_rule_does_not_get_through(monkeypatch, smol, smol_draft, prompt, grammar, name):
    """The control: with the target's rows left unmasked (the guesses still masked), the rule draws " blue",
    which the grammar refuses, and the engine stops on it rather than answer with it."""
    monkeypatch.setattr(verify_module, "masked", lambda logits, allowed: logits)
    with pytest.raises(SpecchatError, match="the colour grammar refused token"):
        sample_answers(smol, guesser(name, smol_draft), prompt, 500, SAMPLING, DEPTH, 2, constraint=grammar)
