"""Chat prompts from the GGUF's own template, with token-exact reuse of the previous turn.

The template itself is untrusted code: it renders in the sandboxed process of `renderer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from specchat.errors import SpecchatError
from specchat.llama.renderer import TIME_LIMIT_S, render

if TYPE_CHECKING:  # importing this module must not load llama.cpp (the settings and the UI import Message)
    from specchat.llama.model import Model


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


class ChatTemplate:
    """One GGUF's chat template, checked for syntax on construction; `name` is the model file's."""

    def __init__(self, source: str, name: str, bos_token: str = "", eos_token: str = "",
                 limit_s: float = TIME_LIMIT_S) -> None:
        self.source, self.name, self.limit_s = source, name, limit_s
        self._tokens = {"bos_token": bos_token, "eos_token": eos_token}
        self._run(None)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        # The variables llama-cpp-python's Jinja2ChatFormatter passes, so templates render as they did.
        return self._run({"messages": [{"role": m.role, "content": m.content} for m in messages],
                          "add_generation_prompt": add_generation_prompt, **self._tokens,
                          "functions": None, "function_call": None, "tools": None, "tool_choice": None})

    def _run(self, variables: dict[str, Any] | None) -> str:
        reply = render({"template": self.source, "variables": variables, "limit_s": self.limit_s},
                              self.limit_s)
        if "error" in reply:
            raise SpecchatError(f"the chat template of {self.name} {reply['error']}")
        return reply["text"]


class ChatPrompter:
    """Renders a conversation to prompt tokens.

    Re-tokenizing a whole conversation can split the previous answer differently from how
    it was generated, which would defeat KV-cache reuse. So when the new rendering extends
    the text of the last prompt plus its answer, only the new text is tokenized and appended
    to the tokens the cache already holds.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        template = model.metadata.get("tokenizer.chat_template")
        if not template:
            raise SpecchatError(f"{model.path.name} has no chat template in its metadata; use an instruct model")
        self.template = ChatTemplate(template, model.path.name, model.bos_text, model.eos_text)
        self._text = ""
        self._tokens: list[int] = []
        self.continued = False

    def render(self, messages: Sequence[Message]) -> str:
        return self.template.render(messages)

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        text = self.render(messages)
        self.continued = bool(self._text) and text.startswith(self._text)  # the last turn goes on
        if self.continued:
            tokens = self._tokens + self.model.tokenize(text[len(self._text):], add_bos=False)
        else:
            tokens = self.model.tokenize(text, add_bos=self.model.add_bos and not text.startswith(self.model.bos_text))
        self._text, self._tokens = text, tokens
        return tokens

    def remember(self, answer_ids: Sequence[int]) -> None:
        """After a generation: the cache now holds the last prompt plus these tokens (EOG included)."""
        self._tokens = self._tokens + list(answer_ids)
        self._text += b"".join(self.model.piece(t, special=True) for t in answer_ids).decode("utf-8", "replace")
