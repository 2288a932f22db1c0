"""Prompt sets for `bench` and `measure`: JSONL, one {"task": ..., "prompt": ...} per line."""

from __future__ import annotations

import json
from pathlib import Path

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
