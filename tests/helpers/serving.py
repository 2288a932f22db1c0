"""`specchat serve` in a process of its own on a loopback port, for the tests that talk to it over HTTP.
Every server is stopped by the block that started it; every wait is bounded."""

from __future__ import annotations

import http.client
import json
import os
import queue
import re
import secrets
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

KEY = "test-" + secrets.token_hex(8)
PAIR = "smollm2-self"
START_TIMEOUT_S = 120.0


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int
    stderr: list[str]

    def client(self, key: str = KEY, timeout: float = 60.0) -> Any:
        import openai

        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0, timeout=timeout)

    def request(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
                auth: bool = True) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            hdrs = {"Authorization": f"Bearer {KEY}"} if auth else {}
            conn.request(method, path, body=body, headers=hdrs | (headers or {}))
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path: str, obj: Any, **kw: Any) -> tuple[int, dict[str, str], Any]:
        status, headers, body = self.request("POST", path, json.dumps(obj).encode(),
                                             {"Content-Type": "application/json"}, **kw)
        return status, headers, json.loads(body) if headers.get("content-type", "").startswith("application/json") \
            else body

    def health(self) -> dict[str, Any]:
        status, _, body = self.request("GET", "/health", auth=False)
        assert status == 200
        return json.loads(body)

    def wait_idle(self, timeout: float = 30.0) -> dict[str, Any]:
        """/health once no generation runs or waits (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.health()
            if not h["running"] and not h["waiting"]:
                return h
            time.sleep(0.05)
        raise AssertionError(f"the server was still busy after {timeout}s: {self.health()}")

    def rss_kib(self) -> int:
        status = open(f"/proc/{self.proc.pid}/status").read()
        return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))


@contextmanager
def serving(*args: str, env: dict[str, str] | None = None, models: tuple[str, ...] = ("--pair", PAIR)) -> Iterator[Server]:
    """A `specchat serve` process on a free loopback port (port 0: the server names the one it got)."""
    # One llama.cpp thread: on a machine busy with other work, two threads that wait for each other at
    # every step slow down far more than one (here the file took 4 minutes instead of 30 s).
    proc = subprocess.Popen([sys.executable, "-m", "specchat.cli", "serve", *models, "--port", "0", "--threads", "1",
                             *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    lines: queue.Queue[str] = queue.Queue()
    stderr: list[str] = []

    def drain() -> None:  # keep reading, so that the pipe never fills and stalls the server
        for line in proc.stderr:
            stderr.append(line)
            lines.put(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline, port = time.monotonic() + START_TIMEOUT_S, None
        while port is None:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the server did not start in {START_TIMEOUT_S}s: {''.join(stderr)}") from None
            if m := re.search(r"serving .* on http://[^ ]*:(\d+)/v1", line):
                port = int(m.group(1))
            assert proc.poll() is None or port, f"the server exited: {''.join(stderr)}"
        server = Server(proc, port, stderr)
        server.wait_idle(timeout=30)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def in_thread(service: Any, model_id: str = "fake") -> Iterator[Server]:
    """The real server stack (routes, worker thread, uvicorn) over a conversation service this process holds,
    as `specchat serve` runs it, on a free loopback port: for tests over fake models, which read what the
    service saw (`service.last_prompt`). No API key."""
    import uvicorn

    from specchat.server.app import create_app
    from specchat.server.run import bind
    from specchat.server.worker import Worker

    worker = Worker(max_waiting=2)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(service, model_id, worker), log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the in-thread server did not start"
            time.sleep(0.02)
        yield Server(None, sock.getsockname()[1], [])  # type: ignore[arg-type]
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert worker.stop(timeout=30)
        sock.close()
