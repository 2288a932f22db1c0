"""What a model would say at every position of a fixed answer, given the true text before it: read in one
batch, for `measure` (the distributions), and for `bench/corpus record` and `specchat bench` (each model's
greedy guess and how sure it was, kept with the answer for the replay).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specchat.llama.model import Model
from specchat.tools.recorded import Answer, fold


def position_probs(model: Model, prompt: Sequence[int], answer: Sequence[int]) -> np.ndarray:
    """The model's T=1 distribution at each answer position, (len(answer), V)."""
    session = model.session
    session.prefill(list(prompt))
    logits = np.array(session.decode([prompt[-1], *answer[:-1]], "all"), dtype=np.float64)
    session.rewind(len(prompt) - 1)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def greedy_guesses(model: Model, prompt: Sequence[int], answer: Sequence[int]) -> tuple[list[int], list[float]]:
    """The model's greedy guess at every answer position and its probability (for the target, the second
    is its confidence at each position)."""
    probs = position_probs(model, prompt, answer)
    return probs.argmax(-1).tolist(), probs.max(-1).tolist()


def recorded(task: str, text: str, temperature: float, prompt: Sequence[int], answer: Sequence[int],
             draft: Model | None) -> Answer:
    """An answer as the replay reads it, with the draft's greedy guess at every position where it can be replayed
    (a greedy answer, a pair with a draft: a sampled draft's fate depends on both distributions)."""
    guesses, probs = greedy_guesses(draft, prompt, answer) if draft is not None and temperature == 0 else ([], [])
    return Answer(task, fold(text), temperature, tuple(prompt), tuple(answer), tuple(guesses), tuple(probs))
