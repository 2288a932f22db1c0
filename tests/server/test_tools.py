"""Tool calls through `specchat serve`, with the official `openai` client, over the real server stack (routes,
worker, conversation service, engine) on a fake model that answers chosen text: Qwen2.5 Coder's own template
(the default target's), a model that writes `<tool_call>` answers. No weights: what the server makes of calls."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
from fakes.model import TEMPLATE, AnsweringModel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import Server, in_thread

from specchat.llama.template import ChatTemplate, Message, ToolCall
from specchat.service import costs
from specchat.service.chat import ChatService
from specchat.service.pair import LoadedPair

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

QWEN = (Path(__file__).parent.parent / "templates" / "Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja").read_text()
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
PLAIN = {"guesser": "none"}  # the fake's answers are chosen: nothing to gain from guessing, and no cost curve


@pytest.fixture(autouse=True, scope="module")
def _turns_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The service takes the machine's answering turn before each answer: these fakes take one of their own,
    so that a real model answering elsewhere on the machine neither waits for them nor makes them wait."""
    patch = pytest.MonkeyPatch()
    patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    patch.setattr(costs, "_turns", None)
    yield
    patch.undo()


class Fake:
    def __init__(self, server: Server, model: AnsweringModel, service: ChatService) -> None:
        self.server, self.model, self.service = server, model, service

    def client(self) -> Any:
        return self.server.client(timeout=30)

    def ask(self, answer: str, messages: list[dict[str, Any]] = ASK, **kw: Any) -> Any:
        self.model.answer = answer
        return self.client().chat.completions.create(model="fake", messages=messages, extra_body=PLAIN, **kw)

    def prompt(self) -> str:
        """The prompt the last answer was given, as the template rendered it."""
        return b"".join(self.model.piece(t, special=True) for t in self.service.last_prompt).decode()


@contextmanager
def running(template: str) -> Iterator[Fake]:
    model = AnsweringModel(template=template, name="fake-qwen")
    service = ChatService(LoadedPair(model, None))
    with in_thread(service) as server:
        yield Fake(server, model, service)


@pytest.fixture(scope="module")
def fake() -> Iterator[Fake]:
    with running(QWEN) as f:
        yield f


def _one_line_400(fake: Fake, body: dict[str, Any]) -> str:
    status, _, answer = fake.server.post("/v1/chat/completions", body, auth=False)
    assert status == 400, answer
    err = answer["error"]
    assert set(answer) == {"error"} and err["type"] == "invalid_request_error", answer
    assert err["message"] and "\n" not in err["message"] and "Traceback" not in err["message"], err
    return err["message"]


# --- calls out ---------------------------------------------------------------------------------------


def test_a_call_comes_back_as_tool_calls_with_json_arguments_and_finish_reason_tool_calls(fake):
    r = fake.ask(CALL, tools=[WEATHER])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None  # the answer was the call and nothing else
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The tools reached the prompt as the template writes them (its system prompt lists them in <tools>).
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in fake.prompt()


@pytest.mark.parametrize("answer", [CALL, "Let me look.\n" + CALL, CALL.removesuffix("\n</tool_call>")],
                         ids=["a call", "text then a call", "a call the answer's end closes"])
def test_the_streamed_deltas_assemble_in_the_client_to_the_same_call(fake, answer):
    whole = fake.ask(answer, tools=[WEATHER]).choices[0]
    fake.model.answer = answer
    with fake.client().chat.completions.stream(model="fake", messages=ASK, tools=[WEATHER],
                                               extra_body=PLAIN) as stream:
        chunks = [e.chunk for e in stream if e.type == "chunk"]
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == whole.finish_reason == "tool_calls"
    assert (streamed.message.content or None) == whole.message.content
    [a], [b] = whole.message.tool_calls, streamed.message.tool_calls
    assert (a.type, a.function.name, a.function.arguments) == (b.type, b.function.name, b.function.arguments)
    assert b.id  # each answer makes its own ids
    # Each call came whole, in one delta, with its index, and no delta carried any of the call's text.
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert sum(bool(d.tool_calls) for d in deltas) == 1
    assert "tool_call>" not in "".join(d.content or "" for d in deltas)


def test_a_call_is_streamed_as_soon_as_it_is_finished(fake):
    fake.model.answer = CALL + "\nThat is all."
    chunks = list(fake.client().chat.completions.create(model="fake", messages=ASK, tools=[WEATHER], stream=True,
                                                        extra_body=PLAIN))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    called = next(i for i, d in enumerate(deltas) if d.tool_calls)
    said = next(i for i, d in enumerate(deltas) if (d.content or "").strip())
    assert called < said  # before the text the answer wrote after it
    assert "".join(d.content or "" for d in deltas) == "\nThat is all."


def test_parallel_tool_calls_false_keeps_the_first_call_only(fake):
    two = CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    both = fake.ask(two, tools=[WEATHER, TIME]).choices[0].message.tool_calls
    assert [c.function.name for c in both] == ["get_weather", "get_time"]
    first = fake.ask(two, tools=[WEATHER, TIME], parallel_tool_calls=False).choices[0]
    assert [c.function.name for c in first.message.tool_calls] == ["get_weather"]
    assert first.finish_reason == "tool_calls"
    fake.model.answer = two
    for parallel, names in ((True, ["get_weather", "get_time"]), (False, ["get_weather"])):
        with fake.client().chat.completions.stream(model="fake", messages=ASK, tools=[WEATHER, TIME],
                                                   parallel_tool_calls=parallel, extra_body=PLAIN) as stream:
            streamed = stream.get_final_completion().choices[0]
        assert [c.function.name for c in streamed.message.tool_calls] == names
        assert [json.loads(c.function.arguments) for c in streamed.message.tool_calls] == [{"city": "Paris"}, {}][:len(names)]


def test_tool_choice_none_renders_the_tools_but_reads_no_calls(fake):
    # As llama-server: the template still lists the tools; the answer's text is all content.
    r = fake.ask(CALL, tools=[WEATHER], tool_choice="none").choices[0]
    assert r.message.content == CALL and not r.message.tool_calls and r.finish_reason == "stop"
    assert "<tools>" in fake.prompt()


def test_required_and_named_choices_reach_the_grammar_and_are_answered(fake, monkeypatch):
    # The grammar itself runs on real vocabularies (tests/decoding/test_constraint_real.py): here, what the server
    # asks of it, and that the call the model makes comes back.
    import specchat.service.chat as chat

    asked = []
    monkeypatch.setattr(chat, "tool_constraint", lambda tools, choice, fmt, model, parallel: asked.append(
        ([t["function"]["name"] for t in tools], choice, fmt.name, parallel)))
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice, parallel in (("required", None), ("required", True), (named, False)):
        r = fake.ask(CALL, tools=[WEATHER], tool_choice=choice,
                     **({} if parallel is None else {"parallel_tool_calls": parallel})).choices[0]
        assert r.finish_reason == "tool_calls" and r.message.tool_calls[0].function.name == "get_weather"
    # One call unless parallel calls are asked for, as llama-server: the default pair, let to go on, calls again.
    assert asked == [(["get_weather"], "required", "hermes", False), (["get_weather"], "required", "hermes", True),
                     (["get_weather"], named, "hermes", False)]


# --- results back ------------------------------------------------------------------------------------


def test_a_tool_result_sent_back_reaches_the_prompt_as_the_template_writes_it(fake):
    called = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_abc123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    result = {"role": "tool", "tool_call_id": "call_abc123", "content": "18 degrees and sunny"}
    r = fake.ask("It is 18 degrees and sunny in Paris.", [*ASK, called, result], tools=[WEATHER]).choices[0]
    assert r.message.content == "It is 18 degrees and sunny in Paris." and r.finish_reason == "stop"
    prompt = fake.prompt()
    assert ("<|im_start|>assistant\n" + CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 degrees and sunny\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n") in prompt, prompt[-400:]
    # The same conversation, rendered here from the messages it stands for: the server lost nothing.
    expected = ChatTemplate(QWEN, "qwen").render([
        Message("user", ASK[0]["content"]),
        Message("assistant", "", tool_calls=(ToolCall("get_weather", '{"city": "Paris"}', "call_abc123"),)),
        Message("tool", "18 degrees and sunny", tool_call_id="call_abc123")], tools=[WEATHER])
    assert prompt == expected


def test_a_result_reaches_the_template_with_its_call_id():
    # Mistral Nemo's template writes each result with the id of the call it answers.
    nemo = (Path(__file__).parent.parent / "templates" / "mistralai-Mistral-Nemo-Instruct-2407.jinja").read_text()
    called = {"role": "assistant", "content": None, "tool_calls": [{
        "id": "abcDEF123", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    result = {"role": "tool", "tool_call_id": "abcDEF123", "content": "rain"}
    with running(nemo) as server:
        assert server.ask("It rains.", [*ASK, called, result], tools=[WEATHER]).choices[0].message.content == "It rains."
        assert '[TOOL_RESULTS]{"content": rain, "call_id": "abcDEF123"}[/TOOL_RESULTS]' in server.prompt()


def test_an_assistant_message_of_calls_alone_and_arguments_as_an_object_are_taken(fake):
    called = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                   "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "rain"}]}
    status, _, answer = fake.server.post("/v1/chat/completions", {
        "messages": [*ASK, called, result], "tools": [WEATHER], **PLAIN}, auth=False)
    assert status == 200, answer
    assert CALL in fake.prompt() and "<tool_response>\nrain\n</tool_response>" in fake.prompt()


BAD = [
    ("a tool message without tool_call_id", [*ASK, {"role": "tool", "content": "x"}], {}, "tool_call_id"),
    ("a result for a call never made", [*ASK, {"role": "tool", "tool_call_id": "nope", "content": "x"}], {},
     "'nope', which no earlier assistant message made"),
    ("calls on a user message", [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}], {}, "only an assistant"),
    ("arguments that are not JSON", [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{city: Paris"}}]}], {}, "JSON text"),
    ("a call without a name", [*ASK, {"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"arguments": "{}"}}]}], {}, "name"),
    ("a user message without content", [{"role": "user"}], {}, "content is missing"),
    ("a tool_call_id on a user message", [{"role": "user", "content": "x", "tool_call_id": "c"}], {}, "only a tool"),
    ("a named function not among the tools", ASK, {"tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "get_time"}}}, "'get_time', which is not among the tools"),
    ("a required call with no tools", ASK, {"tool_choice": "required"}, "no tools were given"),
    ("an unknown tool_choice", ASK, {"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ("a tool that is not a function", ASK, {"tools": [{"type": "retrieval"}]}, "tools.0"),
]


@pytest.mark.parametrize("what, messages, extra, words", BAD, ids=[b[0] for b in BAD])
def test_bad_tool_messages_and_fields_get_a_one_line_400(fake, what, messages, extra, words):
    message = _one_line_400(fake, {"messages": messages, **extra, **PLAIN})
    assert words in message, message


# --- what is not a call ------------------------------------------------------------------------------


def test_malformed_call_text_comes_back_as_content_with_a_notice(fake):
    broken = CALL.replace("}}", "}")  # the call's JSON never closes before </tool_call>
    r = fake.ask(broken, tools=[WEATHER])
    assert r.choices[0].message.content == broken and not r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "stop"
    [notice] = r.model_extra["notices"]
    assert notice.startswith("malformed tool call (not JSON") and "kept as the answer's" in notice
    fake.model.answer = broken
    chunks = list(fake.client().chat.completions.create(model="fake", messages=ASK, tools=[WEATHER], stream=True,
                                                        extra_body=PLAIN))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == broken
    last = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(last) == 1 and last[0].model_extra["notices"] == [notice]
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_a_request_without_tools_is_answered_as_before(fake):
    # The same text a call would be: with no tools asked for, it is the answer's content, as it always was.
    r = fake.ask(CALL)
    assert r.choices[0].message.content == CALL and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.tool_calls is None and "notices" not in r.model_extra
    assert fake.prompt() == ChatTemplate(QWEN, "qwen").render([Message("user", ASK[0]["content"])])
    status, _, raw = fake.server.post("/v1/chat/completions", {"messages": ASK, **PLAIN}, auth=False)
    assert status == 200 and set(raw["choices"][0]["message"]) == {"role", "content"}, raw
    fake.model.answer = CALL
    chunks = list(fake.client().chat.completions.create(model="fake", messages=ASK, stream=True, extra_body=PLAIN))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CALL
    assert not any(c.choices[0].delta.tool_calls for c in chunks if c.choices)


def test_tools_with_a_template_that_writes_no_calls_get_a_one_line_400():
    with running(TEMPLATE) as server:  # plain ChatML: no tools, no calls
        message = _one_line_400(server, {"messages": ASK, "tools": [WEATHER], **PLAIN})
        assert message.startswith("tools are not supported with fake-qwen.gguf"), message
        stream = _one_line_400(server, {"messages": ASK, "tools": [WEATHER], "stream": True, **PLAIN})
        assert stream == message
        # ... and without tools it answers as ever.
        assert server.ask("Hi.").choices[0].message.content == "Hi."


# --- property tests ----------------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["type", "function", "name", "arguments", "id", "parameters", "content"]) |
                        st.text(max_size=6), inner, max_size=4),
                    max_leaves=10)
TOOL_FIELDS = ["tools", "tool_choice", "parallel_tool_calls", "calls", "tool_call_id", "result"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(TOOL_FIELDS), value=JSON, stream=st.booleans())
def test_random_tool_fields_get_an_answer_or_a_400_never_a_failure(fake, field, value, stream):
    """A good request with tools and a result sent back, one of its tool fields replaced by random JSON."""
    called = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "rain"}
    body: dict[str, Any] = {"tools": [WEATHER], "tool_choice": "auto", "stream": stream, **PLAIN}
    if field == "calls":
        called["tool_calls"] = value
    elif field == "tool_call_id":
        result["tool_call_id"] = value
    elif field == "result":
        result["content"] = value
    else:
        body[field] = value
    fake.model.answer = CALL
    failed = fake.server.health()["failed"]
    status, headers, answer = fake.server.request("POST", "/v1/chat/completions", json.dumps(
        body | {"messages": [*ASK, called, result]}).encode(), {"Content-Type": "application/json"}, auth=False)
    assert status in (200, 400), answer[:300]
    if status == 400:
        err = json.loads(answer)["error"]
        assert err["message"] and "\n" not in err["message"], err
    elif not stream:
        message = json.loads(answer)["choices"][0]["message"]
        assert message.get("tool_calls") or message["content"] == CALL  # a call, or no tools (or "none"): text
    else:
        assert answer.rstrip().endswith(b"data: [DONE]"), answer[-300:]
    assert fake.server.health()["failed"] == failed
