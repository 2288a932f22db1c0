"""Tool calls split out of the engine's events (service/toolsplit.py), alone and beside the thinking split, as the
service orders them: Steps in pieces at every split point give the same calls and text; and the service over a
fake model with real templates (Qwen2.5 Coder's, gpt-oss's): prompt reuse across a tool turn, an unsupported
template, a request without tools."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Iterator

import pytest
from fakes.model import TEMPLATE, AnsweringModel

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Prefill, Stats, Step
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.llama.toolcalls import HERMES
from specchat.service import costs
from specchat.service.chat import ChatService, _through
from specchat.service.events import Notice
from specchat.service.pair import LoadedPair
from specchat.service.reasoning import Reasoning
from specchat.service.thinking import ThinkingSplit
from specchat.service.toolsplit import ToolSplit

TEMPLATES = Path(__file__).parent.parent / "templates"
QWEN = (TEMPLATES / "Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja").read_text()
GPT_OSS = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
PARIS = ToolCall("get_weather", '{"city": "Paris"}', "id1")
GREEDY = GenerationConfig(SamplingConfig(), max_tokens=400)


def step(text: str) -> Step:
    return Step((), text, 0, 0, 0.0, 0.0)


def pieces(text: str) -> Iterator[list[str]]:
    """The text in three pieces, at every pair of split points (empty pieces too)."""
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        yield [text[:i], text[i:j], text[j:]]


def run(splits: list, texts: list[str], whole: str | None = None, reason: str = "eog") -> list:
    events = [e for t in texts for e in _through(splits, step(t))]
    return events + _through(splits, Done(reason, "".join(texts) if whole is None else whole, (), Stats()))


def outcome(events: list) -> tuple[str, tuple[ToolCall, ...], Done, list[str]]:
    """What the steps released (text, calls), the Done, and the notices."""
    steps = [e for e in events if isinstance(e, Step)]
    done = events[-1]
    assert isinstance(done, Done)
    return "".join(s.text for s in steps), tuple(c for s in steps for c in s.calls), done, \
        [e.text for e in events if isinstance(e, Notice)]


def test_a_call_split_at_every_point_gives_the_same_text_and_call():
    answer = "Let me look.\n" + CALL + "\n"
    for texts in pieces(answer):
        streamed, calls, done, notices = outcome(run([ToolSplit(HERMES, lambda: "id1")], texts))
        assert done.text == streamed == "Let me look.\n", texts  # released by the steps, as soon as known
        assert done.calls == (PARIS,) and calls in ((), (PARIS,)), texts  # the call comes once, with its </tool_call>
        assert calls == (PARIS,) or texts[2] == "" or texts[2].strip() == "", texts
        assert done.reason == "tool_calls" and notices == [], texts


def test_a_call_after_thinking_comes_out_of_the_answer_at_every_split_point():
    # Qwen3's order: the thinking split first, the call read off what it leaves as the answer.
    answer = "<think>I should look it up.</think>\n\n" + CALL
    for texts in pieces(answer):
        splits = [ThinkingSplit(Reasoning()), ToolSplit(HERMES, lambda: "id1")]
        streamed, calls, done, notices = outcome(run(splits, texts))
        assert (done.thinking, done.text, done.calls) == ("I should look it up.", "", (PARIS,)), texts
        assert done.reason == "tool_calls" and notices == [] and streamed == "", texts


def test_text_released_only_at_the_end_is_split_too():
    # The engine holds text back near a stop string and gives it in the Done alone: the call's end is there.
    events = run([ToolSplit(HERMES, lambda: "id1")], [CALL[:30]], whole=CALL + " Done.")
    streamed, calls, done, notices = outcome(events)
    assert (streamed, calls) == ("", ())
    assert (done.text, done.calls, done.reason) == (" Done.", (PARIS,), "tool_calls")


def test_what_may_be_a_marker_is_held_back_and_released_at_the_end_at_every_split_point():
    for texts in pieces("Use <tool"):
        streamed, calls, done, notices = outcome(run([ToolSplit(HERMES, lambda: "id1")], texts))
        assert streamed == "Use " and done.text == "Use <tool" and done.calls == () and notices == [], texts


def test_an_answer_cut_short_after_a_call_keeps_its_reason():
    # As llama-server: "tool_calls" only for an answer that ended as a turn ends, not one max_tokens cut.
    _, _, done, _ = outcome(run([ToolSplit(HERMES, lambda: "id1")], [CALL, " and"], reason="max_tokens"))
    assert done.calls == (PARIS,) and done.reason == "max_tokens"


def test_malformed_call_text_is_kept_with_one_notice_at_every_split_point():
    broken = "Here: " + CALL.replace("}}", "}")
    for texts in pieces(broken):
        streamed, calls, done, notices = outcome(run([ToolSplit(HERMES, lambda: "id1")], texts))
        assert done.text == streamed == broken and calls == done.calls == (), texts
        assert done.reason == "eog" and len(notices) == 1 and notices[0].startswith("malformed tool call"), texts


# --- through the service -----------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _turns_of_its_own(tmp_path, monkeypatch) -> None:
    """Fakes take an answering turn of their own, not the machine's (a real model may be answering)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(costs, "_turns", None)


def service(template: str, answer: str) -> ChatService:
    return ChatService(LoadedPair(AnsweringModel(answer, template, name="fake"), None))


def test_a_harmony_call_comes_out_before_the_thinking_split_takes_its_message_for_thought():
    answer = ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary "
              'to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}')
    chat = service(GPT_OSS, answer)
    events = list(chat.chat([Message("user", "Weather in Paris?")], GREEDY, "none", tools=[WEATHER]))
    done = events[-1]
    assert [(c.name, json.loads(c.arguments)) for c in done.calls] == [("get_weather", {"city": "Paris"})]
    assert (done.thinking, done.text, done.reason) == ("Need the weather.", "", "tool_calls")
    # The turn was handed to the tool, not cut short inside its thinking: nothing to warn of.
    assert [e for e in events if isinstance(e, Notice)] == []
    # Its end is <|call|>, an end of generation, never text: the call is finished by the answer's end, in the Done.
    assert [c for e in events if isinstance(e, Step) for c in e.calls] == []


def test_the_next_turn_after_a_call_reuses_the_prompt_and_the_call_the_model_wrote():
    chat = service(QWEN, CALL)
    first = [Message("user", "Weather in Paris?")]
    done = list(chat.chat(first, GREEDY, "none", tools=[WEATHER]))[-1]
    prompt, tokens = chat.last_prompt, len(chat.last_prompt) + len(done.token_ids)
    assert "get_weather" in bytes(t for t in prompt if t < 256).decode()  # the tools are in the prompt
    chat.target.answer = "It is 18 degrees."
    second = [*first, Message("assistant", done.text, tool_calls=done.calls),
              Message("tool", "18 degrees", tool_call_id=done.calls[0].id)]
    events = list(chat.chat(second, GREEDY, "none", tools=[WEATHER]))
    prefill = next(e for e in events if isinstance(e, Prefill))
    # The template writes the call back as the model wrote it: the whole first turn, answer and all, is reused.
    assert chat.prompter.continued and prefill.cached >= tokens - 1
    assert events[-1].text == "It is 18 degrees." and events[-1].reason == "eog"


def test_tools_with_a_template_that_writes_no_calls_are_refused_in_one_line():
    chat = service(TEMPLATE, CALL)
    with pytest.raises(SpecchatError) as e:
        list(chat.chat([Message("user", "Hi")], GREEDY, "none", tools=[WEATHER]))
    assert str(e.value).startswith("tools are not supported with fake.gguf") and "\n" not in str(e.value)
    # Without tools (or with tool_choice "none", which reads no calls) it answers.
    assert list(chat.chat([Message("user", "Hi")], GREEDY, "none"))[-1].text == CALL
    none = list(chat.chat([Message("user", "Hi")], GREEDY, "none", tools=[WEATHER], tool_choice="none"))[-1]
    assert none.text == CALL and none.calls == ()


def test_without_tools_the_answer_and_its_events_are_as_before():
    chat = service(QWEN, CALL)
    asked = [Message("user", "Weather in Paris?")]
    events = list(chat.chat(asked, GREEDY, "none"))
    done = events[-1]
    assert (done.text, done.calls, done.reason) == (CALL, (), "eog")
    assert "".join(e.text for e in events if isinstance(e, Step)) == CALL
    assert not any(isinstance(e, Notice) for e in events)
    for empty in ([], None):  # no tools at all is the same
        assert list(chat.chat(asked, GREEDY, "none", tools=empty))[-1].text == CALL


def test_a_call_written_inside_the_thinking_is_thought_not_a_call():
    # As llama.cpp parses calls in the content only: for JSON formats the thinking comes off first.
    qwen3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    answer = "<think>Maybe " + CALL + " would do.</think>\n\nNo call is needed."
    events = list(service(qwen3, answer).chat([Message("user", "Hi")], GREEDY, "none", tools=[WEATHER]))
    done = events[-1]
    assert (done.text, done.calls, done.reason) == ("No call is needed.", (), "eog")
    assert done.thinking == "Maybe " + CALL + " would do."


def test_tagged_arguments_are_typed_by_the_tools_the_service_was_given():
    """Qwen3-Coder's calls through the service: the request's tools reach the splitter, so a string parameter
    written as digits stays a string and an integer is a number; the call written back is the model's text."""
    coder = (TEMPLATES / "Qwen3-Coder.jinja").read_text()
    tool = {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}}}}
    answer = ("<tool_call>\n<function=forecast>\n<parameter=city>\n75001\n</parameter>\n<parameter=days>\n3\n"
              "</parameter>\n</function>\n</tool_call>")
    chat = service(coder, answer)
    first = [Message("user", "Weather in Paris?")]
    done = list(chat.chat(first, GREEDY, "none", tools=[tool]))[-1]
    assert [(c.name, json.loads(c.arguments)) for c in done.calls] == [("forecast", {"city": "75001", "days": 3})]
    assert (done.text, done.reason) == ("", "tool_calls")
    tokens = len(chat.last_prompt) + len(done.token_ids)
    chat.target.answer = "Sunny."
    second = [*first, Message("assistant", done.text, tool_calls=done.calls),
              Message("tool", "sunny", tool_call_id=done.calls[0].id)]
    events = list(chat.chat(second, GREEDY, "none", tools=[tool]))
    prefill = next(e for e in events if isinstance(e, Prefill))
    assert chat.prompter.continued and prefill.cached >= tokens - 1 and events[-1].text == "Sunny."


def test_seed_oss_calls_come_through_the_service_after_its_thinking():
    """Seed-OSS's `<seed:tool_call>` through the service: its thinking split off first, the call read by the
    tools' schemas, and the call and result written back through its template into the next prompt."""
    seed = (TEMPLATES / "ByteDance-Seed-OSS.jinja").read_text()
    answer = ("<seed:think>Weather wanted.</seed:think>\n<seed:tool_call>\n<function=get_weather>\n"
              "<parameter=city>75001</parameter>\n</function>\n</seed:tool_call>")
    chat = service(seed, answer)
    first = [Message("user", "Weather in Paris?")]
    done = list(chat.chat(first, GREEDY, "none", tools=[WEATHER]))[-1]
    assert [(c.name, json.loads(c.arguments)) for c in done.calls] == [("get_weather", {"city": "75001"})]
    assert (done.thinking, done.reason) == ("Weather wanted.", "tool_calls")
    chat.target.answer = "Sunny."
    second = [*first, Message("assistant", done.text, tool_calls=done.calls),
              Message("tool", "sunny", tool_call_id=done.calls[0].id)]
    events = list(chat.chat(second, GREEDY, "none", tools=[WEATHER]))
    assert "<parameter=city>75001</parameter>" in bytes(t for t in chat.last_prompt if t < 256).decode()
    assert events[-1].text == "Sunny."


def test_qwen3_coder_calls_without_their_opening_tag_come_through_the_service():
    coder = (TEMPLATES / "Qwen3-Coder.jinja").read_text()
    answer = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
    done = list(service(coder, answer).chat([Message("user", "Weather?")], GREEDY, "none", tools=[WEATHER]))[-1]
    assert [(c.name, json.loads(c.arguments)) for c in done.calls] == [("get_weather", {"city": "Paris"})]
    assert (done.text, done.reason) == ("", "tool_calls")
