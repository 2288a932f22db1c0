"""Writing files so that a crash never leaves a half-written one under the real name."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

import platformdirs


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write to a temporary file beside `path`, then rename: readers see old or new, never half.

    Text is written as UTF-8; bytes as they are (a document kept in its own encoding and line endings).
    The temporary name carries the writer's pid, so a write killed midway leaves a hidden
    file that the next write to the same path recognises as dead and removes.

    What the file was stays, but for its contents: a symlink is written through (the link stays, its
    target changes), and an existing file keeps its permissions, owner and group. One the user may not
    write is not replaced, though the folder would allow the rename (as an editor would refuse it).
    """
    target = Path(os.path.realpath(path))
    existing = _existing(target)
    prefix = f".{target.name}."
    remove_dead_leftovers(target.parent, re.compile(re.escape(prefix) + r"(\d+)\..*\.tmp", re.DOTALL))
    # Owner-only until it has the original's owner and mode, so that it is never readable more widely than that;
    # a new file gets what the umask leaves of 0666, as any editor's new file does.
    fd, tmp = _create_temp(target.parent, f"{prefix}{os.getpid()}.", 0o600 if existing is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") if isinstance(data, bytes) else os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            if existing is not None:
                _take_owner_and_mode(tmp, existing)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def _existing(target: Path) -> os.stat_result | None:
    """The file that a write replaces, if there is one; refused (PermissionError) if the user may not write it."""
    try:
        existing = target.stat()
    except FileNotFoundError:
        return None
    if not os.access(target, os.W_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(target))
    return existing


def _create_temp(directory: Path, prefix: str, mode: int) -> tuple[int, Path]:
    """A new file of a name no other has, open for writing. Not tempfile.mkstemp: it always makes 0600,
    and the umask that a new file's mode needs cannot be read without setting it for every thread."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    while True:
        tmp = directory / f"{prefix}{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, mode), tmp
        except FileExistsError:
            continue


def _take_owner_and_mode(tmp: Path, existing: os.stat_result) -> None:
    """Give the new file the replaced one's owner and group where the process may (root may give any; a user
    only a group of theirs), then its permission bits (after: a change of owner clears setuid and setgid)."""
    made = tmp.stat()
    if hasattr(os, "chown") and (made.st_uid, made.st_gid) != (existing.st_uid, existing.st_gid):
        try:
            os.chown(tmp, existing.st_uid, existing.st_gid)
        except PermissionError:
            with contextlib.suppress(PermissionError):
                os.chown(tmp, -1, existing.st_gid)
    os.chmod(tmp, stat.S_IMODE(existing.st_mode))


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (a crash could otherwise bring back the old file). The new file is in
    place already, so nothing here fails the write: a platform whose folders cannot be opened (Windows), or
    a file system that cannot sync one, is simply left to its own."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


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
