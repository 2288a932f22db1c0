"""A reasoning model's thinking, split out of the engine's events as they stream.

Each Step's text comes back as its answer part, with its thinking part beside it; the Done's text is
the answer alone, with the thinking, and the tokens and seconds it took, beside it. The stats still
count every token the model decoded: thinking is work the user waits for.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Iterator

from specchat.decoding.events import Done, Event, Step
from specchat.decoding.reasoning import CLOSE, Format, Reasoning, Splitter, split
from specchat.service.events import ChatEvent, Notice


def split_thinking(events: Iterable[Event], reasoning: Reasoning) -> Iterator[ChatEvent]:
    splitter = Splitter(reasoning)
    tokens, seconds = 0, 0.0
    for event in events:
        if isinstance(event, Step):
            was = splitter.thinking
            thought, answer = splitter.push(event.text)
            # A step that released no answer while thinking was its own (the one that closes the thinking
            # and starts the answer counts as answer: a step's tokens are not divided).
            if not answer and (was or thought or splitter.thinking):
                tokens += len(event.tokens)
                seconds += event.draft_s + event.verify_s
            yield replace(event, text=answer, thinking=thought)
        elif isinstance(event, Done):
            thinking, answer = split(event.text, reasoning)  # the Done holds the whole text
            if splitter.unclosed:
                close = CLOSE if reasoning.format is Format.TAGS else "its final channel"
                yield Notice(f"the answer ended inside its thinking (no {close}): what it wrote is kept as "
                             "thinking; raise max tokens, or ask again")
            yield replace(event, text=answer, thinking=thinking.strip(),
                          thinking_tokens=tokens if thinking else 0, thinking_s=seconds if thinking else 0.0)
        else:
            yield event
