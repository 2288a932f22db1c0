"""`specchat generate --tools` on the default pair, with a real MCP server (tests/helpers/mcp_notes.py, written with the
SDK) configured in config.toml as a user would: the model calls its tool, the call is printed on stderr, and the
answer quotes the tool's result, copied by prompt lookup at more than one token a step.

Runs real models: do not measure while anything else decodes (tokens per step do not depend on speed, so this
test passes on a busy machine too).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from commands import REPO, assert_clean_error, specchat, with_costs
from mcp_notes import NOTE, SCRIPT

pytestmark = pytest.mark.real

PROMPT = "Show me my note 'launch' as a markdown blockquote."
FIGURES = re.compile(r"^\[(\w+)\] (\d+) tokens in .*?([\d.]+) tokens/step", re.M)


def _configure(tmp_path, server: str = "") -> dict[str, str]:
    config = tmp_path / "config" / "specchat"
    config.mkdir(parents=True)
    (config / "config.toml").write_text(server or f'[mcp.servers.notes]\ncommand = "{sys.executable}"\n'
                                                  f'args = ["{SCRIPT}"]\n')
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_generate_calls_the_tool_and_quotes_its_result_by_lookup(qwen_paths, tmp_path):
    target, draft = qwen_paths
    # Left to decide (--tool-choice auto), the 1.5B default model writes the call as a ```json block, which no
    # template's parser reads as a call (nor does llama.cpp's): the first answer is made a call to the tool. Given
    # the tools again after the result, it only writes the call once more: one round, then it answers in words.
    # Under specchat's default system prompt it writes the call again even then; under its template's own
    # (--system "": none given) it quotes.
    # Lookup, not auto: auto's choices follow this machine's timings (3 runs in 7 stayed under 1.5 tokens a step),
    # while lookup's copies of the result depend on the text alone.
    env = _configure(tmp_path)
    with_costs(Path(env["XDG_CACHE_HOME"]), "--target", str(target), "--draft", str(draft))
    result = specchat("generate", PROMPT, "--system", "", "--tools", "--allow-tools", "--tool-choice", "read_note",
                      "--guesser", "lookup", "--tool-rounds", "1", "--target", str(target), "--draft", str(draft),
                      "--temp", "0", "--max-tokens", "120", env=env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^specchat: tool read_note\(\{.*\"name\": \"launch\".*\}\) -> \d+ bytes$", result.stderr, re.M), \
        result.stderr
    assert NOTE in result.stdout, result.stdout
    rounds = FIGURES.findall(result.stderr)
    assert len(rounds) == 2, result.stderr  # the call, then the answer with the result
    guesser, tokens, per_step = rounds[-1]
    assert guesser == "lookup" and float(per_step) >= 1.5, result.stderr


def test_tools_without_a_configured_server_is_one_line(tmp_path):
    assert_clean_error(specchat("generate", "hi", "--tools", "--allow-tools", env=_configure(tmp_path, "# none\n")),
                       "no MCP server", "[mcp.servers.NAME]")


def test_tools_asks_on_the_terminal_unless_allowed(tmp_path):
    # Stdin is not a terminal: nobody could answer, so it says what to add rather than waiting.
    result = subprocess.run([sys.executable, "-m", "specchat.cli", "generate", "hi", "--tools"], cwd=REPO,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                            env={**os.environ, **_configure(tmp_path)})
    assert_clean_error(result, "stdin is not a terminal", "--allow-tools")
