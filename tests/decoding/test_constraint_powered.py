"""Exactness under a grammar on llama.cpp: at T=1 (top-k 3), the first three tokens of as many constrained
answers as a chi-square needs to see a sampler 0.03 (total variation) away, with a draft and with lookup,
against the constrained target's exact joint (each conditional from a fresh model's logits, masked to what
the grammar allows after that prefix). The model is a generated llama GGUF (tests/helpers/tiny_gguf.py, 40 tokens,
as tests/decoding/test_exact_powered.py uses) read by llguidance from its llama.cpp vocabulary; the grammar
refuses tokens the draft and the copy propose. A target whose rule is left unmasked (the draft's guesses
masked or not) must not get through."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny_gguf
from pooled import answers_for, exact_joint, sample_answers, sampled_against
from tempered import guesser

import specchat.decoding.verify as verify_module
from specchat.decoding.constraint import Constraint, tokenizer_of
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.model import Model

TV, ALPHA = 0.03, 1e-3
SAMPLING = SamplingConfig(1.0, top_k=3)  # among the allowed: 27 answers of three tokens
# After this the target gives 'l' 0.67, '!' 0.16, ',' 0.05; then 'm' 0.28 (2026-12-05). The grammar refuses
# '!', ',' and 'm' there: lookup's copy 'l m' is cut to 'l', and the draft's masked guesses must hold.
TEXT = "milmilmilmilmi"
GRAMMAR = "start: /[lyc][bycnh][a-z]+/"


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_gguf.write("llama", tmp_path_factory.mktemp("constrained") / "llama-40.gguf", vocab=40, seed=1)


@pytest.fixture(scope="module")
def models(target):
    loaded = Model(target, n_ctx=256, n_threads=1), Model(target, n_ctx=256, n_threads=1)
    yield loaded
    for m in loaded:
        m.close()


@pytest.fixture(scope="module")
def grammar(models) -> Constraint:
    return Constraint.lark(GRAMMAR, tokenizer_of(models[0]), "the test grammar")


def prompt_of(model: Model) -> list[int]:
    return [1, *model.tokenize(TEXT, add_bos=False)]


@pytest.fixture(scope="module")
def joint(target, models, grammar) -> dict[tuple[int, ...], float]:
    """The constrained target's probability of every three-token answer, from a fresh model and matcher."""
    return exact_joint(target, prompt_of(models[0]), 3, SAMPLING, grammar)


@pytest.mark.parametrize("name", ["draft", "lookup"])
def test_constrained_answers_are_the_constrained_targets(models, grammar, joint, name):
    target, draft = models
    assert len(joint) == 27, joint
    n = answers_for(TV, len(joint), ALPHA)
    out = sample_answers(target, guesser(name, draft), prompt_of(target), n, SAMPLING, 3, 2, constraint=grammar)
    assert out.rejected > n // 50 and out.accepted > n // 10, out  # both branches of the rule
    assert sampled_against(joint, out.answers) > ALPHA


@pytest.mark.parametrize("name", ["draft", "lookup"])
def test_an_unmasked_targets_rule_does_not_get_through(monkeypatch, models, grammar, name):
    """The control: with the target's rows left unmasked, the rule draws tokens the grammar refuses, and the
    engine stops on the first rather than answer with it."""
    monkeypatch.setattr(verify_module, "masked", lambda logits, allowed: logits)
    target, draft = models
    with pytest.raises(SpecchatError, match="the test grammar refused token"):
        sample_answers(target, guesser(name, draft), prompt_of(target), 500, SAMPLING, 3, 2, constraint=grammar)
