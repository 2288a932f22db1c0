"""The served model: a loaded pair, its engine and chat prompter, and requests turned into events.

Everything here runs on the worker's thread, one request at a time: the engine is batch 1 and the
prompter remembers the last conversation, so that its next turn reuses the KV cache.
"""

from __future__ import annotations

import threading
from typing import Iterator, Sequence

from specchat.errors import SpecchatError
from specchat.llama.template import ChatPrompter, Message
from specchat.loader import LoadedPair
from specchat.spec.engine import Done, Engine, Event, GenerationConfig
from specchat.spec.guessers import Guesser


class ContextLengthExceeded(SpecchatError):
    """The prompt leaves no room in the context for an answer."""


class ServedModel:
    def __init__(self, pair: LoadedPair, model_id: str) -> None:
        self.pair, self.id = pair, model_id
        self.target = pair.target
        self.n_ctx = self.target.n_ctx
        self.engine = Engine(self.target)
        self.prompter = ChatPrompter(self.target)
        self._auto: Guesser | None = None

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event) -> Iterator[Event]:
        prompt = self.prompter.tokens(messages)
        continued = self.prompter.continued
        for event in self._generate(prompt, config, guesser, cancel, continued):
            if isinstance(event, Done):
                self.prompter.remember(event.token_ids)
            yield event

    def complete(self, prompt: str | list[int], config: GenerationConfig, guesser: str,
                 cancel: threading.Event) -> Iterator[Event]:
        if isinstance(prompt, str):
            tokens = self.target.tokenize(prompt, add_bos=self.target.add_bos)
        else:
            bad = next((t for t in prompt if not 0 <= t < self.target.n_vocab), None)
            if bad is not None:
                raise SpecchatError(f"token id {bad} is not in the vocabulary (0 to {self.target.n_vocab - 1})")
            tokens = list(prompt)
        if not tokens:
            raise SpecchatError("the prompt is empty; give at least one token of text")
        yield from self._generate(tokens, config, guesser, cancel, continued=False)

    def _generate(self, prompt: list[int], config: GenerationConfig, guesser: str, cancel: threading.Event,
                  continued: bool) -> Iterator[Event]:
        if len(prompt) >= self.n_ctx:
            raise ContextLengthExceeded(f"the prompt is {len(prompt)} tokens but the context holds {self.n_ctx}; "
                                        "shorten it, or restart the server with a larger --ctx")
        self.engine.guesser = self._guesser(guesser, continued)
        yield from self.engine.generate(prompt, config, cancel)

    def _guesser(self, name: str, continued: bool) -> Guesser:
        if name != "auto":
            return self.pair.guesser(name)  # stateless, or (draft) syncing its cache to each context
        # auto learns the text's acceptance as it goes: it keeps what it learnt while a conversation
        # goes on, and starts from its priors for another one, as the app does.
        if self._auto is None or not continued:
            self._auto = self.pair.guesser("auto")
        return self._auto

    def close(self) -> None:
        self.pair.close()
