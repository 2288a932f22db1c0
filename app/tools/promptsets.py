"""Prompt sets for `bench` and `measure`: JSONL, one {"task": ..., "prompt": ...} per line."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable

from specchat.errors import SpecchatError


def load_prompts(path: Path) -> list[tuple[str, str]]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise SpecchatError(f"cannot read prompts file {path}: {e.strerror}") from None
    prompts = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise SpecchatError(f"{path}:{n}: not JSON ({e.msg})") from None
        if not isinstance(item, dict) or not isinstance(item.get("task"), str) or not isinstance(item.get("prompt"), str):
            raise SpecchatError(f'{path}:{n}: each line must be {{"task": "...", "prompt": "..."}}')
        prompts.append((item["task"], item["prompt"]))
    if not prompts:
        raise SpecchatError(f"{path} holds no prompts")
    return prompts


def pick_prompts(paths: Iterable[Path], per_task: int, tasks: Iterable[str] | None = None) -> list[tuple[str, str]]:
    """The first `per_task` prompts of each task across these files, in order; only `tasks` where given.

    A task asked for that no file holds is an error (a typo would otherwise shrink the run unseen)."""
    paths = list(paths)
    wanted = None if tasks is None else set(tasks)
    picked, taken, held = [], Counter[str](), set()
    for task, text in (item for path in paths for item in load_prompts(path)):
        held.add(task)
        if (wanted is None or task in wanted) and taken[task] < per_task:
            picked.append((task, text))
            taken[task] += 1
    missing = sorted((wanted or set()) - held)
    if missing:
        raise SpecchatError(f"no prompts of the tasks {missing} in {', '.join(map(str, paths))} "
                            f"(the tasks there: {', '.join(sorted(held))})")
    return picked
