"""Writing files so that a crash never leaves a half-written one under the real name."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import platformdirs


def atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers see old or new, never half.

    The temporary name carries the writer's pid, so a write killed midway leaves a hidden
    file that the next write to the same path recognises as dead and removes.
    """
    prefix = f".{path.name}."
    remove_dead_leftovers(path.parent, re.compile(re.escape(prefix) + r"(\d+)\..*\.tmp", re.DOTALL))
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{prefix}{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def remove_dead_leftovers(directory: Path, pattern: re.Pattern[str]) -> None:
    """Delete the entries of `directory` whose name fully matches `pattern` and whose pid (its
    first group that matched) belongs to no running process: what a killed writer left behind.
    A live process's are kept, since it is still writing them."""
    for path in directory.iterdir():
        match = pattern.fullmatch(path.name)
        if match is None or pid_alive(int(next(g for g in match.groups() if g is not None))):
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether the process that named a temporary file still runs; when unsure, say yes (keep the file)."""
    if os.name == "nt":  # signal 0 would terminate the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OverflowError:  # not a pid at all
        return False
    return True


def log_path() -> Path:
    """Where the app writes what went wrong inside it, with tracebacks (never over the screen)."""
    return Path(platformdirs.user_log_dir("specchat")) / "specchat.log"


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
    """Set one entry of a JSON cache keyed by the files it describes, dropping the entries whose files are
    gone: a key that names a file deleted or moved (a model removed, a test's temporary one) is never read
    again, and would stay in the cache for ever."""
    cache = {k: v for k, v in read_cache(path).items() if _files_remain(k)}
    cache[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(cache, indent=1))


def _files_remain(key: str) -> bool:
    """Whether every file a cache key names (its parts that are absolute paths) is still there."""
    return all(Path(part).exists() for part in key.split("|") if os.path.isabs(part))
