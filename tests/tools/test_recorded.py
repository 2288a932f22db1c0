"""Recorded answers and their folds (specchat.tools.recorded)."""

from __future__ import annotations

import json

import pytest

from specchat.errors import SpecchatError
from specchat.tools.recorded import fold, load_answers


def test_a_prompt_falls_in_the_same_fold_everywhere():
    assert fold("Translate this notice into Spanish.") == fold("Translate this notice into Spanish.")
    folds = [fold(f"prompt {n}") for n in range(200)]
    assert 70 < folds.count("fit") < 130  # about half each, from the hash


def test_a_damaged_recording_is_one_line_that_says_what_to_do(tmp_path):
    path = tmp_path / "answers.jsonl"
    path.write_text(json.dumps({"task": "open", "fold": "fit", "temperature": 0.0, "prompt": [1]}) + "\n")
    with pytest.raises(SpecchatError, match=r"answers.jsonl:1: not a recorded answer .*record again with bench/corpus"):
        load_answers(path)
    with pytest.raises(SpecchatError, match="cannot read recorded answers"):
        load_answers(tmp_path / "missing.jsonl")
