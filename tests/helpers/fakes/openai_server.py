"""A small OpenAI-compatible server for the remote backend's tests, run by uvicorn in a thread on a
free 127.0.0.1 port. It streams a scripted answer one word per chunk, and reports what the three
kinds of real server report:

- "timings": llama-server's (and specchat serve's) `timings` object on the last chunk;
- "vllm": no timings, but vLLM's speculative-decoding counters on a Prometheus `/metrics` page;
- "plain": neither.

Offered tools, it calls them as llama-server streams calls (`calls`: each answer takes the first entry): the id
and name in the first piece, the arguments a few characters a piece, by index; or it refuses them
(`refuse_tools`: the error a server without tool support gives).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

PAUSE_S = 10.0  # the longest a paused stream waits for the client to go
DRAFTED, ACCEPTED = 8, 6  # what each answer adds to the drafted and accepted figures
ARGUMENT_PIECE = 5  # characters of a call's arguments a streamed piece


@dataclass
class FakeServer:
    kind: str = "timings"
    api_key: str | None = None
    answer: str = "Hello from the fake server, one word per chunk."
    thinking: str = ""  # streamed first, a word a chunk, as reasoning_content (llama-server's field)
    models: tuple[str, ...] = ("fake-target", "fake-other")
    pause_after: int | None = None  # chunks after which a stream waits for the client to disconnect
    pause_in_call: bool = False  # a stream waits so after its first call's first piece
    break_after: int | None = None  # words after which the server drops the connection mid-answer
    finish: str = "stop"  # the finish_reason the answer ends with ("length": cut at max_tokens)
    # The calls each answer offered tools makes, after its words ({"id", "name", "arguments"} each; an answer made
    # when this is empty makes none); its finish_reason is then "tool_calls".
    calls: list[list[dict]] = field(default_factory=list)
    refuse_tools: str | None = None  # a request with tools is answered 500 with this message
    requests: list[dict] = field(default_factory=list)
    paused: threading.Event = field(default_factory=threading.Event)
    disconnected: threading.Event = field(default_factory=threading.Event)  # a stream ended by the client
    drafted: int = 1000  # vLLM's counters: server-wide, so they start from earlier traffic
    accepted: int = 700
    url: str = ""

    def words(self) -> list[str]:
        words = [w + " " for w in self.answer.split(" ")] if self.answer else []
        if words:
            words[-1] = words[-1].rstrip()
        return words

    def app(self) -> FastAPI:
        app = FastAPI()

        def refused(request: Request) -> JSONResponse | None:
            if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
                return JSONResponse({"error": {"message": "Invalid API Key", "type": "authentication_error"}}, 401)
            return None

        @app.get("/v1/models")
        async def models(request: Request):
            if (no := refused(request)) is not None:
                return no
            extra = {"max_model_len": 2048} if self.kind == "vllm" else {"meta": {"n_ctx_train": 8192}}
            return {"object": "list", "data": [{"id": m, "object": "model", "created": 0, "owned_by": "test", **extra}
                                               for m in self.models]}

        @app.get("/metrics")
        async def metrics():
            if self.kind != "vllm":
                return PlainTextResponse("not found", 404)
            return PlainTextResponse(
                "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n"
                "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="fake-target"}} {self.drafted}.0\n'
                "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.\n"
                "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="fake-target"}} {self.accepted}.0\n')

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            if (no := refused(request)) is not None:
                return no
            body = await request.json()
            self.requests.append(body)
            if body.get("model") not in self.models:
                return JSONResponse({"error": {"message": f"model {body.get('model')!r} not found"}}, 404)
            if body.get("tools") and self.refuse_tools:
                return JSONResponse({"error": {"code": 500, "message": self.refuse_tools, "type": "server_error"}}, 500)
            return StreamingResponse(self._stream(body), media_type="text/event-stream")

        return app

    async def _pause(self) -> None:
        """Wait for the client to go (at most PAUSE_S), saying so in `paused`."""
        self.paused.set()
        deadline = time.monotonic() + PAUSE_S
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)  # cancelled here when the client closes the stream

    async def _stream(self, body: dict) -> Iterator[str]:
        words = self.words()
        base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": body["model"]}

        def event(choices: list, **extra) -> str:
            return f"data: {json.dumps({**base, 'choices': choices, **extra})}\n\n"

        finished = False
        try:
            yield event([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for word in self.thinking.split(" ") if self.thinking else ():
                yield event([{"index": 0, "delta": {"reasoning_content": word + " "}, "finish_reason": None}])
            for n, word in enumerate(words):
                if n == self.pause_after:
                    await self._pause()
                if n == self.break_after:
                    raise ConnectionAbortedError("the fake server drops the connection")  # uvicorn cuts it
                await asyncio.sleep(0)
                yield event([{"index": 0, "delta": {"content": word}, "finish_reason": None}])
            calls = self.calls.pop(0) if body.get("tools") and self.calls else []
            for n, call in enumerate(calls):
                for k, piece in enumerate(_call_pieces(n, call)):
                    yield event([{"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None}])
                    if self.pause_in_call and n == k == 0:
                        await self._pause()
            yield event([{"index": 0, "delta": {}, "finish_reason": "tool_calls" if calls else self.finish}])
            if self.kind == "vllm":  # the answer's drafting shows in the counters
                self.drafted, self.accepted = self.drafted + DRAFTED, self.accepted + ACCEPTED
            extra = {}
            if self.kind == "timings":
                extra["timings"] = {"prompt_n": 10, "prompt_ms": 40.0, "cache_n": 2, "predicted_n": len(words),
                                    "predicted_ms": 250.0, "predicted_per_second": len(words) / 0.25,
                                    "draft_n": DRAFTED, "draft_n_accepted": ACCEPTED}
            usage = {"prompt_tokens": 12, "completion_tokens": len(words), "total_tokens": 12 + len(words)}
            yield event([], usage=usage, **extra)
            yield "data: [DONE]\n\n"
            finished = True
        finally:
            if not finished:
                self.disconnected.set()


def _call_pieces(index: int, call: dict) -> list[dict]:
    """One call as llama-server streams it: the id and name first (no arguments yet), then the arguments in
    fragments, each piece naming the call by its index alone."""
    text = call["arguments"]
    first = {"index": index, "type": "function", "function": {"name": call["name"], "arguments": ""}}
    if "id" in call:  # some servers give none
        first["id"] = call["id"]
    return [first] + [{"index": index, "function": {"arguments": text[i:i + ARGUMENT_PIECE]}}
                      for i in range(0, len(text), ARGUMENT_PIECE)]


@contextmanager
def serving(server: FakeServer) -> Iterator[FakeServer]:
    """Run the server on a free port of 127.0.0.1 until the block ends (then stop it and wait for it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(server.app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not uv.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the fake server did not start"
            time.sleep(0.01)
        server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        yield server
    finally:
        uv.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "the fake server did not stop"


def free_port() -> int:
    """A port nothing listens on (for the connection-refused case)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
