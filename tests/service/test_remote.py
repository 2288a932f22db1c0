"""The app on a remote engine: RemoteBackend and `specchat --server` against a small OpenAI-compatible
server started on 127.0.0.1 by each test (tests/helpers/fakes/openai_server.py), through the official openai client."""

from __future__ import annotations

import json
import sqlite3
import sys
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from fakes import FakeBackend
from fakes.openai_server import ACCEPTED, DRAFTED, FakeServer, free_port, serving
from pilot import answered, send, until
from textual.widgets import OptionList

from specchat import cli
from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Prefill, Step
from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.mcptools.agent import Added, Choice, agent_loop
from specchat.mcptools.results import ToolResult
from specchat.service.choices import RemoteChoice
from specchat.service.events import Chunk
from specchat.service.local import open_backend
from specchat.service.remote import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    METRICS,
    STREAM,
    TIMINGS,
    RemoteBackend,
    base_urls,
    spec_counters,
    stats_from_timings,
)
from specchat.service.settings import load_settings
from specchat.store.conversations import MIGRATIONS, Store
from specchat.ui.app import SpecchatApp
from specchat.ui.screens import ErrorScreen
from specchat.ui.widgets import MessageView, StatsPanel

ANSWER = FakeServer().answer
N_WORDS = len(ANSWER.split(" "))  # the fake server streams one word a chunk, and counts a word a token


def loaded(url: str, api_key: str | None = None, model: str | None = None) -> RemoteBackend:
    backend = RemoteBackend(RemoteChoice(url, api_key, model))
    backend.load(lambda what, done, total: None)
    return backend


def generate(backend: RemoteBackend, cancel: threading.Event | None = None) -> list:
    return list(backend.chat([Message("user", "Say hello")], GenerationConfig(), "auto", cancel or threading.Event()))


def error_of(url: str, api_key: str | None = None, model: str | None = None) -> str:
    with pytest.raises(SpecchatError) as e:
        loaded(url, api_key, model)
    return str(e.value)


def panel(app) -> str:
    return str(app.chat.query_one(StatsPanel).query_one("#numbers").render())


# --- the figures, as pure functions ---------------------------------------------------------------


def test_tokens_per_step_from_timings_counts_one_target_token_per_step():
    # 40 tokens, of which 30 were accepted drafts: 10 steps, each its own token plus 3 drafts.
    stats = stats_from_timings({"prompt_n": 5, "prompt_ms": 20.0, "cache_n": 7, "predicted_n": 40,
                                "predicted_ms": 500.0, "draft_n": 36, "draft_n_accepted": 30}, stream_s=0.6)
    assert (stats.n_tokens, stats.steps, stats.tokens_per_step) == (40, 10, 4.0)
    assert (stats.drafted, stats.accepted) == (36, 30) and stats.acceptance == pytest.approx(30 / 36)
    assert stats.tokens_per_s == pytest.approx(80.0)  # the server's predicted_per_second
    assert (stats.n_prompt, stats.cached, stats.prefill_s) == (12, 7, pytest.approx(0.02))


def test_timings_without_drafting_are_plain_steps():
    stats = stats_from_timings({"prompt_n": 3, "prompt_ms": 1.0, "predicted_n": 8, "predicted_ms": 100.0}, 0.1)
    assert (stats.steps, stats.drafted, stats.tokens_per_step) == (8, 0, 1.0)


def test_vllm_counters_are_summed_over_their_labels_and_other_metrics_ignored():
    page = ("# TYPE vllm:spec_decode_num_draft_tokens counter\n"
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0\n'
            'vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 12.0\n'
            "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="m"} 1.0\n')
    assert spec_counters(page) == {DRAFT_TOKENS: 42.0, ACCEPTED_TOKENS: 20.0}
    assert spec_counters("<html>not a metrics page</html>") == {}


@pytest.mark.parametrize("given, root", [
    ("http://gpu-box:8080", "http://gpu-box:8080"),
    ("http://gpu-box:8080/", "http://gpu-box:8080"),
    ("http://gpu-box:8080/v1", "http://gpu-box:8080"),
    ("https://example.org/llm/v1/", "https://example.org/llm"),
])
def test_the_api_base_is_the_root_plus_v1_however_the_url_is_given(given, root):
    assert base_urls(given) == (root, root + "/v1")


@pytest.mark.parametrize("bad", ["gpu-box:8080", "ftp://gpu-box", "http://", "http://host:port"])
def test_a_malformed_server_url_is_one_line(bad):
    with pytest.raises(SpecchatError) as e:
        base_urls(bad)
    assert "\n" not in str(e.value) and repr(bad) in str(e.value)


# --- the backend against the three kinds of server ---------------------------------------------------


def test_llama_server_timings_become_the_answers_stats():
    with serving(FakeServer(kind="timings")) as server:
        backend = loaded(server.url)
        assert backend.name == f"fake-target @ {server.url.removeprefix('http://')}"
        assert backend.n_ctx == 8192  # llama-server's meta.n_ctx_train
        events = generate(backend)
    assert isinstance(events[0], Prefill)
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert "".join(c.text for c in chunks) == ANSWER and len(chunks) == N_WORDS
    assert not any(isinstance(e, Step) for e in events)  # a server's steps are its own to count
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "eog" and done.text == ANSWER
    assert done.figures == TIMINGS
    s = done.stats
    assert (s.drafted, s.accepted, s.n_tokens, s.steps) == (DRAFTED, ACCEPTED, N_WORDS, N_WORDS - ACCEPTED)
    assert s.tokens_per_s == pytest.approx(N_WORDS / 0.25)  # the server's own decode time
    assert (s.n_prompt, s.cached) == (12, 2)
    request = server.requests[-1]
    assert request["stream"] is True and request["model"] == "fake-target"
    assert request["messages"] == [{"role": "user", "content": "Say hello"}]


def test_a_servers_reasoning_content_is_thinking_and_the_switch_and_past_thinking_reach_it():
    thought = "They want a greeting, so greet."
    with serving(FakeServer(thinking=thought)) as server:
        backend = loaded(server.url)
        assert backend.thinking_switch == "enable_thinking"
        history = [Message("user", "Hi"), Message("assistant", "Hello.", "A greeting back."), Message("user", "Again")]
        events = list(backend.chat(history, GenerationConfig(), "auto", threading.Event(), think=False))
    chunks = [e for e in events if isinstance(e, Chunk)]
    assert "".join(c.thinking for c in chunks).strip() == thought and "".join(c.text for c in chunks) == ANSWER
    assert (events[-1].text, events[-1].thinking) == (ANSWER, thought)
    request = server.requests[-1]
    assert request["chat_template_kwargs"] == {"enable_thinking": False}
    assert request["messages"][1] == {"role": "assistant", "content": "Hello.", "reasoning_content": "A greeting back."}


def test_calls_made_with_this_machines_models_reach_a_server_as_openai_writes_them():
    """A conversation that used tools here, then answered by a server: the answer's calls and their results go as
    OpenAI's API has them (a `tool` message without its call is refused by such servers)."""
    call = ToolCall("read_note", '{"name": "launch"}', "call_1")
    history = [Message("user", "Read my note"), Message("assistant", "", tool_calls=(call,)),
               Message("tool", "Thursday at 10:30", tool_call_id="call_1"), Message("user", "And where?")]
    with serving(FakeServer()) as server:
        list(loaded(server.url).chat(history, GenerationConfig(), "auto", threading.Event()))
    sent = server.requests[-1]["messages"]
    assert sent[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read_note", "arguments": '{"name": "launch"}'}}]}
    assert sent[2] == {"role": "tool", "content": "Thursday at 10:30", "tool_call_id": "call_1"}


# --- tools: offered as OpenAI's, the calls streamed back in pieces -----------------------------------

NOTE = {"type": "function", "function": {"name": "read_note", "description": "A note by its name.",
                                         "parameters": {"type": "object", "properties": {"name": {"type": "string"}}}}}
READ = {"id": "call_a", "name": "read_note", "arguments": '{"name": "launch", "lines": [1, 2, 3]}'}


def with_tools(backend: RemoteBackend, tool_choice: str = "auto", cancel: threading.Event | None = None,
               history: list[Message] | None = None) -> list:
    return list(backend.chat(history or [Message("user", "Read my note")], GenerationConfig(), "auto",
                             cancel or threading.Event(), tools=[NOTE], tool_choice=tool_choice))


def test_streamed_tool_calls_are_assembled_into_calls_with_ids_names_and_json_arguments():
    """llama-server streams a call's id and name first, then its arguments a few characters a piece, by index;
    a server that gives no id gets one made (the call's result must answer to one)."""
    pid = {"name": "pid", "arguments": "{}"}  # no id
    with serving(FakeServer(answer="Let me look.", calls=[[READ, pid]])) as server:
        events = with_tools(loaded(server.url))
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "tool_calls" and done.text == "Let me look."
    read, made = done.calls
    assert read == ToolCall("read_note", READ["arguments"], "call_a")
    assert json.loads(read.arguments) == {"name": "launch", "lines": [1, 2, 3]}
    assert (made.name, made.arguments) == ("pid", "{}") and len(made.id) == 9 and made.id.isalnum()
    # The calls' pieces are not text: the chunks carry the words alone.
    assert "".join(e.text for e in events if isinstance(e, Chunk)) == "Let me look."
    assert done.figures == TIMINGS
    request = server.requests[-1]
    assert request["tools"] == [NOTE] and request["tool_choice"] == "auto"


def test_tool_choice_reaches_the_server_and_an_answer_without_tools_asks_for_none():
    with serving(FakeServer(calls=[[READ]])) as server:
        backend = loaded(server.url)
        with_tools(backend, "required")
        plain = generate(backend)[-1]
    asked, unasked = server.requests
    assert asked["tool_choice"] == "required" and asked["tools"] == [NOTE]
    assert "tools" not in unasked and "tool_choice" not in unasked and "parallel_tool_calls" not in unasked
    assert plain.reason == "eog" and plain.calls == ()


def test_an_answer_that_is_only_calls_ends_as_one_with_calls_and_the_agent_loop_runs_them():
    """The same Done as this machine's service gives, so the agent loop treats both alike: the call runs, and its
    result goes back to the server as a `tool` message answering the call's id."""
    with serving(FakeServer(answer="", calls=[[READ]])) as server:
        backend = loaded(server.url)
        ran = []

        def answer(conversation, offered):
            return backend.chat(conversation, GenerationConfig(), "auto", threading.Event(),
                                tools=[NOTE] if offered else None)

        def run(name, arguments):
            ran.append((name, arguments))
            server.answer = "On Thursday."  # what the next answer says
            return ToolResult("Thursday at 10:30")

        events = list(agent_loop(answer, [Message("user", "Read my note")], run, lambda call: Choice.ONCE, 2))
    first = events[:next(n for n, e in enumerate(events) if isinstance(e, Done)) + 1]
    assert isinstance(first[0], Prefill) and not any(isinstance(e, Chunk) for e in first)
    assert (first[-1].reason, first[-1].text) == ("tool_calls", "")
    assert first[-1].calls == (ToolCall("read_note", READ["arguments"], "call_a"),)
    assert ran == [("read_note", READ["arguments"])]
    added = [e.message for e in events if isinstance(e, Added)]
    assert [m.role for m in added] == ["assistant", "tool", "assistant"] and added[-1].content == "On Thursday."
    sent = server.requests[-1]["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_a"
    assert sent[-1] == {"role": "tool", "content": "Thursday at 10:30", "tool_call_id": "call_a"}


def test_stopped_in_the_middle_of_a_call_the_answer_keeps_no_call(monkeypatch):
    """Its arguments may be cut short: a stopped answer runs no call, so it keeps none (its words stay)."""
    from specchat.service import remote

    begun = threading.Event()  # the backend has taken the call's first piece
    take = remote._Received.take
    monkeypatch.setattr(remote._Received, "take", lambda got, chunk: (take(got, chunk), got.calls and begun.set())[0])
    with serving(FakeServer(calls=[[READ]], pause_in_call=True)) as server:
        backend = loaded(server.url)
        cancel, events = threading.Event(), []
        worker = threading.Thread(target=lambda: events.extend(with_tools(backend, cancel=cancel)), daemon=True)
        worker.start()
        assert begun.wait(10)
        cancel.set()
        worker.join(5)
        assert not worker.is_alive(), "the generation did not end on cancel"
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "cancelled" and done.calls == () and done.text == ANSWER


@pytest.mark.parametrize("refusal", ["tools param requires --jinja flag",
                                     '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                     "to be set"])
def test_a_server_that_refuses_tools_says_so_in_one_line_and_what_to_do(refusal):
    with serving(FakeServer(refuse_tools=refusal)) as server:
        backend = loaded(server.url)
        with pytest.raises(SpecchatError) as e:
            with_tools(backend)
        assert generate(backend)[-1].text == ANSWER  # without tools it answers as it did
    message = str(e.value)
    assert message.startswith(f"the server at {server.url} does not take tools ({refusal})")
    assert "--jinja" in message and "tools off" in message and "\n" not in message


QWEN = (Path(__file__).parent.parent / "templates" / "Qwen-Qwen2.5-Coder-1.5B-Instruct.jinja").read_text()
SAID = 'Let me look.\n<tool_call>\n{"name": "read_note", "arguments": {"name": "launch"}}\n</tool_call>'


@pytest.fixture
def answering(tmp_path, monkeypatch):
    """specchat serve's own stack (routes, worker, service, engine) in this process, on a fake model that answers
    SAID under a chat template: yields (the service, a backend loaded from it), given the template."""
    pytest.importorskip("fastapi")
    from fakes.model import AnsweringModel
    from serving import in_thread

    from specchat.service import costs
    from specchat.service.chat import ChatService
    from specchat.service.pair import LoadedPair

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # an answering turn of its own (as test_tools)
    monkeypatch.setattr(costs, "_turns", None)

    @contextmanager
    def serve(template: str):
        service = ChatService(LoadedPair(AnsweringModel(SAID, template, name="fake-qwen"), None))
        with in_thread(service) as server:
            yield service, loaded(f"http://127.0.0.1:{server.port}")

    return serve


def test_specchat_serves_calls_end_the_answer_as_this_machines_service_ends_it(answering):
    """The backend's Done for a call specchat serve streams is the one the service gives here for the same answer:
    its text, its call with JSON arguments, reason tool_calls."""
    ask = [Message("user", "Read my note")]
    with answering(QWEN) as (service, backend):
        remote = list(backend.chat(ask, GenerationConfig(), "none", threading.Event(), tools=[NOTE]))[-1]
    local = list(service.chat(ask, GenerationConfig(), "none", tools=[NOTE], tool_choice="auto"))[-1]
    assert (remote.reason, remote.text) == (local.reason, local.text) == ("tool_calls", "Let me look.\n")
    assert [(c.name, json.loads(c.arguments)) for c in remote.calls] == \
        [(c.name, json.loads(c.arguments)) for c in local.calls] == [("read_note", {"name": "launch"})]
    assert remote.calls[0].id and remote.figures == TIMINGS


def test_specchat_serves_refusal_of_tools_for_a_template_without_them_is_one_line(answering):
    from fakes.model import TEMPLATE  # plain ChatML: no tools, no calls

    with answering(TEMPLATE) as (_, backend):
        with pytest.raises(SpecchatError) as e:
            list(backend.chat([Message("user", "Read my note")], GenerationConfig(), "none", threading.Event(),
                              tools=[NOTE]))
    assert str(e.value).startswith(f"the server at {backend.root} does not take tools (tools are not supported "
                                   "with fake-qwen.gguf") and "\n" not in str(e.value)


def test_vllm_metrics_are_read_before_and_after_the_answer():
    with serving(FakeServer(kind="vllm")) as server:
        backend = loaded(server.url)
        assert backend.has_metrics and backend.n_ctx == 2048  # vLLM's max_model_len
        done = generate(backend)[-1]
        again = generate(backend)[-1]
    assert done.figures == again.figures == METRICS
    # The counters started at 1000/700 (earlier traffic): only this answer's growth counts.
    for d in (done, again):
        assert (d.stats.drafted, d.stats.accepted) == (DRAFTED, ACCEPTED)
        assert d.stats.n_tokens == N_WORDS and d.stats.steps == N_WORDS - ACCEPTED


def test_a_server_that_reports_nothing_gives_tokens_per_second_from_the_stream():
    with serving(FakeServer(kind="plain")) as server:
        backend = loaded(server.url)
        done = generate(backend)[-1]
    assert done.figures == STREAM and not backend.has_metrics
    assert (done.stats.drafted, done.stats.steps, done.stats.n_tokens) == (0, 0, N_WORDS)
    assert done.stats.tokens_per_s > 0 and done.stats.acceptance == 0.0


def test_sampling_settings_and_the_chosen_model_reach_the_server():
    from specchat.decoding.sampling import SamplingConfig

    with serving(FakeServer()) as server:
        backend = loaded(server.url, model="fake-other")
        config = GenerationConfig(SamplingConfig(0.7, top_k=40, top_p=0.9, min_p=0.05, seed=3), max_tokens=77)
        list(backend.chat([Message("system", "Be brief."), Message("user", "Hi")], config, "auto", threading.Event()))
        # specchat serve takes a guesser and a draft length (other servers ignore the fields).
        list(backend.chat([Message("user", "Hi")], replace(config, draft_length=5), "draft", threading.Event()))
    r, asked = server.requests
    assert r["model"] == "fake-other" and r["max_tokens"] == 77 and r["seed"] == 3
    assert (r["temperature"], r["top_p"], r["top_k"], r["min_p"]) == (0.7, 0.9, 40, 0.05)
    assert [m["role"] for m in r["messages"]] == ["system", "user"]
    assert "guesser" not in r and "draft_length" not in r
    assert (asked["guesser"], asked["draft_length"]) == ("draft", 5)


def test_an_answer_the_server_cut_at_max_tokens_ends_so():
    with serving(FakeServer(finish="length")) as server:
        done = generate(loaded(server.url))[-1]
    assert isinstance(done, Done) and done.reason == "max_tokens" and done.text == ANSWER


def test_cancel_closes_the_stream_while_the_server_is_silent():
    with serving(FakeServer(pause_after=3)) as server:
        backend = loaded(server.url)
        cancel, events = threading.Event(), []
        worker = threading.Thread(target=lambda: events.extend(generate(backend, cancel)), daemon=True)
        worker.start()
        assert server.paused.wait(10)
        cancel.set()
        worker.join(5)  # the server would stay silent for 10 s: only closing the stream ends this in time
        assert not worker.is_alive(), "the generation did not end on cancel"
        assert server.disconnected.wait(5), "the server never saw the client go"
    done = events[-1]
    assert isinstance(done, Done) and done.reason == "cancelled"


# --- errors: one line each ---------------------------------------------------------------------------


def test_connection_refused_is_one_line():
    url = f"http://127.0.0.1:{free_port()}"
    message = error_of(url)
    assert message.startswith(f"cannot reach a server at {url}") and "\n" not in message


def test_a_connection_dropped_mid_answer_is_one_line_after_the_text_before_it():
    with serving(FakeServer(break_after=3)) as server:
        backend = loaded(server.url)
        events = []
        with pytest.raises(SpecchatError) as e:
            for event in backend.chat([Message("user", "Say hello")], GenerationConfig(), "auto", threading.Event()):
                events.append(event)
    assert "\n" not in str(e.value) and server.url in str(e.value)
    # The server was reached and then lost: said so, not as a server that was never there.
    assert "dropped in the middle of the answer" in str(e.value) and "cannot reach" not in str(e.value), e.value
    assert "".join(c.text for c in events if isinstance(c, Chunk)) == "".join(server.words()[:3])


def test_a_wrong_or_missing_api_key_is_one_line_saying_how_to_give_it():
    with serving(FakeServer(api_key="sesame")) as server:
        for key in (None, "wrong"):
            message = error_of(server.url, api_key=key)
            assert "refused the API key (401)" in message and "--api-key" in message and "SPECCHAT_API_KEY" in message
            assert "\n" not in message and "sesame" not in message
        assert loaded(server.url, api_key="sesame").model == "fake-target"


def test_a_model_the_server_does_not_have_names_the_ones_it_has():
    with serving(FakeServer()) as server:
        message = error_of(server.url, model="gpt-9")
    assert message == (f"the server at {server.url} has no model 'gpt-9'; it has fake-target, fake-other "
                       "(choose one with --model)")


def test_a_url_that_is_not_an_openai_server_is_one_line():
    with serving(FakeServer()) as server:
        message = error_of(server.url + "/not/here")
    assert "answered 404" in message and "base URL" in message and "\n" not in message


# --- the app -----------------------------------------------------------------------------------------


def remote_app(tmp_path: Path, url: str, api_key: str | None = None, model: str | None = None, **kwargs):
    # The app's own factory, which makes a remote backend for the server it is given: a local choice
    # fails the test (this machine's models must not be touched).
    def factory(choice):
        assert isinstance(choice, RemoteChoice), choice
        return open_backend(choice)

    return SpecchatApp(backend_factory=factory, store=Store(tmp_path / "chat.db"),
                       settings_path=tmp_path / "config.toml", remote=RemoteChoice(url, api_key, model), **kwargs)


@pytest.mark.parametrize("kind, figures, accept, per_step", [
    ("timings", TIMINGS, f"({ACCEPTED}/{DRAFTED})", f"{N_WORDS / (N_WORDS - ACCEPTED):.2f}"),
    ("vllm", METRICS, f"({ACCEPTED}/{DRAFTED})", f"{N_WORDS / (N_WORDS - ACCEPTED):.2f}"),
    ("plain", STREAM, None, None),
])
async def test_the_panel_shows_the_servers_figures_and_says_which(tmp_path, kind, figures, accept, per_step):
    with serving(FakeServer(kind=kind)) as server:
        app = remote_app(tmp_path, server.url)
        async with app.run_test(size=(140, 40)) as pilot:
            await send(pilot, app, "Say hello")
            await until(pilot, lambda: answered(app), "the answer to be saved")
            numbers = panel(app)
            assert f"figures   {figures}" in numbers
            tok_s = float(numbers.split("tok/s")[1].split()[0])
            assert tok_s > 0
            if accept:
                assert f"accept    {ACCEPTED / DRAFTED:6.0%}  {accept}" in numbers and f"tok/step  {per_step:>6}" in numbers
            else:
                assert "accept         –" in numbers and "tok/step       –" in numbers
            answer = app.store.messages(app.conversation_id)[-1]
            assert answer.content == ANSWER and answer.status == "complete"
            assert answer.stats["guesser"] == figures and figures in answer.stats["summary"]
            assert answer.model == f"fake-target @ {server.url.removeprefix('http://')}"
            assert app.query(MessageView).last().content == ANSWER


async def test_stop_closes_the_stream_and_keeps_the_partial_answer(tmp_path):
    with serving(FakeServer(pause_after=3)) as server:
        app = remote_app(tmp_path, server.url)
        async with app.run_test() as pilot:
            await send(pilot, app, "Tell me more")
            # The pump shows the first chunk at once and holds later ones until the next arrives: the
            # server is silent now, so the view may show only "Hello ".
            await until(pilot, lambda: server.paused.is_set() and app.query(MessageView).last().content,
                        "the first chunk")
            await pilot.press("escape")
            await until(pilot, lambda: answered(app), "the stop")
            assert server.disconnected.wait(5), "the server never saw the stream close"
            answer = app.store.messages(app.conversation_id)[-1]
            assert answer.status == "stopped" and answer.content == "Hello from the "


async def test_the_app_on_a_server_asks_about_its_call_runs_it_and_sends_the_result_back(tmp_path):
    """F5 offers the tools of a real MCP server (tests/helpers/mcp_servers.py) to a server's model; the call it streams is
    asked about, run, stored and sent back as a `tool` message answering the call's id."""
    pytest.importorskip("mcp", reason="the tools extra (pip install -e '.[tools]') is not installed")
    from apptools import asked, choose_all_tools, toolbox

    echo = {"id": "call_1", "name": "echo", "arguments": '{"text": "saffron and eggs"}'}
    with serving(FakeServer(answer="Echo says saffron and eggs.", calls=[[echo]])) as server:
        app = remote_app(tmp_path, server.url, toolbox_factory=toolbox)
        async with app.run_test(size=(140, 50)) as pilot:
            await choose_all_tools(pilot, app)
            await send(pilot, app, "What does echo say?")
            question = await asked(pilot, app)
            assert question.call == ToolCall("echo", echo["arguments"], "call_1")
            await pilot.press("y")
            await until(pilot, lambda: answered(app) and len(server.requests) == 2, "the answer after the call",
                        timeout=60)
            stored = app.chat.conversation.messages()
            assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
            assert stored[1].tool_calls == ({"id": "call_1", "name": "echo", "arguments": echo["arguments"]},)
            assert (stored[2].content, stored[2].tool_call_id) == ("saffron and eggs", "call_1")
            assert stored[3].content == "Echo says saffron and eggs." and stored[3].status == "complete"
    asking, answering = server.requests
    assert "echo" in [t["function"]["name"] for t in asking["tools"]] and asking["tool_choice"] == "auto"
    assert answering["messages"][-2]["tool_calls"][0]["id"] == "call_1"
    assert answering["messages"][-1] == {"role": "tool", "content": "saffron and eggs", "tool_call_id": "call_1"}


async def test_the_app_on_a_server_that_refuses_tools_says_so_in_one_line_and_keeps_the_conversation(tmp_path):
    pytest.importorskip("mcp", reason="the tools extra (pip install -e '.[tools]') is not installed")
    from apptools import choose_all_tools, toolbox

    with serving(FakeServer(refuse_tools="tools param requires --jinja flag")) as server:
        app = remote_app(tmp_path, server.url, toolbox_factory=toolbox)
        async with app.run_test(size=(140, 50)) as pilot:
            await choose_all_tools(pilot, app)
            await send(pilot, app, "What does echo say?")
            await until(pilot, lambda: isinstance(app.screen, ErrorScreen), "the error screen")
            message = app.screen.message
            assert "does not take tools" in message and "--jinja" in message and "\n" not in message
            assert [m.role for m in app.chat.conversation.messages()] == ["user"] and not app.generating


async def test_regenerate_and_the_conversation_marker(tmp_path):
    with serving(FakeServer()) as server:
        app = remote_app(tmp_path, server.url)
        async with app.run_test(size=(140, 40)) as pilot:
            await send(pilot, app, "Say hello")
            await until(pilot, lambda: answered(app), "the answer")
            await pilot.press("ctrl+r")
            await until(pilot, lambda: len(server.requests) == 2 and answered(app), "the regenerated answer")
            assert [m.role for m in app.store.messages(app.conversation_id)] == ["user", "assistant"]
            conversation = app.store.conversations()[0]
            assert conversation.server == server.url
            assert app.chat.sub_title == f"answered by {server.url}"
            label = str(app.chat.query_one("#conversations", OptionList).get_option_at_index(0).prompt)
            assert "⇄ " + server.url.removeprefix("http://") in label
            assert f"Answered by the server at {server.url}" in app.store.export_markdown(conversation.id)


@pytest.mark.parametrize("case", ["refused", "401", "unknown model"])
async def test_a_server_problem_is_one_line_on_the_error_screen(tmp_path, case):
    with serving(FakeServer(api_key="sesame")) as server:
        url = f"http://127.0.0.1:{free_port()}" if case == "refused" else server.url
        app = remote_app(tmp_path, url, "sesame" if case == "unknown model" else None,
                         "nope" if case == "unknown model" else None)
        async with app.run_test() as pilot:
            await until(pilot, lambda: isinstance(app.screen, ErrorScreen), "the error screen")
            message = app.screen.message
            assert "\n" not in message and "Traceback" not in message
            expected = {"refused": "cannot reach a server", "401": "refused the API key (401)",
                        "unknown model": "has no model 'nope'"}[case]
            assert expected in message
            assert not app.ready


async def test_settings_switch_between_this_machine_and_a_server(tmp_path):
    local = FakeBackend()
    with serving(FakeServer(api_key="sesame")) as server:
        app = SpecchatApp(backend_factory=lambda choice: open_backend(choice) if isinstance(choice, RemoteChoice)
                          else local, store=Store(tmp_path / "chat.db"), settings_path=tmp_path / "config.toml",
                          api_key="sesame")
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.ready, "the local models")
            assert app.backend is local
            app.apply_settings(replace(app.settings, server=server.url))
            await until(pilot, lambda: app.ready and isinstance(app.backend, RemoteBackend), "the remote backend")
            assert local.closed  # the local models were freed for the switch
            await send(pilot, app, "Say hello")
            await until(pilot, lambda: answered(app), "the remote answer")
            assert app.store.messages(app.conversation_id)[-1].content == ANSWER
            text = (tmp_path / "config.toml").read_text()
            assert server.url in text and "sesame" not in text  # the key is never written
            assert load_settings(tmp_path / "config.toml")[0].server == server.url
            app.apply_settings(replace(app.settings, server=""))
            await until(pilot, lambda: app.ready and app.backend is local, "the local models again")


async def test_the_command_lines_server_wins_until_the_setting_changes(tmp_path):
    with serving(FakeServer()) as one, serving(FakeServer(models=("other-model",))) as two:
        (tmp_path / "config.toml").write_text(f'server = "{two.url}"\n')
        app = remote_app(tmp_path, one.url)
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.ready, "the server from the command line")
            assert app.backend.root == one.url
            app.apply_settings(replace(app.settings, server=two.url + "/v1"))
            await until(pilot, lambda: app.ready and app.backend.root == two.url, "the server from the settings")
            assert app.backend.model == "other-model"


def test_an_old_database_gains_the_server_marker_and_keeps_its_conversations(tmp_path):
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:3]:  # the schema before the marker
        for statement in step if isinstance(step, tuple) else filter(str.strip, step.split(";")):
            db.execute(statement)
    db.execute("PRAGMA user_version = 3")
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('from before', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) VALUES (1, 'user', 'old words', 1)")
    db.close()
    store = Store(path)
    assert store.version == len(MIGRATIONS) >= 4
    (old,) = store.conversations()
    assert (old.title, old.server) == ("from before", None)
    assert [m.content for m in store.messages(old.id)] == ["old words"]
    assert [c.id for c in store.search("words")] == [old.id]
    store.set_server(old.id, "http://gpu-box:8080")
    assert store.conversations()[0].server == "http://gpu-box:8080"
    assert "server at http://gpu-box:8080" in store.export_markdown(old.id)


# --- the command line ---------------------------------------------------------------------------------


def test_without_the_extra_server_says_how_to_install_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "openai", None)  # `import openai` now fails as if not installed
    assert cli.main(["--server", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "specchat: error: --server needs the openai package: pip install 'specchat[remote]'"


def test_the_api_key_comes_from_the_option_or_the_environment(monkeypatch):
    from specchat.ui.app import SpecchatApp

    opened = []
    monkeypatch.setattr(SpecchatApp, "run", lambda self: opened.append((self.remote, self.api_key)))
    monkeypatch.setenv("SPECCHAT_API_KEY", "from-env")
    assert cli.main(["--server", "http://gpu-box:8080", "--model", "m"]) == 0
    assert cli.main(["chat", "--server", "http://gpu-box:8080", "--api-key", "given"]) == 0
    assert cli.main([]) == 0  # no --server: this machine's models, the key kept for a server setting
    assert opened == [(RemoteChoice("http://gpu-box:8080", "from-env", "m"), "from-env"),
                      (RemoteChoice("http://gpu-box:8080", "given", None), "given"),
                      (None, "from-env")]


# --- against a live `specchat serve` (real models) ---------------------------------------------------

REAL_TIMEOUT_S = 300.0  # loading the pair, measuring its cost curve once, and answering, on 2 cores


@pytest.fixture
def live_server():
    """`specchat serve` on smollm2-self (the draft guesser asked for, so that acceptance shows on a CPU)."""
    pytest.importorskip("fastapi")
    from serving import serving as specchat_serve

    with specchat_serve("--ctx", "1024") as server:
        yield f"http://127.0.0.1:{server.port}"
    assert "Traceback" not in "".join(server.stderr), "".join(server.stderr)


@pytest.mark.real
async def test_the_app_on_a_live_specchat_serve_shows_its_acceptance(tmp_path, live_server):
    (tmp_path / "config.toml").write_text('guesser = "draft"\nmax_tokens = 48\n')
    app = remote_app(tmp_path, live_server)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: app.ready, "the server's models", timeout=REAL_TIMEOUT_S)
        assert isinstance(app.backend, RemoteBackend) and "smollm2" in app.backend.name.lower()
        await send(pilot, app, "Count from one to twenty in words.")
        await until(pilot, lambda: answered(app), "the answer", timeout=REAL_TIMEOUT_S)
        numbers = panel(app)
        assert f"figures   {TIMINGS}" in numbers, numbers
        accepted, drafted = map(int, numbers.split("accept")[1].split("(")[1].split(")")[0].split("/"))
        assert drafted > 0 and accepted > 0, numbers  # SmolLM2 drafting for itself: most guesses land
        answer = app.store.messages(app.conversation_id)[-1]
        assert answer.status == "complete" and answer.content.strip()
        assert answer.stats["guesser"] == TIMINGS and answer.stats["acceptance"] > 0
        assert app.store.conversations()[0].server == live_server


@pytest.mark.real
@pytest.mark.skipif(__import__("shutil").which("tmux") is None, reason="needs tmux")
def test_specchat_server_in_a_real_terminal(tmp_path, live_server):
    import os
    import re
    import subprocess

    from terminal import launch, tmux, wait_for

    session = f"specchat-remote-{os.getpid()}"
    launch(session, tmp_path, 'guesser = "draft"\nmax_tokens = 48\n', "--server", live_server)
    try:
        wait_for(session, r"ready · guesser draft \(asked\)", timeout=REAL_TIMEOUT_S)
        tmux("send-keys", "-t", session, "-l", "Count from one to twenty in words.")
        tmux("send-keys", "-t", session, "Enter")
        text = wait_for(session, r"done · figures: server timings", timeout=REAL_TIMEOUT_S)
        assert "figures   server timings" in text, text
        accept = re.search(r"accept\s+(\d+)%\s+\((\d+)/(\d+)\)", text)
        assert accept and int(accept.group(2)) > 0, text
        tmux("send-keys", "-t", session, "C-q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True)
    db = sqlite3.connect(tmp_path / "data" / "specchat" / "specchat.db")
    assert db.execute("SELECT server FROM conversations").fetchall() == [(live_server,)]
    rows = db.execute("SELECT role, status, length(content) FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant"] and rows[1][1] == "complete" and rows[1][2] > 0


@pytest.mark.real
async def test_the_app_on_a_live_specchat_serve_calls_a_tool_and_answers_from_its_result(tmp_path):
    """The default pair behind `specchat serve`, the notes server (tests/helpers/mcp_notes.py) here: "call first" makes the
    server's grammar write the call, which is asked about, run on this machine, and answered from its result."""
    pytest.importorskip("mcp", reason="the tools extra (pip install -e '.[tools]') is not installed")
    pytest.importorskip("fastapi")
    from apptools import asked, choose_all_tools, toolbox
    from mcp_notes import NOTE
    from mcp_notes import SCRIPT as NOTES
    from serving import serving as specchat_serve

    (tmp_path / "config.toml").write_text('system_prompt = ""\nmax_tokens = 120\n')
    with specchat_serve("--ctx", "2048", models=("--pair", "qwen-coder-1.5b")) as server:
        app = remote_app(tmp_path, f"http://127.0.0.1:{server.port}", toolbox_factory=lambda: toolbox(script=NOTES))
        async with app.run_test(size=(140, 50)) as pilot:
            await choose_all_tools(pilot, app, call_first=True, timeout=REAL_TIMEOUT_S)
            await send(pilot, app, "Show me my note 'launch' as a markdown blockquote.")
            assert (await asked(pilot, app, timeout=REAL_TIMEOUT_S)).call.name == "read_note"
            await pilot.press("y")
            await until(pilot, lambda: answered(app) and len(app.chat.conversation.messages()) == 4,
                        "the answer after the call", timeout=REAL_TIMEOUT_S)
            stored = app.chat.conversation.messages()
    assert "Traceback" not in "".join(server.stderr), "".join(server.stderr)
    assert [m.role for m in stored] == ["user", "assistant", "tool", "assistant"]
    [call] = stored[1].tool_calls
    assert call["name"] == "read_note" and stored[2].tool_call_id == call["id"] and stored[2].content == NOTE
    assert stored[3].status == "complete" and "10:30" in stored[3].content, stored[3].content  # it quotes the result


def test_each_backend_has_its_own_warnings():
    """Said of one server is not said of another (the list was once shared by every instance)."""
    one, two = RemoteBackend(RemoteChoice("http://a:1")), RemoteBackend(RemoteChoice("http://b:2"))
    one.warnings.append("the server is old")
    assert two.warnings == [] and RemoteBackend(RemoteChoice("http://c:3")).warnings == []
