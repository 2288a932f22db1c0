"""The conversation service (service/chat.py) on scripted models: cache reuse across turns, the context
policy, the guessers' restart rule and bad prompts. No weights: what it adds around the engine."""

from __future__ import annotations

import pytest
from fakes import ScriptedModel

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Prefill, Step
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.events import Notice
from specchat.service.pair import LoadedPair

GREEDY = GenerationConfig(max_tokens=12, sampling=SamplingConfig())


def service(n_ctx: int = 1024, draft: bool = False) -> ChatService:
    target = ScriptedModel(seed=1, sharpness=3.0, text=True, order=1, n_ctx=n_ctx, name="target")
    return ChatService(LoadedPair(target, ScriptedModel(seed=1, sharpness=3.0, text=True, order=1, n_ctx=n_ctx,
                                                        name="draft") if draft else None))


def answer(chat: ChatService, messages: list[Message], guesser: str = "lookup",
           config: GenerationConfig = GREEDY) -> tuple[list[object], Done]:
    events = list(chat.chat(messages, config, guesser))
    assert isinstance(events[-1], Done)
    return events, events[-1]


def test_the_next_turn_decodes_only_what_is_new():
    chat = service()
    first = [Message("system", "Be brief."), Message("user", "Name a colour.")]
    _, done = answer(chat, first)
    session, first_prompt = chat.target.session, len(chat.last_prompt)
    before = session.decoded
    second = [*first, Message("assistant", done.text), Message("user", "Another one.")]
    events, _ = answer(chat, second)
    prefill = next(e for e in events if isinstance(e, Prefill))
    # The first turn's prompt and answer stay in the cache: only the new message and the answer are decoded.
    assert chat.prompter.continued
    assert prefill.cached >= first_prompt + len(done.token_ids) - 1
    new = len(chat.last_prompt) - prefill.cached
    assert session.decoded - before <= new + GREEDY.max_tokens


def test_a_conversation_too_long_for_the_context_loses_its_oldest_turns_and_says_so():
    chat = service(n_ctx=400)
    turns = [Message("system", "Be brief.")]
    for i in range(8):
        turns += [Message("user", f"Question {i}: " + "word " * 10), Message("assistant", f"Answer {i}.")]
    turns.append(Message("user", "The last question."))
    events, done = answer(chat, turns)
    notices = [e for e in events if isinstance(e, Notice)]
    prompt, dropped = chat.fit(turns, GREEDY.max_tokens)
    assert dropped > 0 and len(notices) == 1 and f"the oldest {dropped} message(s)" in notices[0].text
    assert len(prompt) + GREEDY.max_tokens <= chat.n_ctx
    text = b"".join(chat.target.piece(t, special=True) for t in prompt).decode()
    assert text.startswith("<|im_start|>system\nBe brief.") and "The last question." in text  # both kept
    assert "Question 0:" not in text and "Question 7:" in text  # the oldest went first
    assert done.reason in ("eog", "max_tokens")


def test_a_conversation_that_goes_on_keeps_its_guesser_and_another_starts_afresh():
    chat = service()
    first = [Message("user", "Hello there.")]
    _, done = answer(chat, first)
    kept = chat._guessers["lookup"]
    answer(chat, [*first, Message("assistant", done.text), Message("user", "And again.")])
    assert chat._guessers["lookup"] is kept  # what it learned of this text goes on with it
    answer(chat, [Message("user", "Something else entirely.")])
    assert chat._guessers["lookup"] is not kept


def test_lookup_and_draft_answers_equal_plain_decoding():
    chat = service(draft=True)
    messages = [Message("user", "Repeat: the cat sat on the mat, the cat sat on the mat.")]
    config = GenerationConfig(max_tokens=40, sampling=SamplingConfig())
    texts = {g: answer(chat, messages, g, config)[1].token_ids for g in ("none", "lookup", "draft")}
    assert texts["lookup"] == texts["none"] == texts["draft"]
    steps = [e for e in chat.chat(messages, config, "draft") if isinstance(e, Step)]
    assert sum(s.accepted for s in steps) > 0  # the draft is the target's twin: its guesses held


def test_a_guesser_the_pair_cannot_run_is_refused_in_one_line():
    chat = service()
    with pytest.raises(SpecchatError, match="^the draft guesser needs"):
        chat.require("draft")
    with pytest.raises(SpecchatError, match="unknown guesser 'psychic'"):
        chat.require("psychic")
    assert chat.guessers == ["auto", "none", "lookup"] and "draft" in service(draft=True).guessers


def test_raw_completions_refuse_what_is_not_a_prompt():
    chat = service()
    with pytest.raises(SpecchatError, match=r"token id 999 is not in the vocabulary \(0 to 257\)"):
        list(chat.complete([1, 999], GREEDY, "none"))
    with pytest.raises(SpecchatError, match="the prompt is empty"):
        list(chat.complete("", GREEDY, "none"))
    done = list(chat.complete("Once upon a time", GREEDY, "lookup"))[-1]
    assert isinstance(done, Done) and done.stats.n_tokens > 0
