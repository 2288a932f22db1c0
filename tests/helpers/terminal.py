"""The real app in a real terminal: a tmux session to launch it in, type into and read."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from commands import REPO


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session: str, pattern: str, timeout: float) -> str:
    """Poll the terminal until the pattern is on screen (the app's own output, not a guess)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = screen(session)
        if re.search(pattern, text):
            return text
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} never appeared; the screen was:\n{screen(session)}")


def launch(session: str, tmp_path: Path, config: str, *args: str) -> None:
    """The app in a new 160x48 tmux session, its data and settings (`config`) under tmp_path."""
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "TERM": "xterm-256color",
           # The size too: Textual asks shutil.get_terminal_size, which takes COLUMNS and LINES over the pane's own
           # size, and a pane started under pytest was seen to get COLUMNS=80 LINES=24 (the app drew 80x24).
           "COLUMNS": "160", "LINES": "48"}
    (tmp_path / "config" / "specchat").mkdir(parents=True)
    (tmp_path / "config" / "specchat" / "config.toml").write_text(config)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command += " ".join(["", shlex.quote(sys.executable), "-m", "specchat.cli", *map(shlex.quote, args)])
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", "-c", str(REPO), command)


def gone(session: str, timeout: float) -> bool:
    """Whether the session ended (the app quit) within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if subprocess.run(["tmux", "has-session", "-t", session], capture_output=True).returncode != 0:
            return True
        time.sleep(0.2)
    return False


@contextmanager
def running(session: str, tmp_path: Path, config: str, *args: str) -> Iterator[str]:
    """`launch`, and the session always killed after (a failed wait leaves the app running otherwise)."""
    launch(session, tmp_path, config, *args)
    try:
        yield session
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
