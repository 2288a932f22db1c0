"""The conversation service: a loaded pair behind chat turns, the same for every front end.

It owns what a conversation needs beyond the engine: the chat prompter (which reuses the previous
turn's KV cache token for token), the guessers and the rule that restarts them, and the context
policy. The app's local backend, `generate`, `serve` and the measuring commands all go through it,
so a fix to prompt reuse, to auto's state or to the context policy is made once and holds everywhere.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from specchat.decoding.calibrate import OtherLoad
from specchat.decoding.engine import Engine, GenerationConfig
from specchat.decoding.events import Done, Event, Stats, Step
from specchat.decoding.guessers import REGISTRY, Guesser, Inputs, available, build, unavailable
from specchat.errors import SpecchatError
from specchat.llama.template import ChatPrompter, Message
from specchat.llama.toolcalls import ToolFormat, format_of
from specchat.service.costs import machine_turns
from specchat.service.events import Answered, ChatEvent, Notice, Said
from specchat.service.history import History
from specchat.service.pair import LoadedPair
from specchat.service.reasoning import Reasoning, reasoning_of
from specchat.service.thinking import ThinkingSplit
from specchat.service.toolsplit import ToolSplit, check_tools, schemas, tool_constraint

# Room kept for the answer when old turns must go: the max-tokens setting, up to this much.
ANSWER_ROOM = 256




class ChatService:
    """One pair, one conversation at a time (the engine is batch 1). Not thread-safe: callers run one
    generation at a time (the app's backend holds a lock; the server has one worker thread)."""

    def __init__(self, pair: LoadedPair, history: History | None = None) -> None:
        self.pair, self.target = pair, pair.target
        # The app's conversations, for the history guesser and auto to copy from (a server has none).
        self.history = history
        self.engine = Engine(pair.target)
        self._prompter: ChatPrompter | None = None
        self._guessers: dict[str, Guesser] = {}
        self._reasonings: dict[str, Reasoning] = {}  # by the template variables they were found under
        self._tool_format: ToolFormat | None = None  # read off the template when tools are first given
        self.last_prompt: list[int] = []  # the tokens the last generation was given

    @property
    def n_ctx(self) -> int:
        return self.target.n_ctx

    def inputs(self, costs: bool = False) -> Inputs:
        """What the guessers are built from: the pair, and the conversations to copy from if there are any."""
        return self.pair.inputs(self.history.index if self.history is not None else None, costs)

    @property
    def guessers(self) -> list[str]:
        return available(self.inputs().capabilities)

    def require(self, guesser: str) -> None:
        """A one-line error now if this guesser cannot run on the pair (before anything else is said)."""
        why = unavailable(guesser, self.inputs().capabilities, self.pair.warnings)
        if why is not None:
            raise SpecchatError(why)

    @property
    def prompter(self) -> ChatPrompter:
        """Built on first use: a base model has no chat template, and still completes raw text."""
        if self._prompter is None:
            self._prompter = ChatPrompter(self.target)
        return self._prompter

    def count_tokens(self, text: str) -> int:
        return len(self.target.tokenize(text, special=False))

    @property
    def thinking_switch(self) -> str | None:
        """The template variable that turns thinking on and off (None: the template reads none)."""
        return self.prompter.template.switch

    def template_variables(self, think: bool | None, given: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """What the chat template is given beyond the messages: the thinking switch where the template has one
        (on, off, or the model's default), then a request's own (a server's chat_template_kwargs)."""
        return {**self.prompter.template.variables(think), **(given or {})}

    def chat(self, messages: Sequence[Message], config: GenerationConfig, guesser: str,
             cancel: threading.Event | None = None, variables: Mapping[str, Any] | None = None,
             tools: Sequence[dict[str, Any]] | None = None,
             tool_choice: str | Mapping[str, Any] | None = None, parallel_tool_calls: bool = False) -> Iterator[ChatEvent]:
        """Answer the conversation's last message. What the cache holds of the conversation so far is
        reused; a conversation too long for the context loses its oldest turns, and a Notice says so.
        A reasoning model's thinking comes apart from its answer (`specchat.service.thinking`). `variables`
        go to the chat template (None: `template_variables(None)`, the model's default).

        `tools` (OpenAI function schemas) go to the template, and the answer's calls come apart from its text
        (`specchat.service.toolsplit`) unless `tool_choice` is "none", which renders them but reads no calls, as
        llama-server does. A required call is one call unless `parallel_tool_calls` (as llama-server's default: a
        small model let to go on calls the same tool again until max_tokens). Without tools nothing here changes."""
        variables = self.template_variables(None) if variables is None else dict(variables)
        tools = list(tools or ())
        check_tools(tools, tool_choice)
        tools = schemas(tools)
        fmt = self.tool_format() if tools and tool_choice != "none" else None
        if fmt is not None:  # a required or named call: a grammar over the target's distribution makes it
            config = replace(config, constraint=tool_constraint(tools, tool_choice, fmt, self.target, parallel_tool_calls))
        prompt, dropped = self.fit(messages, config.max_tokens, variables, tools)
        if dropped:
            yield Notice(f"the conversation is longer than the {self.n_ctx}-token context: "
                         f"the oldest {dropped} message(s) were left out of this answer")
        if self.history is not None:
            self.history.sync()  # a deleted conversation's text is not copied from
        reasoning = self._reasoning(variables)
        splits: list[Callable[[ChatEvent], list[ChatEvent]]] = [ThinkingSplit(reasoning)]
        if fmt is not None:
            # Harmony's calls are messages the thinking split would take for thought: they come out first.
            splits.insert(0 if fmt.harmony else 1, ToolSplit(fmt, tools=tools))
        for engine_event in self._generate(prompt, config, guesser, cancel, self.prompter.continued):
            for event in _through(splits, engine_event):
                if isinstance(event, Done):
                    self.prompter.remember(event.token_ids)
                    if self.history is not None:
                        self.history.learn([m.content for m in messages] + [event.thinking, event.text])
                yield event

    def tool_format(self) -> ToolFormat:
        """How the target's template writes calls, or a one-line error where it is none this reads."""
        if self._tool_format is None:
            fmt = format_of(self.prompter.template)
            if fmt is None:
                raise SpecchatError(f"tools are not supported with {self.target.path.name}: its chat template writes "
                                    "tool calls in a form specchat does not read; leave tools out, or use another "
                                    "model")
            self._tool_format = fmt
        return self._tool_format

    def _reasoning(self, variables: dict[str, Any]) -> Reasoning:
        key = json.dumps(variables, sort_keys=True, default=str)
        if key not in self._reasonings:
            reasoning = self._reasonings[key] = reasoning_of(self.prompter.template, variables)
            self.target.show([reasoning.open, reasoning.close, *(reasoning.wrap or ())])
        return self._reasonings[key]

    def complete(self, prompt: str | Sequence[int], config: GenerationConfig, guesser: str,
                 cancel: threading.Event | None = None) -> Iterator[ChatEvent]:
        """Continue raw text or token ids, with no chat template (base models, /v1/completions)."""
        if isinstance(prompt, str):
            tokens = self.target.tokenize(prompt, add_bos=self.target.add_bos)
        else:
            bad = next((t for t in prompt if not 0 <= t < self.target.n_vocab), None)
            if bad is not None:
                raise SpecchatError(f"token id {bad} is not in the vocabulary (0 to {self.target.n_vocab - 1})")
            tokens = list(prompt)
        if not tokens:
            raise SpecchatError("the prompt is empty; give at least one token of text")
        if self._prompter is not None:
            self._prompter.forget()  # the cache no longer holds the last conversation's turn
        yield from self._generate(tokens, config, guesser, cancel, continued=False)

    def fit(self, messages: Sequence[Message], max_tokens: int, variables: dict[str, Any] | None = None,
            tools: Sequence[dict[str, Any]] = ()) -> tuple[list[int], int]:
        """The context policy: the prompt tokens, after leaving out the oldest turns (never the system
        prompt or the last message) until the prompt leaves room for an answer; and how many went."""
        messages = list(messages)
        prompt = self.prompter.tokens(messages, variables, tools)
        system = 1 if messages and messages[0].role == "system" else 0
        dropped = 0
        while len(prompt) + min(max_tokens, ANSWER_ROOM) > self.n_ctx and len(messages) > system + 1:
            del messages[system]
            dropped += 1
            prompt = self.prompter.tokens(messages, variables, tools)
        return prompt, dropped

    def _generate(self, prompt: list[int], config: GenerationConfig, guesser: str,
                  cancel: threading.Event | None, continued: bool) -> Iterator[ChatEvent]:
        self.engine.guesser = self._guesser(guesser, continued)
        self.last_prompt = prompt
        turns = machine_turns()
        for line in turns.wait(cancel):
            yield Notice(line)
        if not turns.has:  # stopped while it waited for another process's answer
            yield Answered("cancelled", "", (), Stats(n_prompt=len(prompt)))
            return
        try:
            for event in self._timed(self.engine.generate(prompt, config, cancel), config.sampling.seed is None):
                if isinstance(event, Done):  # the machine is free as soon as the answer is
                    turns.release()
                yield event
        finally:
            turns.release()

    def _timed(self, events: Iterator[Event], learn: bool) -> Iterator[ChatEvent]:
        """The engine's events as the service's (`specchat.service.events`), its Done told what plain decoding
        costs now and whether the machine was busy (steps slower than the curve says, or other programs on the
        cores meanwhile), and a quiet answer's steps teaching the pair's costs (not with a seed: a seeded answer
        repeats in a fresh process only if its timings leave the cached curve alone)."""
        costs = self.pair.costs if self.pair.costs.calibration is not None else None
        if costs is None:  # no curve was ever needed (plain decoding): nothing to judge by
            yield from map(_passed_on, events)
            return
        before, steps = costs.curve.copy(), []
        with OtherLoad(self.target.n_threads) as load:
            for event in events:
                if isinstance(event, Step):
                    steps.append(event)
                elif isinstance(event, Done):
                    event = costs.judge(event, steps, before, load.so_far())
                    if learn and not event.busy:
                        costs.learn(steps)
                        costs.save()
                yield _passed_on(event)

    def _guesser(self, name: str, continued: bool) -> Guesser:
        # A conversation that goes on keeps its guessers: auto carries what it learned of this text
        # into the next turn. Another conversation, a regenerated answer or a raw completion starts
        # each afresh, as a fresh `specchat generate` does, rather than from what another text taught.
        if not continued:
            self._guessers.clear()
        if name not in self._guessers:
            entry = REGISTRY.get(name)
            self._guessers[name] = build(name, self.inputs(costs=entry is not None and entry.costs))
        return self._guessers[name]

    def close(self) -> None:
        self.pair.close()


def _passed_on(event: Event) -> ChatEvent:
    """An engine event as the service passes it on: a Step as a Said, a Done as an Answered (an Answered, and a
    Prefill, as they are)."""
    if isinstance(event, Step):
        return Said.of(event)
    return Answered.of(event) if isinstance(event, Done) and not isinstance(event, Answered) else event


def _through(splits: Sequence[Callable[[ChatEvent], list[ChatEvent]]], event: ChatEvent) -> list[ChatEvent]:
    """An engine event passed through each split in turn (each may make it several, or add a Notice)."""
    events = [event]
    for split in splits:
        events = [out for e in events for out in split(e)]
    return events
