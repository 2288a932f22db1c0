"""The real app in a real terminal (tmux), on the real default pair: type a question, wait for
the answer, check the live stats and the database."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.real, pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")]
REPO = Path(__file__).resolve().parent.parent


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
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config"), "TERM": "xterm-256color"}
    (tmp_path / "config" / "specchat").mkdir(parents=True)
    (tmp_path / "config" / "specchat" / "config.toml").write_text(config)
    command = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    command += " ".join(["", shlex.quote(sys.executable), "-m", "specchat.cli", *map(shlex.quote, args)])
    tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "48", "-c", str(REPO), command)


def test_chat_in_a_real_terminal(tmp_path, qwen_paths):
    session = f"specchat-e2e-{os.getpid()}"
    # The draft guesser, so that acceptance comes from the draft model (auto may skip it on a CPU).
    launch(session, tmp_path, 'guesser = "draft"\n')
    try:
        wait_for(session, r"ready · guesser draft", timeout=300)
        tmux("send-keys", "-t", session, "-l", "Rewrite formally: the meeting is moved to friday, pls tell everyone.")
        tmux("send-keys", "-t", session, "Enter")
        text = wait_for(session, r"done · guesser draft", timeout=300)
        accept = re.search(r"accept\s+(\d+)%\s+\((\d+)/(\d+)\)", text)
        assert accept, text
        assert int(accept.group(2)) > 0, f"no drafted token was accepted:\n{text}"
        assert re.search(r"speedup\s+\d+\.\d+x", text), text
        tmux("send-keys", "-t", session, "C-q")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and subprocess.run(["tmux", "has-session", "-t", session],
                                                             capture_output=True).returncode == 0:
            time.sleep(0.2)
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    db = sqlite3.connect(tmp_path / "data" / "specchat" / "specchat.db")
    rows = db.execute("SELECT role, status, length(content) FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant"]
    assert rows[1][1] == "complete" and rows[1][2] > 0
