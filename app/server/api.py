"""The wire format: OpenAI's request fields as pydantic models, OpenAI-style error bodies, the
`usage` and llama-server `timings` objects computed from the engine's Stats, and tool calls as OpenAI
writes them.

Models are strict (a string is not a number, 1 is not true) and ignore fields they do not know, as
OpenAI's clients send many optional ones.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Sequence

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic_core import PydanticCustomError

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Stats
from specchat.decoding.guessers import GUESSERS
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.service.events import Answered

MAX_STOPS = 16  # OpenAI allows 4; llama-server any number. Each is searched for at every step.
FINISH_REASONS = {"eog": "stop", "stop": "stop", "max_tokens": "length", "context_full": "length", "cancelled": "stop",
                  "tool_calls": "tool_calls"}

Probability = Annotated[float, Field(allow_inf_nan=False)]
StopString = Annotated[str, StringConstraints(min_length=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    include_usage: bool = False


class GenerationFields(_Strict):
    """What /v1/chat/completions and /v1/completions share."""

    model: str | None = None  # one model is served; any name is accepted, as llama-server does
    temperature: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)] = 1.0  # OpenAI's default
    top_p: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    min_p: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)] = 0.0
    max_tokens: Annotated[int, Field(ge=1)] | None = None  # None: until the context is full
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOPS)] | None = None
    seed: Annotated[int, Field(ge=-1, lt=2**64)] | None = None  # -1: a random seed, as in llama.cpp
    n: Literal[1] = 1  # batch 1: one answer per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Not OpenAI's: which guesser proposes tokens, and how many it may propose at most.
    guesser: Literal[tuple(GUESSERS)] = "auto"  # type: ignore[valid-type]
    draft_length: Annotated[int, Field(ge=0)] | None = None

    def generation_config(self, n_ctx: int) -> GenerationConfig:
        seed = None if self.seed in (None, -1) else self.seed
        sampling = SamplingConfig(self.temperature, self.top_k, self.top_p, self.min_p, seed)
        limit = self.max_completion_tokens or self.max_tokens or n_ctx  # the context ends it first
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerationConfig(sampling, min(limit, n_ctx), self.draft_length, stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _json_text(text: str) -> str:
    try:
        json.loads(text)
    except ValueError:
        raise PydanticCustomError("json", "the arguments must be JSON text, as the answer's tool_calls gave them") \
            from None
    return text


def _utf8(text: str) -> str:
    # JSON can carry a lone surrogate ("\ud800"), which no tokenizer can encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return text


class TextPart(_Strict):
    type: Literal["text"]
    text: str

    _check = field_validator("text")(_utf8)


class CalledFunction(_Strict):
    name: Annotated[str, StringConstraints(min_length=1)]
    # JSON text, as OpenAI sends it (llama-server also takes the object itself).
    arguments: str | dict[str, Any]

    _check = field_validator("arguments")(lambda v: _json_text(v) if isinstance(v, str) else v)

    def text(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments, ensure_ascii=False)


class CallIn(_Strict):
    """One call an earlier answer made, as a client sends it back."""

    id: Annotated[str, StringConstraints(min_length=1)]
    type: Literal["function"]
    function: CalledFunction


class ChatMessage(_Strict):
    # developer: OpenAI's newer name for system; tool: a call's result
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None
    # An earlier answer's thinking, as llama-server and the DeepSeek API take it back: the template
    # decides whether it goes into the prompt.
    reasoning_content: str | None = None
    tool_calls: list[CallIn] | None = None  # an earlier answer's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    _check = field_validator("content")(lambda v: _utf8(v) if isinstance(v, str) else v)
    _check_reasoning = field_validator("reasoning_content")(lambda v: _utf8(v) if isinstance(v, str) else v)

    @model_validator(mode="after")
    def _fits_role(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise PydanticCustomError("tool_calls", "only an assistant message makes tool calls; give tool_calls on "
                                      "the assistant's message")
        if self.role == "tool" and not self.tool_call_id:
            raise PydanticCustomError("tool_call_id", "a tool message needs tool_call_id, the id of the call it "
                                      "answers")
        if self.tool_call_id is not None and self.role != "tool":
            raise PydanticCustomError("tool_call_id", "only a tool message answers a call; tool_call_id goes on "
                                      "role \"tool\"")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise PydanticCustomError("content", "content is missing: every message needs it but an assistant's "
                                      "that makes tool calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionSchema(_Strict):
    name: Annotated[str, StringConstraints(min_length=1)]
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionSchema

    def schema(self) -> dict[str, Any]:
        """As the template is given it: what OpenAI's tools carry, less what was left out."""
        return {"type": "function", "function": self.function.model_dump(exclude_none=True)}


class NamedFunction(_Strict):
    name: Annotated[str, StringConstraints(min_length=1)]


class NamedChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(GenerationFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # Extra variables for the chat template, as llama-server and vLLM take them ({"enable_thinking": false}),
    # and OpenAI's reasoning effort, which gpt-oss's template reads.
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    # OpenAI's function tools: given to the template, and the answer's calls read back out of its text.
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None  # false: an answer's first call only

    def template_variables(self) -> dict[str, Any]:
        effort = {"reasoning_effort": self.reasoning_effort} if self.reasoning_effort else {}
        return {**(self.chat_template_kwargs or {}), **effort}

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [t.schema() for t in self.tools or ()]

    def choice(self) -> str | dict[str, Any] | None:
        c = self.tool_choice
        return c.model_dump() if isinstance(c, NamedChoice) else c

    def conversation(self) -> list[Message]:
        """The messages as the template is given them. A tool message must answer a call an earlier answer
        made (a one-line SpecchatError names the one that does not)."""
        out, called = [], set[str]()
        for n, m in enumerate(self.messages):
            calls = tuple(ToolCall(c.function.name, c.function.text(), c.id) for c in m.tool_calls or ())
            called.update(c.id for c in calls)
            if m.role == "tool" and m.tool_call_id not in called:
                raise SpecchatError(f"messages[{n}] answers the call {m.tool_call_id!r}, which no earlier assistant "
                                    "message made: give the id from that message's tool_calls")
            out.append(Message("system" if m.role == "developer" else m.role, m.text(), m.reasoning_content or "",
                               calls, m.tool_call_id or ""))
        return out


class CompletionRequest(GenerationFields):
    # Text, or token ids; a list of one text too (clients wrap it), but batch 1: never several.
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]

    _check = field_validator("prompt")(lambda v: _utf8(v) if isinstance(v, str) else v)

    def prompt_value(self) -> str | list[int]:
        p = self.prompt
        return p[0] if isinstance(p, list) and isinstance(p[0], str) else p  # type: ignore[return-value]


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def usage(stats: Stats) -> dict[str, Any]:
    return {"prompt_tokens": stats.n_prompt, "completion_tokens": stats.n_tokens,
            "total_tokens": stats.n_prompt + stats.n_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.cached}}


def timings(done: Answered) -> dict[str, Any]:
    """llama-server's `timings` object. prompt_n counts the prompt tokens evaluated now, cache_n those
    reused from the KV cache; predicted_ms is the engine's decode time (draft plus verify). specchat
    adds the speedup against plain decoding under the same conditions (capped at the tokens per step;
    null when not known) and whether the machine was busy meanwhile (the speedup is then uncertain)."""
    stats = done.stats
    prompt_n = stats.n_prompt - stats.cached
    prompt_ms, predicted_ms = stats.prefill_s * 1000, stats.decode_s * 1000
    return {"cache_n": stats.cached,
            "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n / stats.prefill_s if stats.prefill_s > 0 else 0.0,
            "predicted_n": stats.n_tokens, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / stats.n_tokens if stats.n_tokens else 0.0,
            "predicted_per_second": stats.tokens_per_s,
            "draft_n": stats.drafted, "draft_n_accepted": stats.accepted,
            "speedup": done.speedup, "machine_busy": done.busy}


def finish_reason(done: Done) -> str:
    return FINISH_REASONS[done.reason]


def tool_calls(calls: Sequence[ToolCall], first: int = 0, stream: bool = False) -> list[dict[str, Any]]:
    """Calls as OpenAI writes them: arguments as JSON text; in a stream each has its index among the answer's
    calls (`first`: the index of the first of these), and comes whole in one delta."""
    return [({"index": first + n} if stream else {}) | {"id": c.id, "type": "function",
                                                        "function": {"name": c.name, "arguments": c.arguments}}
            for n, c in enumerate(calls)]
