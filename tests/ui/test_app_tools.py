"""Tools in the app, driven by Textual's Pilot: the scripted backend makes the calls, a real MCP server (written
with the SDK, tests/helpers/mcp_servers.py, over stdio) runs them. Each call is asked about before it runs; its result is
stored with the conversation and shown folded; a refused call, a server that hangs and Esc at the question each end
in one line, with the conversation intact."""

from __future__ import annotations

import pytest
from fakes import FakeBackend
from pilot import answered, make_app, send, until
from textual.widgets import Collapsible, Static

from specchat.llama.template import ToolCall
from specchat.mcptools.agent import REFUSED
from specchat.ui.app import SpecchatApp
from specchat.ui.tools import ToolCallScreen, ToolsScreen
from specchat.ui.widgets import ToolView

pytest.importorskip("mcp", reason="the tools extra (pip install -e '.[tools]') is not installed")
from apptools import asked, choose_all_tools, toolbox  # noqa: E402  (it imports the MCP SDK)

ECHO = ToolCall("echo", '{"text": "saffron and eggs"}', "call_1")


def scripted(tmp_path, answer: str, *calls: ToolCall, timeout_s: float = 20.0) -> tuple[FakeBackend, SpecchatApp]:
    """An app whose model makes `calls` in its first answer and then answers `answer`, on the real test server."""
    backend = FakeBackend(answer)
    backend.tool_script = [calls]
    return backend, make_app(tmp_path, backend, toolbox_factory=lambda: toolbox(timeout_s))


def roles(app: SpecchatApp) -> list[str]:
    return [m.role for m in app.chat.conversation.messages()]


async def answer_the_call(pilot, app: SpecchatApp, backend: FakeBackend, prompt: str, key: str, calls: int = 2) -> None:
    """Send `prompt`, answer the question about its call with `key` (y, a or n), and wait for the reply after the
    call: the backend asked `calls` times in all."""
    await send(pilot, app, prompt)
    await asked(pilot, app)
    await pilot.press(key)
    await until(pilot, lambda: answered(app) and len(backend.calls) == calls, "the reply after the call", timeout=60)


async def test_a_call_allowed_runs_and_its_result_is_stored_shown_folded_and_answered(tmp_path):
    backend, app = scripted(tmp_path, "The note says saffron and eggs.", ECHO)
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        assert {"echo", "block"} <= set(app.chat.conversation.tools.names)
        await send(pilot, app, "What does echo say?")
        question = await asked(pilot, app)
        assert question.call == ECHO
        assert '"saffron and eggs"' in str(question.query_one("#tool-arguments", Static).render())
        await pilot.press("y")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the answer after the call", timeout=60)
        assert roles(app) == ["user", "assistant", "tool", "assistant"]
        stored = app.chat.conversation.messages()
        assert stored[1].tool_calls == ({"id": "call_1", "name": "echo", "arguments": ECHO.arguments},)
        assert (stored[2].content, stored[2].tool_call_id) == ("saffron and eggs", "call_1")
        # The answer after the call was asked with its result, and with the tools still offered.
        second, _ = backend.calls[1]
        assert [(m.role, m.content) for m in second[-2:]][-1] == ("tool", "saffron and eggs")
        assert "echo" in backend.offered[0] and "echo" in backend.offered[1]
        assert backend.tool_choices == ["auto", "auto"]  # the model decided to call
        view = app.chat.query_one(ToolView)
        assert view.call == 'echo({"text": "saffron and eggs"})' and view.query_one(Collapsible).collapsed
        assert not app.generating
        # The status says the reply is done (not that calls are under way): the agent loop's last event is its own.
        assert str(app.chat.query_one("#status", Static).render()).startswith("done · guesser")
        # Opened again (as after a restart), the call and its result are drawn the same way.
        await app.chat.open(app.chat.conversation)
        await pilot.pause()
        [again] = app.chat.query(ToolView)
        assert again.call == view.call and again.content == "saffron and eggs"


async def test_a_refused_call_is_not_run_and_the_model_is_told_so(tmp_path):
    backend, app = scripted(tmp_path, "I could not read it.", ToolCall("pid", "{}", "call_1"))
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        await answer_the_call(pilot, app, backend, "Which process are you?", "n")
        assert roles(app) == ["user", "assistant", "tool", "assistant"]
        result = app.chat.conversation.messages()[2]
        assert result.content == REFUSED and result.stats == {"refused": True, "failed": False}
        assert app.chat.query_one(ToolView).refused


async def test_a_server_that_hangs_gives_one_line_and_the_conversation_goes_on(tmp_path):
    backend, app = scripted(tmp_path, "The tool did not answer.", ToolCall("block", "{}", "call_1"), timeout_s=1.0)
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        await answer_the_call(pilot, app, backend, "Wait for the block tool", "y")
        result = app.chat.conversation.messages()[2]
        assert "timed out after 1 s" in result.content and "\n" not in result.content
        assert result.stats == {"refused": False, "failed": True}
        assert str(app.chat.query_one(ToolView).query_one(Collapsible).title) == f"failed · {result.content}"
        assert roles(app) == ["user", "assistant", "tool", "assistant"]


async def test_esc_at_the_question_refuses_the_call_and_stops(tmp_path):
    backend, app = scripted(tmp_path, "Never shown.", ECHO)
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        await send(pilot, app, "What does echo say?")
        await asked(pilot, app)
        app.chat.action_stop()  # Esc on the chat: the question closes, the call is refused, the answer stops
        await until(pilot, lambda: not app.generating, "the generation to end", timeout=30)
        assert not isinstance(app.screen, ToolCallScreen)
        messages = app.chat.conversation.messages()
        assert [m.role for m in messages][:3] == ["user", "assistant", "tool"] and messages[2].content == REFUSED
        assert all(m.status != "partial" for m in messages)


async def test_without_a_configured_server_f5_says_so_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # no config.toml: no [mcp.servers]
    app = make_app(tmp_path, FakeBackend())
    async with app.run_test(size=(140, 50)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        await pilot.press("f5")
        await until(pilot, lambda: any(n.severity == "error" for n in app._notifications), "the error", timeout=30)
        [error] = [n.message for n in app._notifications if n.severity == "error"]
        assert "no MCP server is configured" in error and "[mcp.servers.NAME]" in error and "\n" not in error
        assert app.chat.conversation.tools is None and not isinstance(app.screen, ToolsScreen)


async def test_tools_stay_off_until_chosen_and_nothing_starts(tmp_path):
    started = []
    backend = FakeBackend("Plain.")
    backend.tool_script = [(ECHO,)]
    app = make_app(tmp_path, backend, toolbox_factory=lambda: started.append(1) or toolbox())
    async with app.run_test(size=(140, 50)) as pilot:
        await send(pilot, app, "Hello")
        await until(pilot, lambda: answered(app), "the answer")
        assert backend.offered == [[]] and roles(app) == ["user", "assistant"] and started == []


async def test_call_first_makes_the_first_answer_call_and_the_next_answer_in_words(tmp_path):
    """For a model too small to decide to call (the default 1.5B writes its call as a json block): the first
    answer is asked to call (tool_choice "required", a grammar in the real service), the next is offered no tools."""
    backend, app = scripted(tmp_path, "The note says saffron and eggs.", ECHO)
    async with app.run_test(size=(140, 50)) as pilot:
        await until(pilot, lambda: app.ready, "models to load")
        await pilot.press("f5")
        await until(pilot, lambda: isinstance(app.screen, ToolsScreen), "the tools dialog", timeout=60)
        await pilot.press("ctrl+a", "ctrl+t", "enter")
        await until(pilot, lambda: app.chat.conversation.tools, "the tools chosen")
        assert app.chat.conversation.tools.call_first
        await answer_the_call(pilot, app, backend, "What does echo say?", "y")
        assert backend.tool_choices == ["required", "auto"] and "echo" in backend.offered[0] and backend.offered[1] == []
        assert roles(app) == ["user", "assistant", "tool", "assistant"]


async def test_a_tool_that_raises_and_a_megabyte_result_each_give_a_line_and_lose_nothing(tmp_path):
    """Two calls in one answer: `boom` raises in the server, `big` returns 1 MB. The first is one line marked failed;
    the second is kept to the size cap with a line saying what was cut, and drawn only in part when opened (laying
    out a megabyte would hold the screen for seconds); the answer after them still comes, and nothing is lost."""
    backend, app = scripted(tmp_path, "One failed, the other was long.", ToolCall("boom", "{}", "call_1"),
                            ToolCall("big", '{"size": 1048576}', "call_2"))
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        await send(pilot, app, "Run boom, then big")
        await asked(pilot, app)
        await pilot.press("a")  # always for boom: big is still asked about
        await until(pilot, lambda: isinstance(app.screen, ToolCallScreen) and app.screen.call.name == "big",
                    "the question about big", timeout=60)
        await pilot.press("y")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the answer after the calls", timeout=60)
        messages = app.chat.conversation.messages()
        assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
        boom, big = messages[2], messages[3]
        assert boom.content.startswith("boom (server 'notes') reported an error") and "\n" not in boom.content
        assert boom.stats == {"refused": False, "failed": True}
        assert len(big.content.encode()) < 257 * 1024 and big.content.endswith("over the 256 KiB limit]")
        assert big.content.startswith("abcdefghijklmnopqrstuvwxyz") and big.stats["failed"] is False
        views = list(app.chat.query(ToolView))
        assert [v.failed for v in views] == [True, False]
        shown = str(views[1].query_one(Collapsible.Contents).query_one(Static).render())
        assert len(shown) < ToolView.SHOWN + 100 and "more characters (in the export)" in shown
        assert messages[-1].content == "One failed, the other was long."


async def test_always_holds_for_the_conversations_next_answers_and_not_in_another(tmp_path):
    """"Always" for echo: the conversation's next answer calls it without asking; a new conversation, offered the
    same tools, asks again (the set is the conversation's, for this session)."""
    backend, app = scripted(tmp_path, "Echoed.", ECHO)
    backend.tool_script = [(ECHO,), (), (ECHO,), (), (ECHO,), ()]  # each reply: a call, then words
    async with app.run_test(size=(140, 50)) as pilot:
        await choose_all_tools(pilot, app)
        await answer_the_call(pilot, app, backend, "Echo once", "a")
        await send(pilot, app, "Echo again")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 4 or isinstance(app.screen, ToolCallScreen),
                    "the second reply, or a question", timeout=60)
        asked_again = isinstance(app.screen, ToolCallScreen)
        if asked_again:
            await pilot.press("n")  # refused, so that the generation ends and the app can close
        assert not asked_again, "asked again about a tool allowed always"
        assert roles(app) == ["user", "assistant", "tool", "assistant"] * 2
        await pilot.press("ctrl+n")
        await choose_all_tools(pilot, app)
        await answer_the_call(pilot, app, backend, "Echo in a new chat", "y", calls=6)
