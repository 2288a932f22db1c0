"""Which MCP servers the user configured: `[mcp.servers.NAME]` tables in config.toml, and the servers of a
Claude Desktop style JSON file (`{"mcpServers": {NAME: {...}}}`) that `[mcp] import` names.

An entry has the fields Claude Desktop's `mcpServers` entries have: `command`, `args` and `env` start a server
as a process speaking MCP over stdin and stdout; `url` (with optional `headers`) connects to a server over
streamable HTTP. Cursor's and VS Code's `type` ("stdio", "http", "streamable-http") is read too, and Cline's
`disabled = true` leaves an entry out.

A server's environment is exactly its entry's `env`, over the few variables a process needs to start that the
SDK passes on (`mcp.client.stdio.DEFAULT_INHERITED_ENV_VARS`: HOME, LOGNAME, PATH, SHELL, TERM and USER on
Linux and macOS): never the rest of the shell's, where API keys for other things live.

Nothing here starts or connects anything: this module only reads what is configured. Offline mode (the
`offline` setting, HF_HUB_OFFLINE or SPECCHAT_OFFLINE) is about what specchat fetches by itself; a `url`
server in this file is one the user configured, and configured means allowed, so it connects offline too.
Nothing that is not configured here ever starts or connects.

Like the settings, a broken entry never stops the app: it is left out with one line that names the file,
the line, the server and the field, and every other server is still read.
"""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specchat.service.settings import default_config_path
from specchat.store.tomlpos import locate

DEFAULT_TIMEOUT_S = 60.0  # how long one call may take before the model is told it timed out
_TYPES = {"stdio": "stdio", "http": "http", "streamable-http": "http", "streamableHttp": "http"}
_FIELDS = {"command", "args", "env", "url", "headers", "type", "disabled", "cwd"}
# Fields other clients write in the same JSON file, which mean nothing here: skipped without a word.
_FOREIGN = {"autoApprove", "alwaysAllow", "timeout", "description", "transportType", "enabled", "trust"}
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ServerEntry:
    """One configured server: a process to start (`command`, `args`, `env`, `cwd`) or a streamable HTTP
    endpoint (`url`, `headers`)."""

    name: str
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str = ""
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def remote(self) -> bool:
        return bool(self.url)


@dataclass(frozen=True)
class McpConfig:
    """The configured servers, in the order written (config.toml's after the imported file's), how long a
    call may take, and one line for each problem found (its entry or value left out)."""

    servers: tuple[ServerEntry, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    problems: tuple[str, ...] = ()


def load_config(path: Path | None = None) -> McpConfig:
    """The `[mcp]` table of config.toml (the settings' file by default). Never raises; a file that cannot be
    read gives no servers and the settings report it (it is their file too)."""
    path = path or default_config_path()
    try:
        text = path.read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return McpConfig()
    mcp = data.get("mcp", {})
    if not isinstance(mcp, dict):
        return McpConfig(problems=(f"{locate(path, text, ('mcp',))}: mcp must be a table ([mcp]); no MCP servers",))
    problems: list[str] = []
    servers: dict[str, ServerEntry] = {}
    timeout_s = DEFAULT_TIMEOUT_S
    for key, value in mcp.items():
        where = locate(path, text, ("mcp", key))
        if key == "import":
            if not isinstance(value, str) or not value:
                problems.append(f"{where}: mcp.import must be the path of a JSON file with mcpServers, got {value!r}")
                continue
            # A relative path is relative to config.toml, so the setting means the same from any directory.
            imported, more = read_desktop_json(path.parent / Path(value).expanduser())
            servers.update((s.name, s) for s in imported)
            problems += more
        elif key == "timeout_s":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                problems.append(f"{where}: mcp.timeout_s must be a number of seconds, 0 to 3600, got {value!r}; "
                                f"using {DEFAULT_TIMEOUT_S:g}")
            else:
                timeout_s = float(value)
        elif key != "servers":
            problems.append(f"{where}: unknown setting mcp.{key} ignored")
    table = mcp.get("servers", {})
    if not isinstance(table, dict):
        problems.append(f"{locate(path, text, ('mcp', 'servers'))}: mcp.servers must be a table of servers "
                        "([mcp.servers.NAME])")
        table = {}
    for name, raw in table.items():
        entry, more = parse_entry(name, raw, lambda *keys, n=name: locate(path, text, ("mcp", "servers", n, *keys)))
        problems += more
        if entry is not None:
            servers.pop(name, None)  # config.toml's own entry replaces an imported one of that name, and comes last
            servers[name] = entry
    return McpConfig(tuple(servers.values()), timeout_s, tuple(problems))


def read_desktop_json(path: Path) -> tuple[list[ServerEntry], list[str]]:
    """The servers of a JSON file in Claude Desktop's shape (`{"mcpServers": {NAME: {...}}}`), and one line per
    problem. Never raises."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return [], [f"{path}: no such file (mcp.import names it); no servers imported from it"]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        return [], [f"{path}: unreadable ({_one_line(e)}); no servers imported from it"]
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        return [], [f"{path}: no mcpServers object (the shape is {{\"mcpServers\": {{\"NAME\": {{...}}}}}}); "
                    "no servers imported from it"]
    entries, problems = [], []
    for name, raw in servers.items():
        entry, more = parse_entry(name, raw, lambda *keys: str(path))
        entries += [entry] if entry is not None else []
        problems += more
    return entries, problems


def parse_entry(name: str, raw: Any, where: Any) -> tuple[ServerEntry | None, list[str]]:
    """One server's entry, or None with the line saying why. `where(*keys)` names the file and line of a key
    under the entry. An unknown field is reported and skipped; a bad value leaves the whole entry out (a server
    started with half its arguments could do something else than the user meant)."""
    said = f"server {name!r}"
    if not _NAME.fullmatch(name):
        return None, [f"{where()}: {said}: a server's name is 1 to 64 letters, digits, '_', '-' or '.'; left out"]
    if not isinstance(raw, dict):
        return None, [f"{where()}: {said} must be a table of fields (command, args, env or url, headers); left out"]
    problems = [f"{where(key)}: {said}: unknown field {key!r} ignored"
                for key in raw if key not in _FIELDS | _FOREIGN]

    def bad(key: str, wanted: str) -> tuple[None, list[str]]:
        return None, problems + [f"{where(key)}: {said}: {key} must be {wanted}, got {raw[key]!r}; server left out"]

    if raw.get("disabled") is True:
        return None, problems
    kind = raw.get("type", "http" if "url" in raw else "stdio")
    if kind not in _TYPES:
        why = " (SSE is not supported: use the server's streamable HTTP endpoint)" if kind == "sse" else ""
        return None, problems + [f"{where('type')}: {said}: type must be stdio or http, got {kind!r}{why}; "
                                 "server left out"]
    for key in ("command", "url", "cwd"):
        if key in raw and not isinstance(raw[key], str):
            return bad(key, "text")
    for key in ("env", "headers"):
        if key in raw and not (isinstance(raw[key], dict) and all(isinstance(v, str) for v in raw[key].values())):
            return bad(key, "a table of text values")
    if "args" in raw and not (isinstance(raw["args"], list) and all(isinstance(a, str) for a in raw["args"])):
        return bad("args", "a list of text")
    if _TYPES[kind] == "http":
        url = raw.get("url", "")
        if not url.startswith(("http://", "https://")):
            return None, problems + [f"{where('url')}: {said}: url must be an http:// or https:// URL, got {url!r}; "
                                     "server left out"]
        if "command" in raw:
            return None, problems + [f"{where('command')}: {said}: has both url and command: keep one; server left out"]
        return ServerEntry(name, url=url, headers=dict(raw.get("headers", {}))), problems
    if not raw.get("command"):
        return None, problems + [f"{where()}: {said}: needs a command (or a url); server left out"]
    return ServerEntry(name, command=raw["command"], args=tuple(raw.get("args", ())), env=dict(raw.get("env", {})),
                       cwd=raw.get("cwd", "")), problems


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
