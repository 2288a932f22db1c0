"""Chat prompts from the GGUF's own template, with token-exact reuse of the previous turn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from app.errors import SpecchatError
from app.llm import Model


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user" or "assistant"
    content: str


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
        # llama-cpp-python renders it in jinja2's sandbox: the template is untrusted input.
        self._formatter = Jinja2ChatFormatter(template=template, eos_token=model.eos_text,
                                              bos_token=model.bos_text)
        self._text = ""
        self._tokens: list[int] = []

    def render(self, messages: Sequence[Message]) -> str:
        try:
            return self._formatter(messages=[{"role": m.role, "content": m.content} for m in messages]).prompt
        except Exception as e:  # jinja raises many kinds; all mean the template rejected this input
            raise SpecchatError(f"the chat template of {self.model.path.name} failed: {e}") from None

    def tokens(self, messages: Sequence[Message]) -> list[int]:
        text = self.render(messages)
        if self._text and text.startswith(self._text):
            tokens = self._tokens + self.model.tokenize(text[len(self._text):], add_bos=False)
        else:
            tokens = self.model.tokenize(text, add_bos=self.model.add_bos and not text.startswith(self.model.bos_text))
        self._text, self._tokens = text, tokens
        return tokens

    def remember(self, answer_ids: Sequence[int]) -> None:
        """After a generation: the cache now holds the last prompt plus these tokens (EOG included)."""
        self._tokens = self._tokens + list(answer_ids)
        self._text += b"".join(self.model.piece(t, special=True) for t in answer_ids).decode("utf-8", "replace")
