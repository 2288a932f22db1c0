"""What a model says at every position of a fixed answer (specchat.tools.reading), on a scripted model
whose logits after any context are known."""

from __future__ import annotations

import numpy as np
import pytest
from fakes.model import ScriptedModel

from specchat.tools.reading import greedy_guesses, position_probs


def test_each_position_is_read_given_the_true_text_before_it():
    model = ScriptedModel(seed=4, sharpness=3.0, vocab=9)
    prompt, answer = [1, 2, 3, 4], [5, 6, 7, 8, 0]
    seq = prompt + answer
    expected = [model.logits(seq[:i]) for i in range(len(prompt), len(seq))]
    probs = position_probs(model, prompt, answer)
    softmax = [np.exp(row - row.max()) / np.exp(row - row.max()).sum() for row in expected]
    assert probs == pytest.approx(np.array(softmax))
    guesses, p = greedy_guesses(model, prompt, answer)
    assert guesses == [int(row.argmax()) for row in expected]
    assert p == pytest.approx([float(row.max()) for row in softmax])
    # The cache is left as a prefill of the prompt leaves it: the next answer's read starts from there.
    assert model.session.tokens == prompt[:-1]
