"""The HTTP routes: OpenAI's chat and text completions (streamed as server-sent events or whole), the
model list and a health check, with OpenAI-style errors for every failure.

A request waits for the worker in its queue; a client that leaves, while waiting or while its answer
is generated, cancels its job at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
import uuid
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import Receive, Scope, Send

from specchat.decoding.events import Done, Step
from specchat.errors import ContextFull, SpecchatError
from specchat.llama.template import ToolCall
from specchat.server.api import (
    ChatRequest,
    CompletionRequest,
    GenerationFields,
    error_body,
    finish_reason,
    timings,
    tool_calls,
    usage,
)
from specchat.server.worker import END, Busy, Failed, Worker
from specchat.service.chat import ChatService
from specchat.service.events import Answered, ChatEvent, Notice, Said
from specchat.service.toolsplit import check_tools

log = logging.getLogger("specchat.server")

MAX_BODY = 4 * 2**20
STATUS_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 503: "server_busy"}


def error(status: int, message: str, param: str | None = None, code: str | None = None,
          headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, STATUS_TYPES.get(status, "server_error"), param, code), status,
                        headers=headers)


def create_app(service: ChatService, model_id: str, worker: Worker, api_key: str | None = None) -> FastAPI:
    """The routes over `service`, each answer a job for `worker`; with `api_key`, every route but /health wants it."""
    app = FastAPI(title="specchat", docs_url=None, redoc_url=None, openapi_url=None)
    _add_error_handlers(app)
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=MAX_BODY)  # counts bodies sent in chunks too
    app.add_middleware(_DeclaredSizeLimit)  # outside it: a declared length over the limit, answered at once
    authorized = [Depends(_bearer(api_key))] if api_key else []
    _add_status_routes(app, service, model_id, worker, authorized)
    _add_completion_routes(app, service, model_id, worker, authorized)
    return app


def _add_status_routes(app: FastAPI, service: ChatService, model_id: str, worker: Worker,
                       authorized: list[Any]) -> None:
    """What the server is: its health and queue (asked without the key), and its one model."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        c = worker.counters
        return {"status": "ok", "model": model_id, "running": worker.running, "waiting": worker.waiting,
                "completed": c.completed, "cancelled": c.cancelled, "dropped": c.dropped,
                "rejected": c.rejected, "failed": c.failed,
                "last": c.last}

    @app.get("/v1/models", dependencies=authorized)
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "specchat",
                                            "meta": {"n_ctx": service.n_ctx, "guessers": service.guessers}}]}


def _add_completion_routes(app: FastAPI, service: ChatService, model_id: str, worker: Worker,
                           authorized: list[Any]) -> None:
    """The answers: chat completions (with tools, where a request gives them) and text completions, each a job
    for the worker."""

    @app.post("/v1/chat/completions", dependencies=authorized)
    async def chat_completions(body: ChatRequest, request: Request) -> Response:
        messages, tools, choice = body.conversation(), body.tool_schemas(), body.choice()
        check_tools(tools, choice)  # a bad tool_choice is a 400 before the request queues
        config = body.generation_config(service.n_ctx)
        first_only = body.parallel_tool_calls is False

        def work(cancel: threading.Event) -> Iterator[ChatEvent]:
            variables = service.template_variables(None, body.template_variables())
            # Without tools, the call is the one it always was (tools=None): nothing about the answer changes.
            events = service.chat(messages, config, body.guesser, cancel, variables, **(
                {"tools": tools, "tool_choice": choice, "parallel_tool_calls": body.parallel_tool_calls is True}
                if tools else {}))
            return _first_call_only(events) if first_only else events

        return await _respond(request, worker, work, body, _Shape(model_id, chat=True))

    @app.post("/v1/completions", dependencies=authorized)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        prompt, config = body.prompt_value(), body.generation_config(service.n_ctx)

        def work(cancel: threading.Event) -> Iterator[ChatEvent]:
            return service.complete(prompt, config, body.guesser, cancel)

        return await _respond(request, worker, work, body, _Shape(model_id, chat=False))


def _first_call_only(events: Iterator[ChatEvent]) -> Iterator[ChatEvent]:
    """parallel_tool_calls false: an answer's first call, and none after it (their text is not content either)."""
    seen = 0
    for event in events:
        if isinstance(event, (Said, Answered)) and event.calls:
            keep = event.calls[:1] if isinstance(event, Answered) else event.calls[:max(0, 1 - seen)]
            seen += len(keep)
            event = replace(event, calls=keep)
        yield event


class _Shape:
    """The JSON of one kind of completion: chat (messages and deltas) or text."""

    def __init__(self, model_id: str, chat: bool) -> None:
        self.model, self.chat = model_id, chat
        self.prompt_field = "messages" if chat else "prompt"  # the param a too-long prompt error names
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _envelope(self, choices: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if stream and self.chat else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _choice(self, text: str | None, finish: str | None, stream: bool, role: bool = False,
                thinking: str = "", calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        # A reasoning model's thinking goes in reasoning_content, as llama-server, vLLM and DeepSeek send it.
        reasoning = {"reasoning_content": thinking} if thinking else {}
        called = {"tool_calls": calls} if calls else {}
        if not self.chat:
            choice["text"] = text or ""
        elif stream:
            choice["delta"] = ({"role": "assistant"} if role else {}) | (
                {"content": text} if text is not None else {}) | reasoning | called
        else:
            # An answer that only calls has no content: null, as OpenAI sends it.
            choice["message"] = {"role": "assistant", "content": text or None if calls else text} | reasoning | called
        return choice

    def whole(self, done: Answered, notices: list[str]) -> dict[str, Any]:
        choice = self._choice(done.text, finish_reason(done), stream=False, thinking=done.thinking,
                              calls=tool_calls(done.calls))
        return self._envelope([choice], stream=False) | {"usage": usage(done.stats), "timings": timings(done)} | (
            _notices(notices))

    def opening(self) -> dict[str, Any] | None:
        return self._envelope([self._choice("", None, stream=True, role=True)], stream=True) if self.chat else None

    def chunk(self, text: str, thinking: str = "") -> dict[str, Any]:
        return self._envelope([self._choice(text or None, None, stream=True, thinking=thinking)], stream=True)

    def calls(self, calls: Sequence[ToolCall], first: int) -> dict[str, Any]:
        return self._envelope([self._choice(None, None, stream=True, calls=tool_calls(calls, first, stream=True))],
                              stream=True)

    def last(self, done: Answered, notices: list[str]) -> dict[str, Any]:
        # llama-server puts `timings` in the final chunk; so the chunk with finish_reason carries it.
        return self._envelope([self._choice(None, finish_reason(done), stream=True)], stream=True) | {
            "timings": timings(done)} | _notices(notices)

    def usage(self, done: Answered) -> dict[str, Any]:
        # As OpenAI does with stream_options.include_usage: one more chunk, with no choices.
        return self._envelope([], stream=True) | {"usage": usage(done.stats), "timings": timings(done)}


async def _respond(request: Request, worker: Worker, work: Callable[[threading.Event], Iterator[ChatEvent]],
                   body: GenerationFields, shape: _Shape) -> Response:
    try:
        job = worker.submit(work)
    except Busy as busy:
        return error(503, f"the server is busy: {worker.max_waiting} requests are already waiting; retry later",
                     code="server_busy", headers={"Retry-After": str(busy.retry_after)})
    if not body.stream:
        try:
            outcome = await _unless_disconnected(request, _until_done(job.next, shape.prompt_field))
        finally:
            job.cancel.set()  # a no-op once it is done; at once if the client left
        if outcome is None:
            return Response(status_code=499)  # nobody is there to read it
        return outcome if isinstance(outcome, Response) else JSONResponse(shape.whole(*outcome))
    try:
        first = await _unless_disconnected(request, job.next())
    except BaseException:
        job.cancel.set()
        raise
    if first is None or first is END or isinstance(first, Failed):
        job.cancel.set()
        return Response(status_code=499) if first is None else _failure(first, shape.prompt_field)
    # From here the response owns the job: whatever ends it (the end, a disconnect, a failed send)
    # cancels the generation, which is a no-op once it is done.
    return _CancellingStream(_events(job.next, first, shape, body.include_usage), job.cancel)


async def _until_done(next_item: Callable[[], Awaitable[Any]],
                      prompt_field: str) -> tuple[Answered, list[str]] | Response:
    """The answer's Done and what the service said about it (its Notices), or the failure's response."""
    notices: list[str] = []
    while True:
        item = await next_item()
        if isinstance(item, Notice):
            notices.append(item.text)
        if isinstance(item, Done):
            return _stopping() if item.reason == "cancelled" else (item, notices)
        if item is END or isinstance(item, Failed):
            return _failure(item, prompt_field)


async def _events(next_item: Callable[[], Awaitable[Any]], first: Any, shape: _Shape,
                  include_usage: bool) -> AsyncIterator[str]:
    if (opening := shape.opening()) is not None:
        yield _sse(opening)
    sent, called = 0, 0  # characters of the answer sent so far, and calls
    notices: list[str] = []  # what the service said about the answer: sent in the last chunk
    item = first
    while item is not END:
        if isinstance(item, Failed):
            yield _sse(json.loads(_failure(item, shape.prompt_field).body))
            return
        if isinstance(item, Notice):
            notices.append(item.text)
        if isinstance(item, Step) and (item.text or item.thinking):
            sent += len(item.text)
            yield _sse(shape.chunk(item.text, item.thinking if shape.chat else ""))
        if isinstance(item, Step) and item.calls:
            yield _sse(shape.calls(item.calls, called))
            called += len(item.calls)
        elif isinstance(item, Done):
            if item.reason == "cancelled":  # not by this client, who is still here: by the server stopping
                yield _sse(json.loads(_stopping().body))
                return
            if rest := item.text[sent:]:  # text held back near a stop string, released at the end
                yield _sse(shape.chunk(rest))
            if late := item.calls[called:]:  # a call finished only as the answer ended
                yield _sse(shape.calls(late, called))
            yield _sse(shape.last(item, notices))
            if include_usage:
                yield _sse(shape.usage(item))
            yield "data: [DONE]\n\n"
            return
        item = await next_item()


def _notices(notices: list[str]) -> dict[str, Any]:
    """Not OpenAI's: what the service said about the answer (malformed tool-call text kept as content, old turns
    left out to fit the context), one line each; absent when it said nothing."""
    return {"notices": notices} if notices else {}


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class _CancellingStream(StreamingResponse):
    def __init__(self, content: AsyncIterator[str], cancel: threading.Event) -> None:
        super().__init__(content, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._cancel = cancel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cancel.set()


async def _unless_disconnected(request: Request, awaitable: Awaitable[Any]) -> Any:
    """The awaitable's result, or None as soon as the client disconnects."""
    task = asyncio.ensure_future(awaitable)
    left = asyncio.ensure_future(_disconnect(request))
    try:
        await asyncio.wait((task, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()  # a response that streams listens for the disconnect itself
    if not task.done():
        task.cancel()
        return None
    return task.result()


async def _disconnect(request: Request) -> None:
    # The body has been read, so the next message the server hands us is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _stopping() -> JSONResponse:
    return error(503, "the server is stopping; retry when it is back", code="server_stopping")


def _failure(item: Any, prompt_field: str) -> JSONResponse:
    if item is END:  # the worker stopped before this job ran: the server is shutting down
        return _stopping()
    e = item.error
    if isinstance(e, ContextFull):
        return error(400, str(e), param=prompt_field, code="context_length_exceeded")
    if isinstance(e, SpecchatError):
        return error(400, str(e))
    log.error("generation failed", exc_info=e)
    return error(500, f"internal error: {type(e).__name__}: {e}")


class _DeclaredSizeLimit:
    """A body whose Content-Length is over the limit gets a 413 in OpenAI's shape before it is read
    (Starlette's limit answers that case in plain text; a body sent in chunks reaches our handler)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            length = dict(scope["headers"]).get(b"content-length", b"")
            if length.isdigit() and int(length) > MAX_BODY:
                await _too_large()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _too_large() -> JSONResponse:
    return error(413, f"the body is larger than {MAX_BODY // 2**20} MiB", code="request_too_large")


def _bearer(api_key: str) -> Callable[[Request], None]:
    expected = f"Bearer {api_key}".encode()

    def check(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, expected):
            raise StarletteHTTPException(401, "a valid API key is needed: send the header `Authorization: Bearer KEY`")

    return check


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0]
        # Drop "body" and the union members pydantic names in a location ("str", "list[TextPart]").
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and p not in _TYPE_TAGS and "[" not in str(p)]
        if first.get("type") == "json_invalid":
            return error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
        if not loc and isinstance(first.get("input"), (bytes, str)):
            return error(400, "the body must be a JSON object, sent with `Content-Type: application/json`")
        where = ".".join(loc)
        return error(400, f"{where or 'body'}: {first['msg']}", param=where or None, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
        message = {404: f"no route {request.method} {request.url.path}; the API is under /v1",
                   413: f"the body is larger than {MAX_BODY // 2**20} MiB"}.get(exc.status_code, str(exc.detail))
        return error(exc.status_code, message, code=code.get(exc.status_code), headers=exc.headers)

    @app.exception_handler(SpecchatError)
    async def bad_value(request: Request, exc: SpecchatError) -> JSONResponse:
        return error(400, str(exc))

    @app.exception_handler(Exception)
    async def internal(request: Request, exc: Exception) -> JSONResponse:
        log.error("request failed", exc_info=exc)
        return error(500, f"internal error: {type(exc).__name__}")
