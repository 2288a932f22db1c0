"""A reasoning model's thinking, split out of the engine's events as they stream.

Each Step comes back as a Said, its text the answer part, with its thinking part beside it; the Done as an
Answered, its text the answer alone, with the thinking, and the tokens and seconds it took, beside it. The stats still
count every token the model decoded: thinking is work the user waits for.
"""

from __future__ import annotations

from specchat.decoding.events import Done, Event, Step
from specchat.service.events import Answered, ChatEvent, Notice, Said
from specchat.service.reasoning import Format, Reasoning, Splitter, split


class ThinkingSplit:
    """One answer's events, each passed on with its thinking split out (a call per event, so the service's
    own loop drives it: nothing here iterates the service's generators)."""

    def __init__(self, reasoning: Reasoning) -> None:
        self.reasoning, self.splitter = reasoning, Splitter(reasoning)
        self.tokens, self.seconds = 0, 0.0  # what the thinking took

    def __call__(self, event: Event | ChatEvent) -> list[ChatEvent]:
        if isinstance(event, Step):
            was = self.splitter.thinking
            thought, answer = self.splitter.push(event.text)
            # A step that released no answer while thinking was its own (the one that closes the thinking
            # and starts the answer counts as answer: a step's tokens are not divided).
            if not answer and (was or thought or self.splitter.thinking):
                self.tokens += len(event.tokens)
                self.seconds += event.draft_s + event.verify_s
            return [Said.of(event, text=answer, thinking=thought)]
        if isinstance(event, Done):
            thinking, answer = split(event.text, self.reasoning)  # the Done holds the whole text
            said: list[ChatEvent] = []
            # A Harmony answer that ends in a call ends in its commentary channel, with no final message: that
            # is a turn handed to the tool, not thinking cut short (its calls were split out before this).
            if self.splitter.unclosed and not (isinstance(event, Answered) and event.calls):
                close = self.reasoning.close if self.reasoning.format is Format.TAGS else "its final channel"
                said.append(Notice(f"the answer ended inside its thinking (no {close}): what it wrote is kept as "
                                   "thinking; raise max tokens, or ask again"))
            return [*said, Answered.of(event, text=answer, thinking=thinking.strip(),
                                       thinking_tokens=self.tokens if thinking else 0,
                                       thinking_s=self.seconds if thinking else 0.0)]
        return [event]
