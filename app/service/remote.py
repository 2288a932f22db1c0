"""The app on another machine: a Backend over any OpenAI-compatible server (specchat serve,
llama-server, vLLM), through the official `openai` client.

The server's stream becomes the backend protocol's events (a Prefill, a Chunk of text per streamed
chunk, a Done), so the UI, the stats panel and the store treat a remote answer like a local one. Tools
offered to the model go to the server as OpenAI's `tools` and `tool_choice`; the calls it streams back
(`delta.tool_calls`, in pieces) end the answer as the local service's do: on the Done's `calls`, its reason
"tool_calls", so that the agent loop runs them the same way. Done's Stats carry the best figures the server
reports, and the Answered's `figures` says which they are:

- llama-server and `specchat serve` put a `timings` object on the last chunk: drafted, accepted,
  and the server's own decode time, for this answer alone;
- vLLM has only server-wide Prometheus counters (`/metrics`), read before and after the answer;
- anything else: tokens per second as the stream delivered them.

`openai` and `prometheus_client` are an optional extra (`pip install 'specchat[remote]'`): they are
imported only when a remote backend is used.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Prefill, Stats
from specchat.decoding.guessers import GUESSERS
from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.llama.toolcalls import new_id
from specchat.models.fetch import Progress
from specchat.service.backend import Baseline
from specchat.service.choices import RemoteChoice
from specchat.service.events import Answered, BackendEvent, Chunk
from specchat.service.settings import API_KEY_ENV
from specchat.service.toolsplit import reason_with

if TYPE_CHECKING:  # the client is an optional extra
    import openai

INSTALL = "pip install 'specchat[remote]'"
TIMINGS, METRICS, STREAM = "server timings", "vLLM metrics (server-wide)", "stream only"
# vLLM's speculative-decoding counters (Prometheus sample names; the family drops the _total).
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
DEFAULT_CONTEXT = 4096  # when the server does not say how long its context is
CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 600.0  # between two chunks: a big model's prefill on a slow machine can be long
CANCEL_POLL_S = 0.05


def base_urls(url: str) -> tuple[str, str]:
    """The server's root (where /metrics is) and its API base (root + /v1), from what the user gave."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpecchatError(f"--server needs an http:// or https:// URL such as http://HOST:8080, got {url!r}")
    try:
        parts.port  # noqa: B018 (parsing it is the check)
    except ValueError:
        raise SpecchatError(f"the port in {url!r} is not a number") from None
    path = parts.path.rstrip("/").removesuffix("/v1")
    root = f"{parts.scheme}://{parts.netloc}{path}"
    return root, root + "/v1"


def require_client() -> Any:
    """The openai module, or a one-line error saying how to install it."""
    try:
        import openai
        import prometheus_client  # noqa: F401 (read vLLM's metrics)
    except ImportError as e:
        raise SpecchatError(f"--server needs the {e.name or 'openai'} package: {INSTALL}") from None
    return openai


def spec_counters(text: str) -> dict[str, float]:
    """vLLM's speculative-decoding counters from a Prometheus text page, summed over their labels
    (one series per model and engine)."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in (DRAFT_TOKENS, ACCEPTED_TOKENS):
                    counts[sample.name] = counts.get(sample.name, 0.0) + sample.value
    except ValueError:  # not a Prometheus page (some other server's /metrics)
        return {}
    return counts


def stats_from_timings(timings: Mapping[str, Any], stream_s: float) -> Stats:
    """llama-server's (and specchat serve's) figures for one answer. Every target step yields one
    token of its own plus the drafts it accepted, so steps = predicted_n - draft_n_accepted."""
    n = int(timings.get("predicted_n") or 0)
    drafted, accepted = int(timings.get("draft_n") or 0), int(timings.get("draft_n_accepted") or 0)
    cached = int(timings.get("cache_n") or 0)
    return Stats(n_prompt=int(timings.get("prompt_n") or 0) + cached, cached=cached,
                 prefill_s=float(timings.get("prompt_ms") or 0) / 1000, n_tokens=n, steps=max(0, n - accepted),
                 drafted=drafted, accepted=accepted, verify_s=float(timings.get("predicted_ms") or 0) / 1000,
                 wall_s=stream_s)


def stats_from_counters(before: Mapping[str, float], after: Mapping[str, float], n_prompt: int, n_tokens: int,
                        prefill_s: float, stream_s: float) -> Stats:
    """vLLM's counters' growth over this answer (server-wide: other clients' answers count too)."""
    drafted = int(after.get(DRAFT_TOKENS, 0) - before.get(DRAFT_TOKENS, 0))
    accepted = int(after.get(ACCEPTED_TOKENS, 0) - before.get(ACCEPTED_TOKENS, 0))
    return Stats(n_prompt=n_prompt, prefill_s=prefill_s, n_tokens=n_tokens,
                 steps=max(0, n_tokens - accepted) if drafted else 0, drafted=max(0, drafted),
                 accepted=max(0, accepted), verify_s=stream_s, wall_s=stream_s)


def stats_from_stream(n_prompt: int, n_tokens: int, prefill_s: float, stream_s: float) -> Stats:
    """Nothing but the stream: tokens, and the time from the first chunk to the last."""
    return Stats(n_prompt=n_prompt, prefill_s=prefill_s, n_tokens=n_tokens, verify_s=stream_s, wall_s=stream_s)


class RemoteBackend:
    """A model on an OpenAI-compatible server. One generation at a time, as the engine runs."""

    pair = draft = None  # the server's models are its own, and it does not say which draft it runs
    guesser_asked = True
    thinking_switch = "enable_thinking"  # asked of the server's template, which may not read it

    def __init__(self, choice: RemoteChoice) -> None:
        self.choice = choice
        self.root, self.base = base_urls(choice.url)
        self.server = self.root  # what conversations are marked with
        self.name = f"… @ {self.host}"
        self.model = choice.model
        self.n_ctx = DEFAULT_CONTEXT
        self.has_metrics = False
        self.warnings: list[str] = []
        # The server drafts by its own configuration. specchat serve also takes the guesser and draft length
        # a request names (others ignore the fields), so every guesser is offered, the draft one included.
        self.guessers = list(GUESSERS)
        self._client: openai.OpenAI | None = None
        self._busy = threading.Lock()

    @property
    def host(self) -> str:
        return urlsplit(self.root).netloc

    # --- the Backend protocol ------------------------------------------------------------------

    def load(self, progress: Progress) -> None:
        openai = require_client()
        progress(f"connecting to {self.host}", 0, 1)
        self._client = openai.OpenAI(base_url=self.base, api_key=self.choice.api_key or "none", max_retries=0,
                                     timeout=openai.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S))
        try:
            models = list(self._client.models.list())
        except openai.APIError as e:
            raise SpecchatError(self._explain(e)) from None
        names = [m.id for m in models]
        if not names:
            raise SpecchatError(f"the server at {self.root} lists no models (GET /v1/models is empty)")
        self.model = self.choice.model or names[0]
        if self.model not in names:
            raise SpecchatError(f"the server at {self.root} has no model {self.model!r}; it has {', '.join(names)} "
                                "(choose one with --model)")
        info = (models[names.index(self.model)].model_extra or {})
        meta = info.get("meta") or {}
        self.n_ctx = int(info.get("max_model_len") or meta.get("n_ctx") or meta.get("n_ctx_train") or DEFAULT_CONTEXT)
        # specchat serve lists the guessers its pair can run; other servers take none of ours by name.
        self.guessers = [g for g in meta.get("guessers", GUESSERS) if g in GUESSERS] or list(GUESSERS)
        self.has_metrics = bool(self._counters())
        self.name = f"{self.model} @ {self.host}"
        progress("ready", 1, 1)

    def baseline(self) -> Baseline:
        return Baseline(None, "none (the server's plain speed is not known here)")

    def count_tokens(self, text: str) -> int:
        # No tokenizer here: about four characters a token. After each answer the meter shows the
        # server's own count (usage / timings).
        return len(text) // 4 + 1

    def close(self) -> None:
        with self._busy:
            if self._client is not None:
                self._client.close()
                self._client = None

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event, think: bool | None = None,
             tools: Sequence[dict[str, Any]] | None = None, tool_choice: str = "auto") -> Iterator[BackendEvent]:
        with self._busy:
            if self._client is None:
                raise SpecchatError(f"not connected to {self.root}")
            yield from self._generate(self._client, messages, config, guesser, cancel, think,
                                      _tool_fields(tools, tool_choice))

    # --- one answer -----------------------------------------------------------------------------

    def _generate(self, client: openai.OpenAI, messages: Sequence[Message], config: GenerationConfig, guesser: str,
                  cancel: threading.Event, think: bool | None, tool_fields: Mapping[str, Any]) -> Iterator[BackendEvent]:
        import openai

        before = self._counters() if self.has_metrics else {}
        s = config.sampling
        got = _Received(time.perf_counter())
        try:
            stream = client.chat.completions.create(
                model=self.model or "", messages=[_wire(m) for m in messages],
                stream=True, stream_options={"include_usage": True}, temperature=s.temperature, top_p=s.top_p,
                max_tokens=config.max_tokens, seed=s.seed, stop=list(config.stop) or None,
                extra_body=_extra_body(config, guesser, think) or None, **tool_fields)
        except openai.APIError as e:
            refused = tool_fields and _refuses_tools(e)
            raise SpecchatError(self._tools_refused(e) if refused else self._explain(e)) from None
        yield from self._relay(stream, cancel, got)
        yield self._done(got, before, cancel.is_set())

    def _relay(self, stream: Any, cancel: threading.Event, got: _Received) -> Iterator[BackendEvent]:
        """The server's stream as a Prefill at its first text and a Chunk for each piece of text after it, until
        it ends or `cancel` is set; what it says of the answer kept in `got`."""
        import openai

        ended = threading.Event()
        # Esc closes the HTTP stream at once, even while the server is silent (a long prefill): the
        # server sees the connection go and stops generating.
        watcher = threading.Thread(target=_close_on_cancel, args=(stream, cancel, ended), daemon=True)
        watcher.start()
        try:
            for chunk in stream:
                if cancel.is_set():
                    break
                taken = got.take(chunk)
                if taken is None:
                    continue
                piece, thought = taken
                now = time.perf_counter()
                if got.first is None:  # the answer's first text, thinking or call: the prompt is in
                    got.first = now
                    yield Prefill(0, 0, now - got.t0)
                got.chunks += 1
                if piece or thought:  # a call's piece shows on the Done, with the whole call
                    got.text.append(piece)
                    got.thinking.append(thought)
                    yield Chunk(piece, now - (got.last or now), thought)
                got.last = now
        except (openai.APIError, OSError, RuntimeError) as e:
            # A stream closed by the watcher fails in whatever way the transport fails.
            if cancel.is_set():
                return
            if got.chunks or not isinstance(e, openai.APIError):  # reached, then lost: not a server never there
                raise SpecchatError(f"the connection to the server at {self.root} dropped in the middle of the answer "
                                    f"({_root_cause(e)}); is it still running?") from None
            raise SpecchatError(self._explain(e)) from None
        finally:
            ended.set()
            stream.close()

    def _done(self, got: _Received, before: Mapping[str, float], cancelled: bool) -> Answered:
        """The answer's end, with its calls, and the best figures the server gave for it and which they are."""
        # A stopped answer's last call may have only part of its arguments: none is kept, as none will run.
        calls = () if cancelled else got.tool_calls()
        reason = "cancelled" if cancelled else reason_with(calls, {"length": "max_tokens"}.get(got.finish or "", "eog"))
        usage = got.usage
        n_prompt = usage.prompt_tokens if usage is not None else 0
        n_tokens = usage.completion_tokens if usage is not None and reason != "cancelled" else got.chunks
        prefill_s = (got.first or time.perf_counter()) - got.t0
        stream_s = (got.last or 0.0) - (got.first or 0.0)
        if got.timings and got.timings.get("predicted_n") is not None:
            figures, stats = TIMINGS, stats_from_timings(got.timings, stream_s)
        elif self.has_metrics:
            figures = METRICS
            stats = stats_from_counters(before, self._counters(), n_prompt, n_tokens, prefill_s, stream_s)
        else:
            figures, stats = STREAM, stats_from_stream(n_prompt, n_tokens, prefill_s, stream_s)
        return Answered(reason, "".join(got.text), (), stats, figures=figures, thinking="".join(got.thinking).strip(),
                        calls=calls)

    def _counters(self) -> dict[str, float]:
        """vLLM's speculative-decoding counters now, or {} where the server has none."""
        request = urllib.request.Request(self.root + "/metrics")
        if self.choice.api_key:
            request.add_header("Authorization", f"Bearer {self.choice.api_key}")
        try:
            with urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S) as reply:  # noqa: S310 (the user's URL)
                return spec_counters(reply.read(4 << 20).decode("utf-8", "replace"))
        except (OSError, urllib.error.URLError, ValueError):
            return {}

    def _tools_refused(self, e: Exception) -> str:
        """One line for a server that will not take the tools offered, and what to do about it."""
        return (f"the server at {self.root} does not take tools ({_message(e)}): start llama-server with --jinja, or "
                "vLLM with --enable-auto-tool-choice and --tool-call-parser, or use a model whose template takes "
                "tools; or turn this conversation's tools off")

    def _explain(self, e: Exception) -> str:
        """One line for what went wrong talking to the server, and what to do about it."""
        import openai

        if isinstance(e, openai.APITimeoutError):
            return f"the server at {self.root} did not answer in time; is it overloaded or behind a firewall?"
        if isinstance(e, openai.APIConnectionError):
            cause = e.__cause__ or e.__context__
            why = f" ({_root_cause(cause)})" if cause is not None else ""
            return f"cannot reach a server at {self.root}{why}; is it running, and is the URL right?"
        if isinstance(e, openai.AuthenticationError | openai.PermissionDeniedError):
            return (f"the server at {self.root} refused the API key ({e.status_code}); "
                    f"pass --api-key KEY or set {API_KEY_ENV}")
        if isinstance(e, openai.NotFoundError):
            return (f"{self.root} answered 404 ({_message(e)}): no OpenAI-compatible server at that URL"
                    + (f", or no model {self.model!r} there" if self.model else "")
                    + "; give the server's base URL, e.g. http://HOST:8080")
        if isinstance(e, openai.APIStatusError):
            return f"the server at {self.root} answered {e.status_code}: {_message(e)}"
        return f"the server at {self.root} sent something unexpected: {e}"


@dataclass
class _StreamedCall:
    """One call as a server streams it: its id and name in its first piece, its arguments in fragments after."""

    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def add(self, piece: Any) -> None:
        # The first id and name are kept: a server that repeats them with each fragment does not double them.
        self.id = self.id or piece.id or ""
        if piece.function is not None:
            self.name = self.name or piece.function.name or ""
            self.arguments.append(piece.function.arguments or "")

    def call(self) -> ToolCall:
        # A server that gives no id gets one made here: the call's `tool` message must answer to one.
        return ToolCall(self.name, "".join(self.arguments), self.id or new_id())


@dataclass
class _Received:
    """What the server has sent of one answer so far."""

    t0: float  # when the request went out
    text: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    timings: Mapping[str, Any] | None = None  # llama-server's and specchat serve's, on the last chunk
    usage: Any = None  # the token counts, where the server sends them
    finish: str | None = None
    first: float | None = None  # when the first of the answer came (text, thinking or a call's piece)
    last: float | None = None  # when the latest came
    chunks: int = 0  # chunks with text or a call's piece: the token count of a server that gives none
    calls: dict[int, _StreamedCall] = field(default_factory=dict)  # by their index among the answer's calls

    def take(self, chunk: Any) -> tuple[str, str] | None:
        """One streamed chunk's figures and call pieces kept; its text and thinking ("" where it has none), or None
        where it carried nothing of the answer."""
        self.timings = (chunk.model_extra or {}).get("timings") or self.timings
        self.usage = chunk.usage or self.usage
        piece = thought = ""
        called = False
        for choice in chunk.choices[:1]:
            self.finish = choice.finish_reason or self.finish
            delta = choice.delta
            if delta is None:
                continue
            piece = delta.content or ""
            # llama-server's and vLLM's field for a reasoning model's thinking (the openai client keeps
            # fields it does not know in model_extra).
            thought = (delta.model_extra or {}).get("reasoning_content") or ""
            for part in delta.tool_calls or ():
                self.calls.setdefault(part.index, _StreamedCall()).add(part)
                called = True
        return (piece, thought) if piece or thought or called else None

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The calls streamed, in the order of their index."""
        return tuple(self.calls[n].call() for n in sorted(self.calls))


def _extra_body(config: GenerationConfig, guesser: str, think: bool | None) -> dict[str, Any]:
    """The request's fields beyond OpenAI's: llama-server and vLLM take top_k and min_p; specchat serve also a
    guesser and a draft length."""
    s = config.sampling
    extra: dict[str, Any] = {k: v for k, v in (("top_k", s.top_k), ("min_p", s.min_p),
                                               ("draft_length", config.draft_length)) if v is not None and v != 0}
    if guesser != "auto":
        extra["guesser"] = guesser
    if think is not None:  # llama-server, vLLM and specchat serve hand these to the chat template
        extra["chat_template_kwargs"] = {"enable_thinking": think}
    return extra


def _tool_fields(tools: Sequence[dict[str, Any]] | None, choice: str) -> dict[str, Any]:
    """OpenAI's tools and tool_choice, where tools are offered ({}: a request without tools is the one it always
    was). parallel_tool_calls is left to the server: specchat serve then makes a required call one call and keeps
    every call it reads otherwise, as this machine's service does."""
    return {"tools": list(tools), "tool_choice": choice} if tools else {}


def _refuses_tools(e: Exception) -> bool:
    """The server's error says it does not take tools: llama-server without --jinja ("tools param requires --jinja
    flag", a 500), vLLM without a tool parser, Ollama's and specchat serve's models whose template has no tools.
    Read from the text, as servers give it under 400 and 500 alike."""
    text = _message(e).lower()
    return "tool" in text and any(word in text for word in ("support", "require", "jinja", "enable"))


def _wire(m: Message) -> dict[str, Any]:
    """A message as OpenAI-compatible servers take it: an answer's thinking as reasoning_content, which
    llama-server hands to the template (that leaves it out of the prompt or keeps it, as it wants); the calls an
    answer made here, and their results, as OpenAI writes them (a `tool` message without its call is refused)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.thinking:
        out["reasoning_content"] = m.thinking
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def _close_on_cancel(stream: Any, cancel: threading.Event, ended: threading.Event) -> None:
    while not ended.is_set():
        if cancel.wait(CANCEL_POLL_S):
            # Closing the response alone does not wake a read blocked in another thread; shutting
            # the socket down does (the read then fails, and the generator ends as cancelled).
            try:
                stream.response.extensions["network_stream"].get_extra_info("socket").shutdown(socket.SHUT_RDWR)
            except (AttributeError, KeyError, OSError):
                pass
            stream.close()
            return


def _root_cause(e: BaseException) -> str:
    while (e.__cause__ or e.__context__) is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    text = str(e).strip() or type(e).__name__
    return text.split("] ")[-1] if text.startswith("[Errno") else text


def _message(e: Any) -> str:
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body.get("detail", body))
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return str(getattr(e, "message", e)).splitlines()[0]
