"""File paths completed as they are typed, for every input that takes one (a model file, a document)."""

from __future__ import annotations

import os
from pathlib import Path

from textual.suggester import Suggester


class PathSuggester(Suggester):
    """Completes a file path as it is typed (→ accepts), like a shell's Tab."""

    def __init__(self) -> None:
        super().__init__(use_cache=False, case_sensitive=True)

    async def get_suggestion(self, value: str) -> str | None:
        if not value:
            return None
        typed = Path(value).expanduser()
        folder, stem = (typed, "") if value.endswith(("/", os.sep)) else (typed.parent, typed.name)
        try:
            names = sorted(entry.name + ("/" if entry.is_dir() else "") for entry in os.scandir(folder)
                           if entry.name.startswith(stem) and (stem.startswith(".") or not entry.name.startswith(".")))
        except OSError:
            return None
        return value + names[0][len(stem):] if names else None
