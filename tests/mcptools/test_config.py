"""Which MCP servers are configured: config.toml's [mcp.servers.NAME], a Claude Desktop JSON file it imports,
and one line for each entry that is wrong (naming the server and the field), never a stop."""

from __future__ import annotations

import json

from specchat.mcptools.config import DEFAULT_TIMEOUT_S, McpConfig, ServerEntry, load_config, read_desktop_json
from specchat.service.settings import Settings, load_settings, save_settings

CONFIG = """\
temperature = 0.5

[mcp]
timeout_s = 20

[mcp.servers.files]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
env = { NOTES_TOKEN = "abc" }

[mcp.servers.web]
url = "https://mcp.example.com/mcp"
headers = { Authorization = "Bearer xyz" }
"""


def test_servers_are_read_from_config_toml_as_claude_desktop_writes_them(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(CONFIG)
    assert load_config(path) == McpConfig(servers=(
        ServerEntry("files", command="npx", args=("-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"),
                    env={"NOTES_TOKEN": "abc"}),
        ServerEntry("web", url="https://mcp.example.com/mcp", headers={"Authorization": "Bearer xyz"})),
        timeout_s=20.0)
    # The settings read the same file and leave the [mcp] table alone: no "unknown setting" line, and a save
    # rewrites only their own keys.
    assert load_settings(path) == (Settings(temperature=0.5), [])
    save_settings(Settings(temperature=0.7), path)
    assert path.read_text() == CONFIG.replace("temperature = 0.5", "temperature = 0.7")


def test_no_file_and_no_table_configure_no_servers(tmp_path):
    assert load_config(tmp_path / "none.toml") == McpConfig()
    (tmp_path / "config.toml").write_text("temperature = 0.5\n")
    assert load_config(tmp_path / "config.toml") == McpConfig(timeout_s=DEFAULT_TIMEOUT_S)


DESKTOP = {"mcpServers": {
    "files": {"command": "old-files", "autoApprove": []},  # another client's field: skipped without a word
    "notes": {"command": "uvx", "args": ["notes-mcp"], "env": {"NOTES_DIR": "/n"}},
    "remote": {"type": "http", "url": "http://127.0.0.1:9000/mcp"},
    "off": {"command": "x", "disabled": True},  # Cline's switch
}}


def test_a_claude_desktop_file_is_imported_and_config_toml_overrides_its_servers(tmp_path):
    (tmp_path / "claude_desktop_config.json").write_text(json.dumps(DESKTOP))
    path = tmp_path / "config.toml"
    path.write_text('[mcp]\nimport = "claude_desktop_config.json"\n\n[mcp.servers.files]\ncommand = "new-files"\n')
    config = load_config(path)
    assert config.problems == ()
    # config.toml's "files" replaces the file's, and comes after every imported server.
    assert config.servers == (ServerEntry("notes", command="uvx", args=("notes-mcp",), env={"NOTES_DIR": "/n"}),
                              ServerEntry("remote", url="http://127.0.0.1:9000/mcp"),
                              ServerEntry("files", command="new-files"))


def test_a_desktop_file_that_is_missing_or_not_that_shape_is_one_line(tmp_path):
    assert read_desktop_json(tmp_path / "nope.json") == (
        [], [f"{tmp_path / 'nope.json'}: no such file (mcp.import names it); no servers imported from it"])
    (tmp_path / "bad.json").write_text('{"servers": {}}')
    _, [line] = read_desktop_json(tmp_path / "bad.json")
    assert line.startswith(f"{tmp_path / 'bad.json'}: no mcpServers object")
    (tmp_path / "broken.json").write_text('{"mcpServers": ')
    _, [line] = read_desktop_json(tmp_path / "broken.json")
    assert line.startswith(f"{tmp_path / 'broken.json'}: unreadable (")


BROKEN = """\
[mcp]
colour = "blue"

[mcp.servers.ok]
command = "ok-server"

[mcp.servers.badargs]
command = "x"
args = "--port 3"

[mcp.servers.badenv]
command = "x"
env = { PORT = 3 }

[mcp.servers.nothing]
args = ["a"]

[mcp.servers.sse]
type = "sse"
url = "http://127.0.0.1:1/sse"

[mcp.servers.both]
url = "http://127.0.0.1:1/mcp"
command = "x"

[mcp.servers.ftp]
url = "ftp://example.com"

[mcp.servers.typo]
command = "x"
arg = ["y"]
"""


def test_each_broken_entry_is_one_line_naming_the_server_and_the_field_and_the_rest_load(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text(BROKEN)
    config = load_config(path)
    assert config.servers == (ServerEntry("ok", command="ok-server"), ServerEntry("typo", command="x"))
    assert list(config.problems) == [
        f"{path} line 2: unknown setting mcp.colour ignored",
        f"{path} line 9: server 'badargs': args must be a list of text, got '--port 3'; server left out",
        f"{path} line 13: server 'badenv': env must be a table of text values, got {{'PORT': 3}}; server left out",
        f"{path} line 15: server 'nothing': needs a command (or a url); server left out",
        f"{path} line 19: server 'sse': type must be stdio or http, got 'sse' (SSE is not supported: use the "
        "server's streamable HTTP endpoint); server left out",
        f"{path} line 24: server 'both': has both url and command: keep one; server left out",
        f"{path} line 27: server 'ftp': url must be an http:// or https:// URL, got 'ftp://example.com'; "
        "server left out",
        f"{path} line 31: server 'typo': unknown field 'arg' ignored",
    ]


def test_a_bad_timeout_is_one_line_and_the_default_holds(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[mcp]\ntimeout_s = -1\n")
    assert load_config(path) == McpConfig(timeout_s=DEFAULT_TIMEOUT_S, problems=(
        f"{path} line 2: mcp.timeout_s must be a number of seconds, 0 to 3600, got -1; using 60",))
