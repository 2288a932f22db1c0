"""The configured MCP servers' tools, for a caller that is not async: the engine's thread, the UI's workers,
`specchat generate`.

The `mcp` SDK is async, and a session lives inside the task that opened it (its transport's task group and
cancel scopes belong to that task). So one background thread runs one asyncio loop, and each server gets a
task there that opens its session, lists its tools, and holds the session until `close()`. A call from the
caller's thread is a coroutine sent to that loop, waited on with a bound.

Nothing ever raises out of `call`: a server that did not start, a call that timed out, a tool that failed or
arguments that are not JSON each give a `ToolResult` with one line saying so, which the model gets as the
tool's result. `close()` ends every server's process (the SDK closes its stdin, then terminates its process
group) and returns only when they have exited.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import json
import math
import tempfile
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import IO, Any, AsyncIterator, Sequence

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation, Tool

from specchat.mcptools.config import DEFAULT_TIMEOUT_S, ServerEntry
from specchat.mcptools.names import exposed_names
from specchat.mcptools.results import MAX_RESULT_BYTES, ToolResult, capped, content_text, one_line

START_TIMEOUT_S = 30.0  # a server that has not answered by then (handshake and tool list) is left out
CLOSE_TIMEOUT_S = 15.0  # the SDK's own shutdown of a stdio server is bounded at about 6 s
_PAGES = 100  # a tool list that pages on past this is cut there: a broken server must not hang the start
_SLACK_S = 5.0  # the caller's own bound beyond the call's timeout, should the loop itself be stuck


@dataclass(eq=False)
class _Server:
    """One server's session, held by its task on the loop."""

    entry: ServerEntry
    stderr: IO[str]
    client: Client | None = None
    tools: list[Tool] = field(default_factory=list)
    problem: str = ""  # why it did not start
    stop: anyio.Event | None = None
    done: asyncio.Future[None] | None = None


class McpClient:
    """The tools of the servers given to `start`, called by the names `tools()` lists (see `names` for the
    rule). One caller at a time: a lock makes each method wait for the one before it."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
                 max_result_bytes: int = MAX_RESULT_BYTES) -> None:
        self.timeout_s, self.start_timeout_s, self.max_result_bytes = timeout_s, start_timeout_s, max_result_bytes
        self._lock = threading.RLock()
        self._servers: list[_Server] = []
        self._by_name: dict[str, tuple[_Server, Tool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self, servers: Sequence[ServerEntry]) -> list[str]:
        """Start or connect to each server, all at once, and list their tools. Returns one line for each that did
        not (its tools are simply absent). With no servers, nothing starts: not even the thread."""
        with self._lock:
            if not servers:
                return []
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="specchat-mcp", daemon=True)
                self._thread.start()
                # A caller that exits without closing (an exception, Ctrl+C in `specchat generate`) still ends its
                # servers: each runs in a session of its own, which no signal to ours reaches.
                atexit.register(self.close)
            # Each server's stderr goes to a file of its own, not the terminal the app draws on; its last line
            # explains a server that did not start.
            new = [_Server(entry, tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")) for entry in servers]
            self._servers += new
            future = asyncio.run_coroutine_threadsafe(self._start_all(new), self._loop)
            try:
                # Each start ends by its deadline, then the SDK's bounded shutdown: only a wedged loop waits longer.
                future.result(self.start_timeout_s + CLOSE_TIMEOUT_S + _SLACK_S)
            except concurrent.futures.TimeoutError:
                for server in new:
                    if server.client is None and not server.problem:
                        server.problem = f"MCP server {server.entry.name!r} did not start: the MCP client's loop did not answer"
            self._by_name = self._names()
            return [s.problem for s in new if s.problem]

    def tools(self) -> list[dict[str, Any]]:
        """Every started server's tools as OpenAI function schemas, for ChatTemplate.render(tools=) and requests."""
        with self._lock:
            return [{"type": "function", "function": {"name": name, "description": tool.description or tool.title or "",
                                                      "parameters": tool.input_schema}}
                    for name, (_, tool) in self._by_name.items()]

    def server_of(self, name: str) -> str:
        """The name of the server whose tool the model calls `name` ("" for none), for showing a call."""
        with self._lock:
            found = self._by_name.get(name)
            return found[0].entry.name if found else ""

    def call(self, name: str, arguments: str, timeout_s: float | None = None) -> ToolResult:
        """Call the tool the model calls `name` with `arguments` (JSON text, as a ToolCall carries them; "" is
        no arguments). Never raises: whatever goes wrong is the result's one line."""
        timeout = timeout_s if timeout_s is not None else self.timeout_s
        with self._lock:
            found = self._by_name.get(name)
            if found is None or self._loop is None:
                known = ", ".join(self._by_name) or "none"
                return ToolResult.failed(f"there is no tool named {name!r} (the tools are: {known}); nothing was called")
            try:
                args = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError) as e:
                return ToolResult.failed(f"the arguments to {name} are not valid JSON ({e}); nothing was called")
            if not isinstance(args, dict):
                return ToolResult.failed(f"the arguments to {name} must be a JSON object, got {arguments!r}; "
                                         "nothing was called")
            server, tool = found
            future = asyncio.run_coroutine_threadsafe(self._call(server, tool.name, args, timeout), self._loop)
            try:
                return future.result(timeout + _SLACK_S)
            except concurrent.futures.TimeoutError:
                future.cancel()
                return ToolResult.failed(f"{name} timed out after {timeout:g} s (server {server.entry.name!r}): "
                                         "the MCP client's loop did not answer")

    def close(self) -> None:
        """End every server (their processes have exited when this returns) and the loop's thread. Safe to call
        twice; a closed client can start servers again."""
        with self._lock:
            if self._loop is None:
                return
            future = asyncio.run_coroutine_threadsafe(self._stop_all(), self._loop)
            try:
                future.result(CLOSE_TIMEOUT_S + _SLACK_S)
            except concurrent.futures.TimeoutError:
                pass  # the SDK's shutdown is bounded: only a wedged loop gets here, and the thread is a daemon
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(CLOSE_TIMEOUT_S)
            if not self._loop.is_running():
                self._loop.close()
            for server in self._servers:
                server.stderr.close()
            self._loop, self._thread, self._servers, self._by_name = None, None, [], {}
            atexit.unregister(self.close)

    # --- on the loop ------------------------------------------------------------------------------------

    async def _start_all(self, servers: list[_Server]) -> None:
        ready = []
        for server in servers:
            started = asyncio.get_running_loop().create_future()
            server.done = asyncio.ensure_future(self._hold(server, started))
            ready.append(started)
        await asyncio.gather(*ready)

    async def _hold(self, server: _Server, started: asyncio.Future[None]) -> None:
        """Open the server's session, list its tools, and hold the session until `_stop_all` sets `stop`.

        The start is bounded by a deadline on the scope the session lives in, lifted once the tools are
        listed: a scope entered around the session must also be left after it (anyio's rule)."""
        server.stop = anyio.Event()
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.start_timeout_s) as scope:
                async with Client(self._transport(server), client_info=Implementation(name="specchat", version="0.1.0"),
                                  read_timeout_seconds=self.start_timeout_s) as client:
                    server.tools = await _list_tools(client)
                    server.client = client
                    scope.deadline = math.inf
                    started.set_result(None)
                    await server.stop.wait()
            if scope.cancelled_caught and not started.done():
                server.problem = self._did_not_start(server, f"no answer within {self.start_timeout_s:g} s")
        except Exception as e:  # noqa: BLE001 - whatever a server does, the others and the app go on
            if not started.done():
                server.problem = self._did_not_start(server, _why(e, server.entry))
        finally:
            server.client = None
            if not started.done():
                started.set_result(None)

    def _transport(self, server: _Server) -> Any:
        entry = server.entry
        if entry.remote:
            return _http(entry.url, entry.headers) if entry.headers else entry.url
        return stdio_client(StdioServerParameters(command=entry.command, args=list(entry.args), env=entry.env,
                                                  cwd=entry.cwd or None), errlog=server.stderr)

    def _did_not_start(self, server: _Server, why: str) -> str:
        server.stderr.flush()
        server.stderr.seek(0)
        said = [line.strip() for line in server.stderr.read()[-4096:].splitlines() if line.strip()]
        tail = f"; its last words: {said[-1]}" if said else ""
        return one_line(f"MCP server {server.entry.name!r} did not start: {why}{tail}")

    async def _call(self, server: _Server, tool: str, args: dict[str, Any], timeout: float) -> ToolResult:
        client, shown = server.client, f"{tool} (server {server.entry.name!r})"
        if client is None:
            return ToolResult.failed(f"{shown} failed: the server has stopped")
        try:
            with anyio.fail_after(timeout):
                result = await client.call_tool(tool, args, read_timeout_seconds=timeout)
        except TimeoutError:
            return ToolResult.failed(f"{shown} timed out after {timeout:g} s")
        except Exception as e:  # noqa: BLE001 - a protocol error, a closed connection: the conversation goes on
            if "timed out" in str(e):  # the SDK's own REQUEST_TIMEOUT, which may come first
                return ToolResult.failed(f"{shown} timed out after {timeout:g} s")
            return ToolResult.failed(f"{shown} failed: {_why(e, server.entry)}")
        text = content_text(result.content)
        if not text and result.structured_content is not None:
            text = json.dumps(result.structured_content, ensure_ascii=False)
        if result.is_error:
            return ToolResult.failed(f"{shown} reported an error: {text or 'no message'}")
        return capped(text, self.max_result_bytes)

    async def _stop_all(self) -> None:
        for server in self._servers:
            if server.stop is not None:
                server.stop.set()
        pending = [s.done for s in self._servers if s.done is not None]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_TIMEOUT_S)

    def _names(self) -> dict[str, tuple[_Server, Tool]]:
        listed = [(server, tool) for server in self._servers if server.client is not None for tool in server.tools]
        names = exposed_names([(server.entry.name, tool.name) for server, tool in listed])
        return dict(zip(names, listed))


async def _list_tools(client: Client) -> list[Tool]:
    tools, cursor = [], None
    for _ in range(_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if cursor is None:
            break
    return tools


@asynccontextmanager
async def _http(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """Streamable HTTP with the entry's headers: the SDK takes them on an HTTP client of ours, which it then
    leaves for us to close. The timeouts are the SDK's defaults (a long read: a server may stream)."""
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


def _why(error: BaseException, entry: ServerEntry) -> str:
    """One line for what went wrong, from the first real error in an exception group."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    if isinstance(error, FileNotFoundError) and not entry.remote:
        return f"command {entry.command!r} not found: check the server's command in the config"
    if isinstance(error, PermissionError) and not entry.remote:
        return f"command {entry.command!r} cannot be run (permission denied)"
    return one_line(str(error)) or type(error).__name__
