"""The real app in a real terminal (tmux), on the real default pair: type a question, wait for
the answer, check the live stats and the database."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest
from terminal import launch, tmux, wait_for

pytestmark = [pytest.mark.real, pytest.mark.skipif(shutil.which("tmux") is None,
                                                  reason="needs tmux, to run the app in a real terminal")]


def test_chat_in_a_real_terminal(tmp_path, qwen_paths):
    session = f"specchat-e2e-{os.getpid()}"
    # The draft guesser, so that acceptance comes from the draft model (auto may skip it on a CPU).
    launch(session, tmp_path, 'guesser = "draft"\n')
    try:
        shown = wait_for(session, r"ready · guesser", timeout=300)
        # The draft guesser itself: not auto in its place (the status line ends at the stats panel's border).
        status = re.search(r"ready · guesser [^│\n]*", shown)[0].strip()
        assert re.fullmatch(r"ready · guesser draft · [^·]+", status), status
        tmux("send-keys", "-t", session, "-l", "Rewrite formally: the meeting is moved to friday, pls tell everyone.")
        tmux("send-keys", "-t", session, "Enter")
        text = wait_for(session, r"done · guesser draft", timeout=300)
        # Each figure on its own line of the panel (spaces, not any whitespace: a pattern that ran on into the
        # next line could take a figure from there for one this line shows as "–").
        accept = re.search(r"accept +(\d+)% +\((\d+)/(\d+)\)", text)
        assert accept, text
        assert int(accept.group(2)) > 0, f"no drafted token was accepted:\n{text}"
        assert re.search(r"steps +(\d+ \w+, )*\d+ draft\b", text), text  # the draft model's guesses, not lookup's
        assert re.search(r"speedup +\d+\.\d+x", text), text
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


def test_a_reasoning_models_thinking_folds_and_opens_in_a_real_terminal(tmp_path, thinker_path):
    """The tiny GGUF with DeepSeek R1's template: its generation prompt opens a <think> the random model
    never closes, so the answer is all thinking: shown under its own fold with its figures (left open, as
    there is no answer to show instead), which Ctrl+B folds, and stored apart from the (empty) answer."""
    session = f"specchat-think-{os.getpid()}"
    launch(session, tmp_path, "max_tokens = 24\n", "--target", str(thinker_path))
    try:
        wait_for(session, r"ready · guesser", timeout=120)
        tmux("send-keys", "-t", session, "-l", "Why is the sky blue?")
        tmux("send-keys", "-t", session, "Enter")
        shown = wait_for(session, r"done · guesser", timeout=120)
        assert re.search(r"▼ Thinking · 24 tokens · [\d.]+ tok/s", shown), shown
        assert "ended inside its thinking" in shown  # said, as a notice and in the summary line
        tmux("send-keys", "-t", session, "C-b")
        wait_for(session, r"▶ Thinking · 24 tokens", timeout=30)
        tmux("send-keys", "-t", session, "C-q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    db = sqlite3.connect(tmp_path / "data" / "specchat" / "specchat.db")
    [(content, thinking)] = db.execute("SELECT content, thinking FROM messages WHERE role = 'assistant'").fetchall()
    assert content == "" and thinking


def test_a_tool_call_asked_allowed_shown_folded_and_answered_in_a_real_terminal(tmp_path, qwen_paths):
    """Tools on the default pair: a notes server written with the MCP SDK (tests/mcp_notes.py) configured as a user
    would; F5 ticks its tool and "call first" (the 1.5B model, left to decide, writes its call as a json block);
    the call is asked about, allowed, shown folded with its result's size, and the answer quotes the note."""
    pytest.importorskip("mcp", reason="the tools extra is not installed")
    from mcp_notes import NOTE, SCRIPT

    session = f"specchat-tools-{os.getpid()}"
    launch(session, tmp_path, f'system_prompt = ""\nmax_tokens = 120\n\n[mcp.servers.notes]\n'
                              f'command = {json.dumps(sys.executable)}\nargs = [{json.dumps(SCRIPT)}]\n')
    try:
        wait_for(session, r"ready · guesser", timeout=300)
        tmux("send-keys", "-t", session, "F5")
        wait_for(session, r"Tools for this conversation", timeout=120)
        tmux("send-keys", "-t", session, "C-a")  # every tool ticked
        tmux("send-keys", "-t", session, "C-t")  # call first
        tmux("send-keys", "-t", session, "Enter")
        wait_for(session, r"tools for this conversation: read_note · each", timeout=30)  # the line runs on, cut
        tmux("send-keys", "-t", session, "-l", "Show me my note 'launch' as a markdown blockquote.")
        tmux("send-keys", "-t", session, "Enter")
        asked = wait_for(session, r"The model calls read_note", timeout=300)
        assert '"name"' in asked, asked  # its arguments, laid out
        tmux("send-keys", "-t", session, "y")
        shown = wait_for(session, r"done · guesser", timeout=300)
        assert re.search(r"Tool · read_note\(\{.*\}\)", shown), shown
        assert f"result · {len(NOTE)} characters" in shown, shown  # folded: the size, not the text
        tmux("send-keys", "-t", session, "C-q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    db = sqlite3.connect(tmp_path / "data" / "specchat" / "specchat.db")
    rows = db.execute("SELECT role, status, content, tool_calls, tool_call_id FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant"], rows
    [call] = json.loads(rows[1][3])
    assert call["name"] == "read_note" and rows[2][4] == call["id"] and rows[2][2] == NOTE
    assert rows[3][1] == "complete" and "10:30" in rows[3][2], rows[3][2]  # the answer quotes the result
