"""`specchat serve` for real: a server process on the SmolLM2 pair, talked to over loopback HTTP with the
official `openai` client (and http.client where the bytes themselves are the point).

Every server a test starts is stopped by it; every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability import tally
from serving import KEY, PAIR, Server, serving

from specchat.service.costs import Turns

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

pytestmark = pytest.mark.real

STEPS_TO_NOTICE = 8  # steps a generation may still take after its client left, before it stops
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # SmolLM2 counts on for as long as it is let (checked: 900 tokens)

QUEUE = 3  # requests that may wait while one generates


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with serving("--ctx", "1024", "--queue", str(QUEUE), "--api-key", KEY) as s:
        yield s
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)


def ask(server: Server, content: str, **kw: Any) -> Any:
    kw = {"max_tokens": 32, "temperature": 0} | kw
    extra = {"guesser": kw.pop("guesser", "none")}
    return server.client().chat.completions.create(model=PAIR, messages=[{"role": "user", "content": content}],
                                                   extra_body=extra, **kw)


def stream_text(server: Server, content: str, **kw: Any) -> tuple[str, list[Any]]:
    chunks = list(ask(server, content, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


def check_timings(t: dict[str, Any], usage: Any) -> None:
    assert t["predicted_n"] == usage.completion_tokens
    assert t["prompt_n"] + t["cache_n"] == usage.prompt_tokens
    assert 0 <= t["draft_n_accepted"] <= t["draft_n"]
    assert t["predicted_per_second"] == pytest.approx(t["predicted_n"] / (t["predicted_ms"] / 1000), rel=1e-6)
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / t["predicted_n"], rel=1e-6)
    if t["prompt_n"]:
        assert t["prompt_per_second"] == pytest.approx(t["prompt_n"] / (t["prompt_ms"] / 1000), rel=1e-6)
    # The speedup is known for every answer decoded here, and is what its own figures allow: never more than its
    # tokens per step (each step makes its kept guesses and one token more, so it took at least as many steps as
    # it produced tokens beyond them, the end-of-generation token perhaps among them); an answer that guessed
    # nothing ran at exactly plain speed, as the CLI shows it (tests/test_cli.py).
    assert isinstance(t["machine_busy"], bool)
    if t["predicted_n"]:
        speedup, produced = t["speedup"], t["predicted_n"] + 1
        assert isinstance(speedup, float) and speedup > 0, t
        assert speedup <= max(1.0, produced / (produced - t["draft_n_accepted"])) + 1e-9, t
        if not t["draft_n"]:
            assert speedup == pytest.approx(1.0, abs=0.02), t


# --- answers -----------------------------------------------------------------------------------------


def test_a_chat_answer_carries_usage_and_timings_that_agree_with_it(server):
    prompt = "Repeat this line twice: the quick brown fox jumps over the lazy dog."
    r = ask(server, prompt, max_tokens=40, guesser="lookup")
    assert r.object == "chat.completion" and r.model == PAIR
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content.strip()
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    t = r.model_extra["timings"]
    check_timings(t, r.usage)
    assert t["draft_n"] > 0  # lookup copied from the prompt: the draft figures are exercised
    assert r.choices[0].finish_reason == ("length" if r.usage.completion_tokens == 40 else "stop")


def test_streaming_sends_the_same_answer_and_ends_with_timings_usage_and_done(server):
    prompt = "Name three colours."
    whole = ask(server, prompt, max_tokens=30)
    text, chunks = stream_text(server, prompt, max_tokens=30, stream_options={"include_usage": True})
    assert text == whole.choices[0].message.content  # greedy, same prompt: the same tokens, however chunked
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == whole.choices[0].finish_reason
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    check_timings(finish[0].model_extra["timings"], usage_chunk.usage)
    check_timings(usage_chunk.model_extra["timings"], usage_chunk.usage)
    # Without include_usage no usage chunk comes, but the final chunk still has the timings.
    _, plain = stream_text(server, prompt, max_tokens=30)
    assert plain[-1].choices[0].finish_reason and "timings" in plain[-1].model_extra
    assert all(c.usage is None for c in plain)


def test_the_raw_stream_is_server_sent_events_ending_in_done(server):
    status, headers, body = server.request("POST", "/v1/completions", json.dumps(
        {"prompt": COUNTING, "max_tokens": 5, "stream": True, "temperature": 0}).encode(),
        {"Content-Type": "application/json"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    events = [e for e in body.decode().split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "length" and last["timings"]["predicted_n"] == 5


def test_stop_strings_end_the_answer_before_them(server):
    full = ask(server, "List the days of the week.", max_tokens=40).choices[0].message.content
    words = full.split()
    assert len(words) > 4, full
    stop = words[3]
    expected = full[:full.index(stop)]
    r = ask(server, "List the days of the week.", max_tokens=40, stop=[stop, "never appears in it"])
    assert r.choices[0].message.content == expected and r.choices[0].finish_reason == "stop"
    text, chunks = stream_text(server, "List the days of the week.", max_tokens=40, stop=stop)
    assert text == expected and chunks[-1].choices[0].finish_reason == "stop"


def test_text_completions_take_text_or_token_ids(server):
    c = server.client()
    r = c.completions.create(model=PAIR, prompt=COUNTING, max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length"
    assert r.choices[0].text.strip().startswith("9")
    check_timings(r.model_extra["timings"], r.usage)
    again = c.completions.create(model=PAIR, prompt=[COUNTING], max_tokens=6, temperature=0, stop=",")
    assert again.choices[0].text == r.choices[0].text.split(",")[0] and again.choices[0].finish_reason == "stop"
    ids = c.completions.create(model=PAIR, prompt=[16, 28, 216], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 2


@pytest.mark.parametrize("guesser", ["none", "lookup", "draft", "auto"])
def test_a_seed_gives_the_same_sample_twice(server, guesser):
    def sample(seed: int) -> str:
        return ask(server, "Write one sentence about the sea.", temperature=0.9, seed=seed, max_tokens=24,
                   guesser=guesser).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    assert len({first, *(sample(s) for s in (1, 2, 3))}) > 1  # and the seed is what fixed it


def test_the_next_turn_of_a_conversation_reuses_the_cache(server):
    c = server.client()
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a fruit."}]
    first = c.chat.completions.create(model=PAIR, messages=messages, max_tokens=12, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And a vegetable?"}]
    second = c.chat.completions.create(model=PAIR, messages=messages, max_tokens=12, temperature=0)
    t = second.model_extra["timings"]
    # The cache holds the first prompt and its answer (the answer's last token is still pending).
    assert t["cache_n"] >= first.usage.prompt_tokens + first.usage.completion_tokens - 1
    assert t["prompt_n"] == second.usage.prompt_tokens - t["cache_n"]
    assert t["prompt_n"] < second.usage.prompt_tokens - first.usage.prompt_tokens
    assert second.usage.prompt_tokens_details.cached_tokens == t["cache_n"]


# --- one at a time, and clients that leave -----------------------------------------------------------


def test_a_client_that_disconnects_cancels_its_stream_at_once(server):
    before = server.wait_idle()
    stream = server.client().completions.create(model=PAIR, prompt=COUNTING, max_tokens=900, temperature=0,
                                                stream=True)
    first = next(iter(stream))
    assert first.choices[0].text is not None
    stream.close()
    after = server.wait_idle()
    assert after["cancelled"] == before["cancelled"] + 1
    # Cancelled at the next step: a few steps after the first chunk at most (the chunks in flight, and the
    # steps the worker took while the server noticed). Counted in steps, the run's own unit: a bound in
    # tokens would allow more steps to a run that guessed less.
    last = after["last"]
    assert last["reason"] == "cancelled" and last["steps"] <= STEPS_TO_NOTICE, last
    r = server.client(timeout=30).completions.create(model=PAIR, prompt=COUNTING, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens == 3
    tally("server: clients leaving mid-request", trials=1, faults=1, lost=0)


def _open_request(server: Server, body: dict[str, Any]) -> http.client.HTTPConnection:
    """Send a request and leave it waiting for its answer."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body).encode(),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    return conn


def _wait_for(server: Server, what: str, cond: Any, timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond(h := server.health()):
            return h
        time.sleep(0.02)
    raise AssertionError(f"{what} did not happen in {timeout}s: {server.health()}")


def test_a_waiting_request_whose_client_left_is_dropped_and_a_running_one_cancelled(server):
    before = server.wait_idle()
    long = {"prompt": COUNTING, "max_tokens": 900, "temperature": 0}
    running = _open_request(server, long)
    _wait_for(server, "the first generation starting", lambda h: h["running"])
    waiting = _open_request(server, long)
    _wait_for(server, "the second request queueing", lambda h: h["waiting"] == 1)
    waiting.close()  # leaves while queued: must never generate
    running.close()  # leaves a non-streaming request mid-generation
    after = server.wait_idle()
    assert after["dropped"] == before["dropped"] + 1
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completed"] == before["completed"]
    assert after["last"]["reason"] == "cancelled" and after["last"]["predicted_n"] < 900
    tally("server: clients leaving mid-request", trials=2, faults=2, lost=0)


def test_health_answers_while_a_generation_runs(server):
    server.wait_idle()
    conn = _open_request(server, {"prompt": COUNTING, "max_tokens": 300, "temperature": 0})
    try:
        seen = _wait_for(server, "a generation running", lambda h: h["running"])
        assert seen["status"] == "ok"  # answered by the event loop while the worker thread generates
    finally:
        conn.close()
    server.wait_idle()


WAVES = 6  # of 20 clients: the first warms the server up, the rest show whether its memory keeps growing


def _wave(server: Server, clients: int = 20) -> tuple[list[str], int]:
    """While a long generation holds the engine, `clients` streams at once. The generation cannot end before
    every client has been queued or refused: it waits for this machine's turn (the one specchat processes
    take to answer), which the test holds until then. Returns each client's outcome and how many hung."""
    outcomes: list[str] = []
    barrier = threading.Barrier(clients)

    def client() -> None:
        barrier.wait(timeout=30)
        try:
            _, chunks = stream_text(server, "Say hi.", max_tokens=12)
            outcomes.append("ok" if chunks[-1].choices[0].finish_reason in ("stop", "length") else "bad")
        except openai.APIStatusError as e:
            retry, body = e.response.headers.get("retry-after", ""), e.response.json()
            good = e.status_code == 503 and retry.isdigit() and body["error"]["code"] == "server_busy"
            outcomes.append("503" if good else f"bad {e.status_code}")
        except Exception as e:  # any other outcome is a failure, counted below
            outcomes.append(f"bad {type(e).__name__}: {e}")

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    with Turns().turn():  # the server's generations wait for it; it is let go at the end of the block
        blocker = _open_request(server, {"prompt": COUNTING, "max_tokens": 900, "temperature": 0})
        try:
            _wait_for(server, "the long generation starting", lambda h: h["running"])
            for t in threads:
                t.start()
            _wait_for(server, f"{QUEUE} requests queueing and the rest refused",
                      lambda h: h["waiting"] == QUEUE and len(outcomes) == clients - QUEUE)
        finally:
            blocker.close()
    for t in threads:
        t.join(timeout=60)
    hung = sum(t.is_alive() for t in threads)
    server.wait_idle()
    return outcomes, hung


LEAK_KIB = 32  # per request: a leak this size or more fails the waves test


def test_twenty_streaming_clients_finish_or_get_503_and_memory_stays_flat(server):
    """While one long generation holds the engine, 20 clients stream at once: 3 fit in the queue, 17 get
    503 at once (on any machine, however fast or busy); then the long one's client leaves and the 3 stream.
    Wave after wave the server's memory stays flat: a leak adds about as much every wave, so after the first
    (which warms the server up) the median wave adds less than a leak of 32 KiB a request would (20 a wave).
    The allocator's own noise moved waves by 8 to 336 KiB here; a leak of 256 KiB a request adds 5 MiB."""
    server.wait_idle()
    rss, lost = [server.rss_kib()], 0
    for _ in range(WAVES):
        outcomes, hung = _wave(server)
        rss.append(server.rss_kib())
        bad = [o for o in outcomes if o not in ("ok", "503")]
        lost += hung + len(bad)
        assert hung == 0 and not bad, (bad, hung)
        assert sorted(outcomes) == ["503"] * (20 - QUEUE) + ["ok"] * QUEUE, outcomes
    tally("server: 20 streams at once, waves", trials=20 * WAVES, lost=lost)
    growth = [b - a for a, b in zip(rss[1:], rss[2:])]  # KiB each wave added, after the first
    print(f"server load: per wave 3 streamed and 17 got 503; RSS {rss[0] / 1024:.1f} MiB before, after each wave "
          f"{', '.join(f'{r / 1024:.1f}' for r in rss[1:])} MiB")
    assert statistics.median(growth) < 20 * LEAK_KIB, (growth, rss)


# --- errors ------------------------------------------------------------------------------------------


def _is_error(body: Any, status: int) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"] and "\n" not in err["message"]


GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
BAD_REQUESTS = [
    ("not an object", "/v1/chat/completions", [1, 2], 400, None),
    ("no messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    ("content of the wrong type", "/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, None),
    ("a string temperature", "/v1/chat/completions", GOOD | {"temperature": "hot"}, 400, "temperature"),
    ("a negative max_tokens", "/v1/chat/completions", GOOD | {"max_tokens": -1}, 400, "max_tokens"),
    ("top_p of 0", "/v1/chat/completions", GOOD | {"top_p": 0}, 400, "top_p"),
    ("stream as a number", "/v1/chat/completions", GOOD | {"stream": 1}, 400, "stream"),
    ("an empty stop string", "/v1/chat/completions", GOOD | {"stop": [""]}, 400, None),
    ("several answers", "/v1/chat/completions", GOOD | {"n": 3}, 400, "n"),
    ("an unknown guesser", "/v1/chat/completions", GOOD | {"guesser": "psychic"}, 400, "guesser"),
    ("a lone surrogate", "/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, 400, None),
    ("an empty prompt", "/v1/completions", {"prompt": ""}, 400, None),
    ("a token id outside the vocabulary", "/v1/completions", {"prompt": [10**9]}, 400, None),
    ("two prompts at once", "/v1/completions", {"prompt": ["a", "b"]}, 400, None),
    ("a draft length past the batch", "/v1/completions", {"prompt": "a", "draft_length": 10**6}, 400, None),
]


@pytest.mark.parametrize("what, path, body, status, param", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_openai_error_bodies(server, what, path, body, status, param):
    got, _, answer = server.post(path, body)
    assert got == status, answer
    _is_error(answer, status)
    if param:
        assert answer["error"]["param"] == param


def test_transport_errors_get_openai_error_bodies_and_the_server_goes_on(server):
    cases = [
        ("POST", "/v1/chat/completions", b"{bad json", {"Content-Type": "application/json"}, 400),
        ("POST", "/v1/chat/completions", json.dumps(GOOD).encode(), {"Content-Type": "text/plain"}, 400),
        ("POST", "/v1/chat/completions", b"{}" + b" " * (5 * 2**20), {"Content-Type": "application/json"}, 413),
        ("GET", "/v1/nowhere", None, {}, 404),
        ("DELETE", "/v1/models", None, {}, 405),
    ]
    for method, path, body, headers, status in cases:
        got, hdrs, answer = server.request(method, path, body, headers)
        assert got == status, (path, answer[:200])
        assert hdrs["content-type"].startswith("application/json")
        _is_error(json.loads(answer), status)
    long = {"messages": [{"role": "user", "content": "word " * 2000}]}
    got, _, answer = server.post("/v1/chat/completions", long)
    assert got == 400 and answer["error"]["code"] == "context_length_exceeded", answer
    assert answer["error"]["param"] == "messages"
    assert server.post("/v1/chat/completions", GOOD)[0] == 200
    tally("server: malformed requests", inputs=len(cases) + len(BAD_REQUESTS) + 1)


def test_the_api_key_is_required_but_health_stays_open(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        got, _, body = server.request("GET", "/v1/models", headers=headers, auth=False)
        assert got == 401
        _is_error(json.loads(body), 401)
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").chat.completions.create(model=PAIR, messages=GOOD["messages"], max_tokens=2)
    assert server.request("GET", "/health", auth=False)[0] == 200
    models = server.client().models.list()
    assert [m.id for m in models.data] == [PAIR]


def test_any_address_needs_a_key_and_with_one_unkeyed_requests_get_401(smol_path, tmp_path):
    # A key from the environment counts; the server listens on every address, and is talked to on loopback.
    # Its draft is missing: it serves the target alone and says why at start-up.
    models = ("--target", str(smol_path), "--draft", str(tmp_path / "missing.gguf"))
    with serving("--host", "0.0.0.0", "--ctx", "256", env={"SPECCHAT_API_KEY": KEY}, models=models) as s:
        got, _, body = s.request("POST", "/v1/chat/completions", json.dumps(GOOD).encode(),
                                 {"Content-Type": "application/json"}, auth=False)
        assert got == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        assert s.post("/v1/chat/completions", GOOD)[0] == 200
        got, _, answer = s.post("/v1/chat/completions", GOOD | {"guesser": "draft"})
        assert got == 400 and "missing.gguf" in answer["error"]["message"], answer
        assert [m.id for m in s.client().models.list().data] == [smol_path.stem]
    warnings = [line for line in s.stderr if line.startswith("specchat: warning: no draft model")]
    assert len(warnings) == 1 and "missing.gguf" in warnings[0], s.stderr


def test_stopping_the_server_tells_open_requests_so():
    with serving("--ctx", "1024", "--api-key", KEY) as s:
        streaming = _open_request(s, {"prompt": COUNTING, "max_tokens": 900, "stream": True})
        resp = streaming.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")
        waiting = _open_request(s, {"prompt": COUNTING, "max_tokens": 900})
        _wait_for(s, "a request queueing", lambda h: h["waiting"] == 1)
        s.proc.terminate()
        rest = resp.read()  # the stream ends now, with an error event saying why
        assert b'"code": "server_stopping"' in rest and not rest.rstrip().endswith(b"[DONE]"), rest[-300:]
        queued = waiting.getresponse()
        assert queued.status == 503 and json.loads(queued.read())["error"]["code"] == "server_stopping"
        s.proc.wait(timeout=30)
        streaming.close()
        waiting.close()
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)
    tally("server: stopped with requests open", trials=1, faults=1, lost=0)


class _BrokenService:
    """A conversation service with a bug in it: every generation raises."""

    n_ctx, guessers = 256, ["none"]

    def template_variables(self, *args: Any) -> dict[str, Any]:
        return {}

    def chat(self, *args: Any) -> Iterator[Any]:
        raise RuntimeError("a bug in the model layer")

    complete = chat


def test_an_internal_error_is_a_logged_500_and_the_server_goes_on(caplog):
    import uvicorn

    from specchat.server.app import create_app
    from specchat.server.run import bind
    from specchat.server.worker import Worker

    worker = Worker(max_waiting=2)
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(_BrokenService(), "broken", worker), log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        s = Server(None, sock.getsockname()[1], [])  # type: ignore[arg-type]
        with caplog.at_level("ERROR", logger="specchat.server"):
            for path, body in [("/v1/chat/completions", GOOD), ("/v1/completions", {"prompt": "x"}),
                               ("/v1/completions", {"prompt": "x", "stream": True})]:
                got, _, answer = s.post(path, body, auth=False)
                assert got == 500, answer
                _is_error(answer, 500)
                assert "RuntimeError" in answer["error"]["message"]
        assert sum("generation failed" in r.message and r.exc_info is not None for r in caplog.records) == 3
        assert s.health()["failed"] == 3  # and the server still answers
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        assert worker.stop(timeout=30)
        sock.close()


def _cli(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "specchat.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_start_up_errors_are_one_line(server):
    env = {"SPECCHAT_API_KEY": ""}
    for args, words in [(("--host", "0.0.0.0"), "--api-key"),
                        (("--host", "::"), "--api-key"),
                        (("--port", str(server.port)), "pick another --port"),
                        (("--queue", "-1"), "--queue")]:
        out = _cli("serve", "--pair", PAIR, *args, env=env)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("specchat: error: "), out.stderr
    # Without the server extra: how to install it, in one line.
    hide = "import sys; sys.modules['fastapi'] = None; from specchat.cli import main; sys.exit(main(['serve']))"
    out = _cli(code=hide)
    assert out.returncode == 2 and "pip install 'specchat[server]'" in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


# --- property tests ----------------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=12)
ENDPOINTS = ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health"]
# Fields a valid request can carry, for replacing one at a time with random values (max_tokens stays small,
# so that a request that happens to be valid answers quickly).
FIELDS = ["messages", "prompt", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "n", "stream",
          "stream_options", "guesser", "draft_length", "model", "chat_template_kwargs", "reasoning_effort"]


def _answer_is_sound(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status < 500, body[:300]
    if headers.get("content-type", "").startswith("text/event-stream"):
        assert status == 200 and body.rstrip().endswith(b"data: [DONE]") or b'"error"' in body, body[-300:]
        return
    answer = json.loads(body)
    if status >= 400:
        _is_error(answer, status)
    else:
        assert isinstance(answer, dict) and "error" not in answer


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(path=st.sampled_from(ENDPOINTS), value=JSON)
def test_random_json_never_breaks_the_server(server, path, value):
    failed = server.health()["failed"]
    status, headers, body = server.request("POST", path, json.dumps(value).encode(), {"Content-Type": "application/json"})
    _answer_is_sound(status, headers, body)
    assert server.health()["failed"] == failed  # not even inside a stream that had begun well
    tally("server: property tests", inputs=1)


@SETTINGS
@given(path=st.sampled_from(ENDPOINTS), body=st.binary(max_size=300))
def test_random_bytes_never_break_the_server(server, path, body):
    failed = server.health()["failed"]
    status, headers, answer = server.request("POST", path, body, {"Content-Type": "application/json"})
    _answer_is_sound(status, headers, answer)
    assert server.health()["failed"] == failed
    tally("server: property tests", inputs=1)


@SETTINGS
@given(path=st.sampled_from(ENDPOINTS[:2]), field=st.sampled_from(FIELDS), value=JSON)
def test_a_valid_request_with_one_random_field_never_breaks_the_server(server, path, field, value):
    base = {"model": PAIR, "max_tokens": 2, "max_completion_tokens": 2}
    base |= {"messages": [{"role": "user", "content": "Hi"}]} if path.endswith("chat/completions") else {"prompt": "Hi"}
    failed = server.health()["failed"]
    status, headers, body = server.request("POST", path, json.dumps(base | {field: value}).encode(),
                                           {"Content-Type": "application/json"})
    _answer_is_sound(status, headers, body)
    assert server.health()["failed"] == failed
    tally("server: property tests", inputs=1)


# --- a reasoning model: thinking in reasoning_content, as llama-server sends it ------------------------


@pytest.fixture(scope="module")
def thinker(thinker_path) -> Iterator[Server]:
    """A server on a tiny GGUF with DeepSeek R1's template, whose generation prompt opens a `<think>`."""
    with serving(models=("--target", str(thinker_path))) as s:
        yield s
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)


def test_thinking_comes_back_as_reasoning_content_whole_and_streamed(thinker):
    client, messages = thinker.client(), [{"role": "user", "content": "Why is the sky blue?"}]
    whole = client.chat.completions.create(model="tiny-r1", messages=messages, max_tokens=10, temperature=0)
    message = whole.choices[0].message
    thinking = message.model_extra["reasoning_content"]
    assert thinking and message.content == ""  # the tiny model never closes its <think>
    chunks = list(client.chat.completions.create(model="tiny-r1", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert streamed.strip() == thinking and not "".join(d.content or "" for d in deltas)
    # Sent back with the next question, as clients do, the thinking is left out of the prompt by the template.
    again = messages + [{"role": "assistant", "content": "Scattering.", "reasoning_content": thinking},
                        {"role": "user", "content": "And at dusk?"}]
    later = client.chat.completions.create(model="tiny-r1", messages=again, max_tokens=2, temperature=0)
    del again[1]["reasoning_content"]
    without = client.chat.completions.create(model="tiny-r1", messages=again, max_tokens=2, temperature=0)
    assert later.usage.prompt_tokens == without.usage.prompt_tokens


def test_chat_template_kwargs_switch_the_thinking_off(thinker):
    r = thinker.client().chat.completions.create(
        model="tiny-r1", messages=[{"role": "user", "content": "Why is the sky blue?"}], max_tokens=10, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = r.choices[0].message
    assert message.content and not (message.model_extra or {}).get("reasoning_content")


def test_a_good_request_still_works_after_random_inputs(server):
    """Random bodies of its own (the property tests check each of theirs: this does not lean on them having
    run first), then a good request: answered as if nothing had come before."""
    rng = random.Random(5)
    failed = server.health()["failed"]
    for n in range(40):
        path = ENDPOINTS[n % len(ENDPOINTS)]
        body = rng.randbytes(rng.randrange(300)) if n % 2 else json.dumps(
            {"messages": [{"role": rng.choice(["user", "tool", ""]), "content": rng.randbytes(20).hex()}],
             "prompt": [rng.randrange(-5, 1 << 20)], "max_tokens": rng.randrange(-3, 3), "stream": bool(n % 3)}).encode()
        status, _, _ = server.request("POST", path, body, {"Content-Type": "application/json"})
        assert status < 500
    r = ask(server, "Say yes.", max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length") and math.isfinite(r.model_extra["timings"]["predicted_ms"])
    assert server.health()["failed"] == failed  # no internal error: only 4xx answers
    assert server.proc.poll() is None


def test_a_real_answer_says_its_speedup_plain_and_copying(server):
    """One answer that guessed nothing and one that copied from its prompt, on the real pair: each says its
    speedup (`check_timings`), where the app's tests read it from a fake backend's plain step."""
    plain = ask(server, "Name three colours.", max_tokens=16)
    copied = ask(server, f"Count on from one: {COUNTING}", max_tokens=40, guesser="lookup")
    for r in (plain, copied):
        check_timings(r.model_extra["timings"], r.usage)
    assert plain.model_extra["timings"]["draft_n"] == 0 and copied.model_extra["timings"]["draft_n_accepted"] > 0


@pytest.fixture(scope="module")
def qwen3_thinker(tmp_path_factory, smol_path) -> Iterator[Server]:
    """A server on a tiny GGUF with Qwen3's template, which reads an earlier answer's reasoning_content (R1's,
    above, never does: there a prompt holds none of it, whatever the server passes on)."""
    from pathlib import Path

    from tiny_gguf import write

    template = (Path(__file__).parents[1] / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8")
    path = write("llama", tmp_path_factory.mktemp("qwen3") / "tiny-qwen3.gguf", tokenizer_from=smol_path,
                 chat_template=template)
    with serving(models=("--target", str(path))) as s:
        yield s
    assert "Traceback" not in "".join(s.stderr), "".join(s.stderr)


def test_reasoning_content_sent_back_goes_where_the_template_puts_it(qwen3_thinker):
    """The thinking a client sends back with an answer reaches the template: Qwen3's writes it while that answer
    goes on (the conversation ends in it), and leaves it out once the next question comes."""
    client = qwen3_thinker.client()

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        r = client.chat.completions.create(model="tiny-qwen3", messages=messages, max_tokens=1, temperature=0)
        return r.usage.prompt_tokens

    ask, answer = {"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "Scattering."}
    thought = answer | {"reasoning_content": "Blue light scatters more than red on the air's molecules."}
    again = {"role": "user", "content": "And at dusk?"}
    assert prompt_tokens([ask, thought]) > prompt_tokens([ask, answer])
    assert prompt_tokens([ask, thought, again]) == prompt_tokens([ask, answer, again])
