"""Real MCP servers written with the SDK, for the tests of specchat.mcptools.

Run as a script it serves over stdio (as a configured `command` would); with `--http LIFETIME_S` it serves
streamable HTTP on a free port of 127.0.0.1 only, prints the port on its first line of stdout, and exits by
itself after LIFETIME_S seconds, should the test that started it fail to stop it. `http_server()` starts that
process from a test and always stops it.

The tools: `echo` (its text back), `boom` (raises), `env` (a variable of the server's environment), `block`
(never returns: for timeouts), `big` (a result of N bytes), `header` (one of an HTTP request's headers), `die`
(exits mid-call), `pid` (the server's process id), `picture` (a text and an image). The `SERVER_TAG` variable,
when the entry sets it, is added to echo's answer: two servers of this one script can then be told apart.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# Only the names: the tools' annotations are read where the tools are made, and MCPServer sets up logging
# where it is made, which must be the server's process only.
from mcp.server.mcpserver import Context, Image, MCPServer

SCRIPT = str(Path(__file__).resolve())


def build() -> MCPServer:
    """The server with its tools. Built only in the server's process: MCPServer sets up logging where it is made."""
    server = MCPServer("specchat-test")

    @server.tool()
    def echo(text: str) -> str:
        """Answer with the text given."""
        return text + os.environ.get("SERVER_TAG", "")

    @server.tool()
    def boom() -> str:
        """Always fails."""
        raise RuntimeError("the boom tool always raises")

    @server.tool()
    def env(name: str) -> str:
        """The value of one of the server's environment variables."""
        return os.environ.get(name, "<unset>")

    @server.tool()
    async def block() -> str:
        """Never answers (until the server is stopped)."""
        import anyio

        await anyio.sleep_forever()
        return "unreachable"

    @server.tool()
    def big(size: int) -> str:
        """A text of `size` bytes: 'a' to 'z' over and over."""
        return ("abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size]

    @server.tool()
    def header(name: str, ctx: Context) -> str:
        """One header of the HTTP request that carried the call ("<none>" over stdio)."""
        return (ctx.headers or {}).get(name.lower(), "<none>")

    @server.tool()
    def die() -> str:
        """Ends the server's process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def pid() -> str:
        """The server's process id."""
        return str(os.getpid())

    @server.tool()
    def picture() -> list:
        """A caption and a tiny image."""
        return ["a caption", Image(data=b"\x89PNG\r\n\x1a\n" + bytes(24), format="png")]

    return server


def serve_http(lifetime_s: float) -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # loopback only
    print(sock.getsockname()[1], flush=True)
    # Bounded life: if the test that started it dies, it still goes.
    threading.Timer(lifetime_s, lambda: os._exit(0)).start()
    config = uvicorn.Config(build().streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


@contextmanager
def http_server(lifetime_s: float = 60.0, timeout_s: float = 30.0) -> Iterator[str]:
    """This script serving streamable HTTP in a process of its own; yields its URL."""
    stderr = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, SCRIPT, "--http", str(lifetime_s)], stdout=subprocess.PIPE,
                            stderr=stderr, text=True)

    def said() -> str:
        stderr.seek(0)
        return stderr.read()[-2000:]

    try:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        assert ready, f"the MCP test server did not name its port within {timeout_s} s: {said()}"
        line = proc.stdout.readline()
        assert line.strip().isdigit(), f"the MCP test server did not start: {said()}"
        port = int(line)
        # The port is bound before it is printed, but uvicorn accepts only once it runs: wait until it does.
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    f"the MCP test server did not accept connections: {said()}"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait(10)
        stderr.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        serve_http(float(sys.argv[2]))
    else:
        build().run()
