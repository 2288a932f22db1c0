"""Prompt sets: the benches' choice of prompts per task, and the errors a bad file gets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.tools.promptsets import load_prompts, pick_prompts


def write(path: Path, items: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"task": t, "prompt": p}) + "\n" for t, p in items), encoding="utf-8")
    return path


def test_the_first_prompts_of_each_task_across_files_in_order(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [("open", "o1"), ("edit", "e1"), ("open", "o2"), ("open", "o3")])
    b = write(tmp_path / "b.jsonl", [("edit", "e2"), ("edit", "e3"), ("rewrite", "r1")])
    assert pick_prompts([a, b], 2) == [("open", "o1"), ("edit", "e1"), ("open", "o2"), ("edit", "e2"), ("rewrite", "r1")]
    assert pick_prompts([a, b], 1, ["edit", "rewrite"]) == [("edit", "e1"), ("rewrite", "r1")]


def test_a_task_no_file_holds_is_named(tmp_path: Path) -> None:
    a = write(tmp_path / "a.jsonl", [("open", "o1")])
    with pytest.raises(SpecchatError, match=r"no prompts of the tasks \['edit'\] in .*a.jsonl \(the tasks there: open\)"):
        pick_prompts([a], 2, ["edit"])
    # One misspelt task among good ones stops the run too, instead of leaving that task out unseen.
    with pytest.raises(SpecchatError, match=r"\['edti'\]"):
        pick_prompts([a], 2, ["open", "edti"])


def test_a_line_that_is_not_a_prompt_is_named_by_its_number(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "open", "prompt": "fine"}\n{"task": "open"}\n', encoding="utf-8")
    with pytest.raises(SpecchatError, match=r"bad.jsonl:2: each line must be"):
        load_prompts(bad)
