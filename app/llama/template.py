"""Chat prompts from the GGUF's own template, with token-exact reuse of the previous turn.

The template itself is untrusted code: it renders in the sandboxed process of `renderer`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from specchat.errors import SpecchatError
from specchat.llama.renderer import TIME_LIMIT_S, render

if TYPE_CHECKING:  # importing this module must not load llama.cpp (the settings and the UI import Message)
    from specchat.llama.model import Model


@dataclass(frozen=True)
class ToolCall:
    """One call an answer makes: the function's name, its arguments as JSON text (as OpenAI's API carries
    them), and the id its result's `tool` message answers to."""

    name: str
    arguments: str
    id: str


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant" or "tool"
    content: str
    thinking: str = ""  # an assistant's reasoning, kept apart from its answer
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls, after its content
    tool_call_id: str = ""  # a tool message: the call it answers


# The variables templates read to turn thinking on or off: Qwen3, DeepSeek, GLM and most others read
# enable_thinking; Granite 3.3 reads thinking. gpt-oss reads reasoning_effort, which has no "off".
SWITCHES = ("enable_thinking", "thinking")


class ChatTemplate:
    """One GGUF's chat template, checked for syntax on construction; `name` is the model file's."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = "",
                 limit_s: float = TIME_LIMIT_S) -> None:
        self.source, self.name, self.limit_s = source, name, limit_s
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}
        self.reads = frozenset(self._run(None).get("reads", ()))

    @property
    def switch(self) -> str | None:
        """The variable that turns this template's thinking on or off; None: it has none."""
        return next((s for s in SWITCHES if s in self.reads), None)

    def variables(self, think: bool | None) -> dict[str, Any]:
        """The template variables for thinking on (True), off (False) or the model's default (None). As in
        llama.cpp, enable_thinking's default is on: llama.cpp's copy of DeepSeek R1's template, for one, would
        read it unset as off, while llama-server always passes it. Asked of a template with no switch, it
        refuses in one line."""
        if think is not None and self.switch is None:
            raise SpecchatError(f"the chat template of {self.name} has no switch for thinking: the model thinks "
                                "as it was trained to; leave thinking at the model's default")
        if think is None:
            think = True if self.switch == "enable_thinking" else None
        return {} if think is None or self.switch is None else {self.switch: think}

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True,
               variables: dict[str, Any] | None = None, tools: Sequence[dict[str, Any]] = ()) -> str:
        """The prompt text. `tools` are OpenAI function schemas ({"type": "function", "function": {...}}), passed
        as HF and llama.cpp pass them (`tools`, None when there are none, which templates test for)."""
        # The variables llama-cpp-python's Jinja2ChatFormatter passes, so templates render as they did, and
        # an answer's thinking under both names templates read it by (Qwen's and gpt-oss's).
        return self._run({**(variables or {}), "messages": [_message(m) for m in messages],
                          "add_generation_prompt": add_generation_prompt, **self._tokens,
                          "functions": None, "function_call": None, "tools": list(tools) or None,
                          "tool_choice": None})["text"]

    def _run(self, variables: dict[str, Any] | None) -> dict[str, Any]:
        reply = render({"template": self.source, "variables": variables, "limit_s": self.limit_s},
                              self.limit_s)
        if "error" in reply:
            raise SpecchatError(f"the chat template of {self.name} {reply['error']}")
        return reply


def held_back(text: str, markers: Sequence[str]) -> int:
    """How much of text's end to hold back while streaming: the longest suffix that is a proper prefix of a
    marker (a stop string, a tool call's or a thinking's opening), which the next piece of text may complete."""
    best = 0
    for marker in markers:
        for n in range(min(len(text), len(marker) - 1), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def _message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.thinking:
        out.update(reasoning_content=m.thinking, thinking=m.thinking)
    if m.tool_calls:  # only then: templates test `"tool_calls" in message`
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name,
                              "arguments": _arguments(c.arguments)}} for c in m.tool_calls]
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def _arguments(text: str) -> Any:
    """A call's arguments as templates read them: an object (they write `arguments | tojson`, as HF's
    convention and llama.cpp's func_args_not_string have it); text that is no JSON stays text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


class ChatPrompter:
    """Renders a conversation to prompt tokens.

    Re-tokenizing a whole conversation can split an earlier answer differently from how it was
    generated, which would defeat KV-cache reuse and change what the model is given. So the prompter
    remembers the last few renderings whose tokens it knows (each prompt, and each prompt with its
    answer): a new rendering that extends one of them keeps its tokens and tokenizes only the new
    text. The next turn extends the last answer; a regenerated answer is the last prompt again; an
    edited message extends the turn before it.
    """

    KNOWN = 8  # renderings remembered

    def __init__(self, model: Model) -> None:
        self.model = model
        template = model.metadata.get("tokenizer.chat_template")
        if not template:
            raise SpecchatError(f"{model.path.name} has no chat template: it is a base model, which continues text "
                                "rather than answering; complete raw text with `specchat generate --raw`, or chat "
                                "with an instruct model")
        self.template = ChatTemplate(template, model.path.name, model.bos_text, model.eos_text)
        self._known: list[tuple[str, list[int]]] = []  # (text, its tokens), newest last
        self.continued = False

    def render(self, messages: Sequence[Message], variables: dict[str, Any] | None = None,
               tools: Sequence[dict[str, Any]] = ()) -> str:
        return self.template.render(messages, variables=variables, tools=tools)

    def tokens(self, messages: Sequence[Message], variables: dict[str, Any] | None = None,
               tools: Sequence[dict[str, Any]] = ()) -> list[int]:
        text = self.render(messages, variables, tools)
        self.continued = bool(self._known) and text.startswith(self._known[-1][0])  # the last turn goes on
        base = max((k for k in self._known if text.startswith(k[0])), key=lambda k: len(k[0]), default=None)
        if base is not None:
            rest = text[len(base[0]):]
            tokens = base[1] + (self.model.tokenize(rest, add_bos=False) if rest else [])
        else:
            tokens = self.model.tokenize(text, add_bos=self.model.add_bos and not text.startswith(self.model.bos_text))
        self._learn(text, tokens)
        return tokens

    def forget(self) -> None:
        """The cache was used for something else: the next conversation is tokenized afresh."""
        self._known, self.continued = [], False

    def remember(self, answer_ids: Sequence[int]) -> None:
        """After a generation: the last prompt went on with these tokens (EOG included)."""
        if not self._known:
            return
        text, tokens = self._known[-1]
        answer = b"".join(self.model.piece(t, special=True) for t in answer_ids).decode("utf-8", "replace")
        self._learn(text + answer, tokens + list(answer_ids))

    def _learn(self, text: str, tokens: list[int]) -> None:
        self._known = [k for k in self._known if k[0] != text][-(self.KNOWN - 1):] + [(text, tokens)]
