"""McpClient against real MCP servers written with the SDK (tests/helpers/mcp_servers.py): one over stdio, one more of
the same script (so that tool names clash), one over streamable HTTP on 127.0.0.1, and a command that does not
exist. Every wait is bounded: timeouts are short, and a tool that never answers is what the timeouts cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mcp_servers import SCRIPT, http_server

from specchat.mcptools.client import McpClient
from specchat.mcptools.config import ServerEntry
from specchat.mcptools.results import MAX_RESULT_BYTES, ToolResult

pytestmark = pytest.mark.timeout(120)

SECRET = "SPECCHAT_TEST_SHELL_SECRET"


def stdio(name: str, **env: str) -> ServerEntry:
    return ServerEntry(name, command=sys.executable, args=(SCRIPT,), env=env)


@pytest.fixture(scope="module")
def client():
    # A variable of the shell that starts the servers, which no entry names: no server may see it.
    os.environ[SECRET] = "from the shell"
    try:
        with http_server() as url, McpClient(timeout_s=30) as mcp:
            problems = mcp.start([stdio("a", SERVER_TAG=" (from a)"), stdio("b", SERVER_TAG=" (from b)"),
                                  ServerEntry("web", url=url), ServerEntry("gone", command="/no/such/mcp-server")])
            yield mcp, problems
    finally:
        del os.environ[SECRET]


def tool_names(mcp: McpClient) -> list[str]:
    return [t["function"]["name"] for t in mcp.tools()]


def test_every_servers_tools_are_listed_as_functions_with_the_server_named_where_names_clash(client):
    mcp, _ = client
    names = tool_names(mcp)
    # All three servers offer echo: each is called by its server's name. Nothing of the missing server.
    assert {"a__echo", "b__echo", "web__echo"} <= set(names) and "echo" not in names
    assert not any(n.startswith("gone") for n in names)
    echo = next(t for t in mcp.tools() if t["function"]["name"] == "a__echo")
    assert echo["type"] == "function" and echo["function"]["description"] == "Answer with the text given."
    assert echo["function"]["parameters"]["properties"]["text"]["type"] == "string"
    assert mcp.server_of("web__echo") == "web"


def test_a_call_reaches_the_server_it_names_over_stdio_and_http(client):
    mcp, _ = client
    assert mcp.call("a__echo", json.dumps({"text": "hello"})).text == "hello (from a)"
    assert mcp.call("b__echo", json.dumps({"text": "hello"})).text == "hello (from b)"
    result = mcp.call("web__echo", '{"text": "över HTTP"}')
    assert (result.text, result.error) == ("över HTTP", False)


def test_an_http_servers_headers_go_with_every_request():
    with http_server() as url, McpClient(timeout_s=30) as mcp:
        assert mcp.start([ServerEntry("web", url=url, headers={"Authorization": "Bearer test-token"})]) == []
        assert mcp.call("header", '{"name": "Authorization"}').text == "Bearer test-token"


def test_a_command_that_does_not_exist_is_one_line_and_the_others_start(client):
    _, problems = client
    assert problems == ["MCP server 'gone' did not start: command '/no/such/mcp-server' not found: "
                        "check the server's command in the config"]


def test_a_tool_that_raises_is_one_line_and_the_server_goes_on(client):
    mcp, _ = client
    result = mcp.call("a__boom", "")
    assert result.error and result.text.startswith("boom (server 'a') reported an error: ")
    assert "\n" not in result.text
    assert mcp.call("a__echo", '{"text": "still here"}').text == "still here (from a)"


@pytest.mark.parametrize("server", ["a", "web"])
def test_a_call_that_hangs_times_out_in_one_line_and_the_server_goes_on(client, server):
    mcp, _ = client
    result = mcp.call(f"{server}__block", "", timeout_s=0.5)  # block never answers: only the timeout ends the call
    assert result.error and result.text == f"block (server '{server}') timed out after 0.5 s"
    assert mcp.call(f"{server}__echo", '{"text": "next"}').text.startswith("next")


def test_a_megabyte_is_cut_to_the_cap_with_a_line_saying_how_much(client):
    mcp, _ = client
    result = mcp.call("a__big", json.dumps({"size": 1 << 20}))
    kept, _, note = result.text.rpartition("\n")
    assert not result.error and len(kept) == MAX_RESULT_BYTES and kept.startswith("abcdefghij")
    assert result.cut == (1 << 20) - MAX_RESULT_BYTES
    assert note == f"[result cut: {result.cut} of its {1 << 20} bytes left out, over the 256 KiB limit]"


def test_a_server_sees_only_its_entrys_environment_and_what_a_process_needs(client):
    mcp, _ = client
    assert mcp.call("a__env", json.dumps({"name": SECRET})).text == "<unset>"
    assert mcp.call("a__env", '{"name": "SERVER_TAG"}').text == " (from a)"
    assert mcp.call("a__env", '{"name": "PATH"}').text == os.environ["PATH"]  # the SDK passes PATH on


@pytest.mark.parametrize("arguments, why", [
    ('{"text": ', "the arguments to a__echo are not valid JSON (Expecting value: line 1 column 10 (char 9)); "
                  "nothing was called"),
    ('["hi"]', """the arguments to a__echo must be a JSON object, got '["hi"]'; nothing was called"""),
])
def test_arguments_that_are_not_a_json_object_are_one_line_and_call_nothing(client, arguments, why):
    mcp, _ = client
    result = mcp.call("a__echo", arguments)
    assert (result.text, result.error) == (why, True)


def test_an_unknown_tool_is_one_line(client):
    result = client[0].call("echo", "{}")
    assert result.error and result.text.startswith("there is no tool named 'echo' (the tools are: a__echo, ")


def test_content_other_than_text_is_named_in_a_line(client):
    assert client[0].call("a__picture", "").text == "a caption\n[image (image/png, 32 bytes) not shown]"


# --- starting and stopping ----------------------------------------------------------------------------------

def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_close_leaves_no_server_process_even_one_stuck_in_a_call():
    mcp = McpClient()
    pids = []
    try:
        assert mcp.start([stdio("a"), stdio("b")]) == []
        pids = [int(mcp.call(f"{s}__pid", "").text) for s in ("a", "b")]
        assert all(alive(pid) for pid in pids)
        assert mcp.call("a__block", "", timeout_s=0.2).error  # a is still busy with it
        mcp.close()
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids:  # a planted bug must not leave them behind
            if alive(pid):
                os.kill(pid, 9)
        mcp.close()


def test_a_program_that_exits_without_closing_leaves_no_server_process(tmp_path):
    # The server is stuck in a call (block), so the end of its stdin alone would not end it.
    program = f"""
import sys
from specchat.mcptools.client import McpClient
from specchat.mcptools.config import ServerEntry
mcp = McpClient()
mcp.start([ServerEntry("a", command=sys.executable, args=({SCRIPT!r},))])
print(mcp.call("pid", "").text, flush=True)
mcp.call("block", "", timeout_s=0.2)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    pid = int(done.stdout.split()[0])
    try:
        assert not alive(pid)
    finally:
        if alive(pid):
            os.kill(pid, 9)


def test_a_server_that_dies_in_a_call_is_one_line_for_that_call_and_every_later_one():
    with McpClient(timeout_s=30) as mcp:
        assert mcp.start([stdio("a")]) == []
        assert mcp.call("die", "") == ToolResult.failed("die (server 'a') failed: Connection closed")
        # Not a wait for the timeout: the closed connection answers at once.
        assert mcp.call("echo", '{"text": "x"}') == ToolResult.failed("echo (server 'a') failed: Connection closed")


def test_a_closed_client_starts_servers_again():
    mcp = McpClient()
    try:
        for _ in range(2):
            assert mcp.start([stdio("a")]) == []
            assert mcp.call("echo", '{"text": "again"}').text == "again"
            mcp.close()
    finally:
        mcp.close()


def test_a_server_that_never_answers_is_left_out_in_one_line_and_stopped(tmp_path):
    pid_file = tmp_path / "pid"
    silent = ServerEntry("silent", command=sys.executable, args=(
        "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"))
    with McpClient(start_timeout_s=1.0) as mcp:
        assert mcp.start([silent]) == ["MCP server 'silent' did not start: no answer within 1 s"]
        assert mcp.tools() == []
        assert not alive(int(pid_file.read_text()))


def test_a_server_that_exits_at_start_is_one_line_with_its_last_words():
    dying = ServerEntry("dying", command=sys.executable, args=("-c", "import sys; sys.exit('no API key given')"))
    with McpClient() as mcp:
        [line] = mcp.start([dying])
    assert line.startswith("MCP server 'dying' did not start: ") and line.endswith("; its last words: no API key given")


def test_no_servers_start_nothing():
    mcp = McpClient()
    assert mcp.start([]) == [] and mcp.tools() == []
    assert mcp._thread is None  # not even the loop's thread
    assert mcp.call("a__echo", "{}").error
    mcp.close()
