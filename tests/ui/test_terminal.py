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
from terminal import gone, launch, running, tmux, wait_for

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


def mcp_server(name: str = "notes", script: str = "") -> str:
    """A `[mcp.servers.NAME]` table as a user would write it: the notes server (tests/helpers/mcp_notes.py), or `script`
    served over stdio."""
    from mcp_notes import SCRIPT

    return f'[mcp.servers.{name}]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(script or SCRIPT)}]\n'


def choose_tools(session: str, *ticks: str, shown: str) -> None:
    """Once the models are loaded: F5, then at once `ticks` (the keys that tick tools in the dialog), "call first"
    (Ctrl+T: the 1.5B model, left to decide, writes its call as a json block) and Enter, typed ahead as a fast user
    does; the status line must then name the tools `shown` (a pattern): what was ticked, read from the app rather
    than assumed from the keys. (Enter saved by a priority binding once, ahead of keys still queued: 1 run in 4.)"""
    wait_for(session, r"ready · guesser", timeout=300)
    tmux("send-keys", "-t", session, "F5")
    wait_for(session, r"Tools for this conversation", timeout=120)
    tmux("send-keys", "-t", session, *ticks, "C-t", "Enter")
    wait_for(session, rf"tools for this conversation: {shown} · each reply calls one first", timeout=30)


def ask(session: str, prompt: str, tool: str) -> str:
    """Send `prompt`; the screen once the app asks whether to run the model's call of `tool`."""
    tmux("send-keys", "-t", session, "-l", prompt)
    tmux("send-keys", "-t", session, "Enter")
    return wait_for(session, rf"The model calls {tool}\b", timeout=300)


def fold(shown: str, call: re.Match) -> str:
    """The fold's title on the line under a tool call's, up to the border of the stats panel beside it ("" where
    the line has no fold)."""
    title = re.search(r"▶ [^│]*", shown[call.end():].splitlines()[1])
    return title[0].strip() if title else ""


def stored(tmp_path) -> list[tuple]:
    """The database's messages, in order: role, status, content, tool_calls, tool_call_id, stats (decoded)."""
    db = sqlite3.connect(tmp_path / "data" / "specchat" / "specchat.db")
    rows = db.execute("SELECT role, status, content, tool_calls, tool_call_id, stats FROM messages ORDER BY id")
    return [(*row[:5], json.loads(row[5]) if row[5] else None) for row in rows.fetchall()]


def test_a_tool_call_asked_allowed_shown_folded_and_answered_in_a_real_terminal(tmp_path, qwen_paths):
    """Tools on the default pair: a notes server written with the MCP SDK (tests/helpers/mcp_notes.py) configured as a user
    would; F5 ticks its tool and "call first"; the call is asked about, allowed, shown folded with its result's
    size, and the answer quotes the note."""
    pytest.importorskip("mcp", reason="the tools extra is not installed")
    from mcp_notes import NOTE

    with running(f"specchat-tools-{os.getpid()}", tmp_path,
                 f'system_prompt = ""\nmax_tokens = 120\n\n{mcp_server()}') as session:
        choose_tools(session, "C-a", shown="read_note")  # every tool ticked
        asked = ask(session, "Show me my note 'launch' as a markdown blockquote.", "read_note")
        assert '"name"' in asked, asked  # its arguments, laid out
        tmux("send-keys", "-t", session, "y")
        shown = wait_for(session, r"done · guesser", timeout=300)
        assert re.search(r"Tool · read_note\(\{.*\}\)", shown), shown
        assert f"result · {len(NOTE)} characters" in shown, shown  # folded: the size, not the text
        tmux("send-keys", "-t", session, "C-q")
        assert gone(session, 30), "the app did not quit"  # and the database is read once it has
    rows = stored(tmp_path)
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant"], rows
    [call] = json.loads(rows[1][3])
    assert call["name"] == "read_note" and rows[2][4] == call["id"] and rows[2][2] == NOTE
    assert rows[3][1] == "complete" and "10:30" in rows[3][2], rows[3][2]  # the answer quotes the result


def test_a_refused_call_ends_in_one_line_and_the_model_answers_in_a_real_terminal(tmp_path, qwen_paths):
    """The same notes server and forced call, refused with n: the call is not run, its fold says "refused" (and
    nothing more: the note never reaches the screen or the model), the model answers after it, and the
    conversation is stored whole, the tool message marked refused."""
    pytest.importorskip("mcp", reason="the tools extra is not installed")
    from mcp_notes import NOTE

    from specchat.mcptools.agent import REFUSED

    with running(f"specchat-refuse-{os.getpid()}", tmp_path,
                 f'system_prompt = ""\nmax_tokens = 48\n\n{mcp_server()}') as session:
        choose_tools(session, "C-a", shown="read_note")
        ask(session, "Show me my note 'launch'.", "read_note")
        tmux("send-keys", "-t", session, "n")
        shown = wait_for(session, r"done · guesser", timeout=300)
        call = re.search(r"Tool · read_note\(\{.*\}\)", shown)
        assert call, shown
        # The fold's one line, right under the call's: "refused", not a result's size or an error's text.
        assert fold(shown, call) == "▶ refused", shown
        assert "Assistant" in shown[call.end():] and "Traceback" not in shown, shown  # the answer after it
        tmux("send-keys", "-t", session, "C-q")
        assert gone(session, 30), "the app did not quit"
    rows = stored(tmp_path)
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant"], rows
    [call] = json.loads(rows[1][3])
    assert call["name"] == "read_note" and rows[2][4] == call["id"]
    assert (rows[2][2], rows[2][5]) == (REFUSED, {"refused": True, "failed": False}), rows[2]
    assert NOTE not in rows[3][2]  # not run: the answer cannot have the note
    assert rows[3][1] == "complete" and rows[3][2].strip(), rows[3]  # the model answered after the refusal


def test_a_server_that_hangs_ends_in_one_line_and_the_answer_goes_on_in_a_real_terminal(tmp_path, qwen_paths):
    """A second server (tests/helpers/mcp_servers.py over stdio, as configured) whose `block` tool never answers, with
    `[mcp] timeout_s = 2`: only block ticked (so the forced call is of it, whatever the model prefers), allowed with
    y; its fold says in one line that it timed out, the answer goes on, and the tool message is stored marked failed.
    The app stays usable: a second question's call of the same server (its first call still hanging there) times
    out the same way and is answered, and the app still quits at once (the hung server does not hold it)."""
    pytest.importorskip("mcp", reason="the tools extra is not installed")
    from mcp_servers import SCRIPT

    line = "block (server 'slow') timed out after 2 s"
    # Short answers: two turns must stay on the screen together.
    config = (f'system_prompt = ""\nmax_tokens = 24\n\n[mcp]\ntimeout_s = 2\n\n{mcp_server()}'
              f'{mcp_server("slow", SCRIPT)}')
    with running(f"specchat-hang-{os.getpid()}", tmp_path, config) as session:
        # The list: notes' read_note, then the test server's echo, boom, env, block, ...: the cursor to block, ticked.
        choose_tools(session, "Down", "Down", "Down", "Down", "space", shown="block")
        ask(session, "Wait for the block tool.", "block")
        tmux("send-keys", "-t", session, "y")
        shown = wait_for(session, r"done · guesser", timeout=300)
        call = re.search(r"Tool · block\(\{\}\)", shown)
        assert call, shown
        assert fold(shown, call) == f"▶ failed · {line}", shown
        assert "Assistant" in shown[call.end():] and "Traceback" not in shown, shown  # the answer after it
        ask(session, "Try once more.", "block")
        tmux("send-keys", "-t", session, "y")
        shown = wait_for(session, rf"(?s)(▶ failed · {re.escape(line)}.*){{2}}done · guesser", timeout=300)
        tmux("send-keys", "-t", session, "C-q")
        assert gone(session, 30), "the app did not quit"
    rows = stored(tmp_path)
    assert [r[0] for r in rows] == ["user", "assistant", "tool", "assistant"] * 2, rows
    for asked, result, answer in (rows[1:4], rows[5:8]):
        [call] = json.loads(asked[3])
        assert call["name"] == "block" and result[4] == call["id"]
        assert (result[2], result[5]) == (line, {"refused": False, "failed": True}), result
        assert answer[1] == "complete" and answer[2].strip(), answer  # the answer went on after the timeout
