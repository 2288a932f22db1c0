"""Writing files so that a crash never leaves a half-written one under the real name."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import platformdirs


def atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers see old or new, never half."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def cache_file(name: str) -> Path:
    return Path(platformdirs.user_cache_dir("specchat")) / name


def read_cache(path: Path) -> dict[str, Any]:
    """A JSON cache; a missing or damaged one is simply empty (it will be measured again)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_cache(path: Path, key: str, value: Any) -> None:
    cache = read_cache(path)
    cache[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(cache, indent=1))
