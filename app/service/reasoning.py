"""A reasoning model's thinking, told apart from its answer as the text streams.

Two formats cover this year's reasoning GGUFs (llama.cpp's common/chat.cpp parses the same ones):

- **Tags**: `<think>…</think>` then the answer (Qwen3.x, DeepSeek R1 and its distills, GLM, QwQ, and
  any model a system prompt teaches to think in tags). Some templates open the tag in the generation
  prompt themselves (DeepSeek R1's ends with `<think>\\n`), so the answer starts inside the thinking.
  Other markers are read off how the template writes an earlier answer's thinking, as llama.cpp's
  chat-diff-analyzer does: Seed-OSS thinks in `<seed:think>…</seed:think>`, and Apriel's generation
  prompt opens the thinking in words that `[BEGIN FINAL RESPONSE]` closes. Granite 3.3 also wraps the
  answer in `<response>…</response>`, which is dropped.
- **Harmony** (gpt-oss): messages `<|channel|>NAME<|message|>TEXT`, each after `<|start|>assistant`.
  The `final` channel is the answer; `analysis` (and `commentary`) is thinking. llama.cpp renders
  `<|start|>`, `<|channel|>` and `<|message|>` as text for these models; `<|end|>` it does not, so a
  message ends where the next header starts.

`Splitter` is pure text in, text out: the engine's released text goes in a piece at a time, and
each piece comes back as (thinking, answer). A marker split across pieces is held back until it is
known, as the text stream holds back a stop string.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from specchat.errors import SpecchatError
from specchat.llama.template import ChatTemplate, Message, held_back


class Format(enum.Enum):
    TAGS = "tags"
    HARMONY = "harmony"


OPEN, CLOSE = "<think>", "</think>"
START, CHANNEL, MESSAGE, END = "<|start|>", "<|channel|>", "<|message|>", "<|end|>"
ANSWER_CHANNEL = "final"


@dataclass(frozen=True)
class Reasoning:
    """How one template's answers carry thinking: the format, whether its generation prompt already
    opened the thinking (so the answer's first text is thought), the tags (an empty `open`: only the
    generation prompt opens it), and what the answer is wrapped in, if anything."""

    format: Format = Format.TAGS
    starts_open: bool = False
    open: str = OPEN
    close: str = CLOSE
    wrap: tuple[str, str] | None = None


# Text no template holds, to find where a template puts an earlier answer's thinking and its answer.
_THOUGHT, _ANSWER = "SPECCHAT_THOUGHT_7f3a", "SPECCHAT_ANSWER_7f3a"
RESPONSE = ("<response>", "</response>")  # Granite 3.3's answer wrapper, which its system prompt asks for


def reasoning_of(template: ChatTemplate, variables: dict[str, Any] | None = None) -> Reasoning:
    """How a template's answers carry thinking: Harmony where it speaks Harmony, else tags (any model may
    think in tags, taught by its training or a system prompt): `<think>` unless the template writes an
    earlier answer's thinking otherwise, opened already where the generation prompt ends inside it
    (DeepSeek R1's does, unless thinking is switched off, and Apriel's always does)."""
    if CHANNEL in template.source:
        return Reasoning(Format.HARMONY)
    wrap = RESPONSE if "".join(RESPONSE) in template.source else None
    prompt = template.render([Message("user", "Hi")], variables=variables).rstrip()
    try:
        written = template.render([Message("user", "Hi"), Message("assistant", _ANSWER, _THOUGHT)], False, variables)
    except SpecchatError:  # a template that refuses such a conversation: it writes no thinking back either
        written = ""
    thought, answer = written.find(_THOUGHT), written.find(_ANSWER)
    close = written[thought + len(_THOUGHT):answer].strip() if 0 <= thought < answer else ""
    if not close or close == CLOSE:
        return Reasoning(Format.TAGS, prompt.endswith(OPEN), wrap=wrap)
    if close.startswith("</") and close.endswith(">"):  # a tag of its own: <seed:think>…</seed:think>
        opened = "<" + close[2:]
        return Reasoning(Format.TAGS, prompt.endswith(opened), opened, close, wrap)
    # Closed by words, opened by none (Apriel: "Here are my reasoning steps:" … "[BEGIN FINAL RESPONSE]"):
    # only the generation prompt opens the thinking, so it is open from the start.
    return Reasoning(Format.TAGS, True, "", close, wrap)


class _State(enum.Enum):
    START = "start"  # nothing but whitespace yet: thinking may still open
    THINKING = "thinking"
    ANSWER = "answer"
    HEADER = "header"  # Harmony: between a message's start and its <|message|>


class Splitter:
    """One answer's text, split into thinking and answer as it streams."""

    def __init__(self, reasoning: Reasoning = Reasoning()) -> None:
        self.format = reasoning.format
        self.open, self.close, self.wrap = reasoning.open, reasoning.close, reasoning.wrap
        self._unwrapped = reasoning.wrap is None  # the answer's wrapper, if any, has not opened yet
        self._state = _State.THINKING if reasoning.starts_open else _State.START
        self._held = ""
        self._strip = True  # a section's first text drops its leading whitespace (the newline after a tag)
        self.thought = False  # the answer had thinking (so far)

    @property
    def thinking(self) -> bool:
        """Whether the text now streaming is thought, not answer."""
        return self._state in (_State.THINKING, _State.HEADER)

    def push(self, text: str) -> tuple[str, str]:
        """More of the answer's text; returns the (thinking, answer) it releases."""
        self._held += text
        thinking, answer = [], []
        while self._held:
            if not self._advance(thinking, answer):
                break
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """The answer ended: what was held back is released as it stands."""
        rest, self._held = self._held, ""
        if self._state in (_State.ANSWER, _State.START):  # nothing opened a thinking: it is answer
            return "", rest
        return ("", "") if self._state is _State.HEADER else (rest, "")

    @property
    def unclosed(self) -> bool:
        """The answer ended inside its thinking (no answer followed it)."""
        return self._state in (_State.THINKING, _State.HEADER) and self.thought

    def _advance(self, thinking: list[str], answer: list[str]) -> bool:
        """Consume what can be decided of the held text; False when the rest must wait for more."""
        if self._strip and self._state in (_State.THINKING, _State.ANSWER):
            self._held = self._held.lstrip()
            if not self._held:
                return False
            self._strip = False
        held = self._held
        if self.format is Format.HARMONY:
            return self._harmony(thinking, answer)
        if self._state is _State.START:
            stripped = held.lstrip()
            if not stripped:
                return False
            if self.open and stripped.startswith(self.open):
                self._state, self._held, self.thought = _State.THINKING, stripped[len(self.open):], True
                self._strip = True
                return True
            if self.open.startswith(stripped) or (self.wrap and self.wrap[0].startswith(stripped)):
                return False  # maybe the tag, still arriving
            self._state, self._strip = _State.ANSWER, False  # an answer without thinking stays as written
            return True
        if self._state is _State.THINKING:
            self.thought = True
            if not self._release_until(self.close, thinking):
                return False
            self._state, self._strip = _State.ANSWER, True
            return True
        if not self._unwrapped:  # the answer's first text: its wrapper's opening, if that is what it is
            opening, first = self.wrap[0], held.lstrip()  # type: ignore[index]
            if opening.startswith(first) and first != opening:
                return False
            self._unwrapped = True
            if first.startswith(opening):
                self._held, self._strip = first[len(opening):], True
                return True
        if self.wrap is not None:  # its closing goes wherever it comes
            return self._release_until(self.wrap[1], answer)
        answer.append(held)
        self._held = ""
        return False

    def _release_until(self, marker: str, out: list[str]) -> bool:
        """Release the held text up to `marker` into `out` and drop the marker: True. Where the marker has not
        come, release all but a tail that may be its start, and keep that: False."""
        held = self._held
        at = held.find(marker)
        if at >= 0:
            out.append(held[:at])
            self._held = held[at + len(marker):]
            return True
        keep = held_back(held, (marker,))
        out.append(held[:len(held) - keep])
        self._held = held[len(held) - keep:]
        return False

    def _harmony(self, thinking: list[str], answer: list[str]) -> bool:
        held = self._held
        if self._state in (_State.START, _State.HEADER):
            # A header: "<|start|>assistant<|channel|>analysis<|message|>". Text before any header is
            # the answer of a model that skipped the format.
            if self._state is _State.START and not held.startswith((START, CHANNEL)):
                if any(m.startswith(held) for m in (START, CHANNEL)):
                    return False
                self._state, self._strip = _State.ANSWER, False
                return True
            at = held.find(MESSAGE)
            if at < 0:
                return False
            header = held[:at]
            channel = header.split(CHANNEL, 1)[1].split("<|", 1)[0].split() if CHANNEL in header else []
            self._state = _State.ANSWER if channel[:1] == [ANSWER_CHANNEL] else _State.THINKING
            if self._state is _State.THINKING and self.thought:  # another thinking message: a paragraph apart
                thinking.append("\n\n")
            self.thought |= self._state is _State.THINKING
            self._held, self._strip = held[at + len(MESSAGE):], True
            return True
        out = answer if self._state is _State.ANSWER else thinking
        ends = [i for i in (held.find(m) for m in (START, CHANNEL, END)) if i >= 0]
        if ends:
            at = min(ends)
            out.append(held[:at])
            rest = held[at:]
            self._held = rest[len(END):] if rest.startswith(END) else rest
            self._state = _State.HEADER
            return True
        keep = held_back(held, (START, CHANNEL, END))
        out.append(held[:len(held) - keep])
        self._held = held[len(held) - keep:]
        return False


def split(text: str, reasoning: Reasoning = Reasoning()) -> tuple[str, str]:
    """A whole answer's (thinking, answer)."""
    splitter = Splitter(reasoning)
    parts = [splitter.push(text), splitter.flush()]
    return "".join(p[0] for p in parts), "".join(p[1] for p in parts)
