"""Driving the app with Textual's Pilot on a scripted backend: waiting for what the app does (an event,
never a guessed sleep), sending a message, and telling when an answer is stored."""

from __future__ import annotations

from pathlib import Path

from fakes import FakeBackend

from specchat.store.conversations import Store
from specchat.ui.app import SpecchatApp
from specchat.ui.rewrite import RewriteScreen


async def until(pilot, condition, what: str, timeout: float = 15.0) -> None:
    """Let the app run until condition() holds (an event, not a guessed sleep)."""
    waited = 0.0
    while not condition():
        assert waited < timeout, f"timed out waiting for {what}"
        await pilot.pause(0.05)
        waited += 0.05


async def settled(pilot, app: SpecchatApp) -> None:
    """Wait until every key pressed so far has been handled, before checking that one did nothing: press
    Ctrl+T twice (provenance on, then off: harmless) and wait for the second's effect, which the chat
    screen handles after theirs."""
    await pilot.press("ctrl+t", "ctrl+t")
    await until(pilot, lambda: str(app.chat.query_one("#status").render()) == "provenance off", "the keys to be handled")


def make_app(tmp_path: Path, backend=None, **kwargs) -> SpecchatApp:
    backend = backend or FakeBackend()
    return SpecchatApp(backend_factory=lambda choice: backend, store=Store(tmp_path / "chat.db"),
                       settings_path=tmp_path / "config.toml", **kwargs)


def answered(app: SpecchatApp) -> bool:
    """The last answer is finished and stored (it is stored as partial while it streams)."""
    messages = app.store.messages(app.conversation_id)
    return not app.generating and bool(messages) and messages[-1].role == "assistant" \
        and messages[-1].status != "partial"


async def send(pilot, app: SpecchatApp, text: str) -> None:
    await until(pilot, lambda: app.ready, "models to load")
    app.query_one("#input").text = text
    await pilot.press("enter")


async def regenerated(pilot, app: SpecchatApp, backend: FakeBackend) -> None:
    """"Tell me a story" answered twice: "A first story.", then, regenerated, "A second story." on screen."""
    backend.answer = "A first story."
    await send(pilot, app, "Tell me a story")
    await until(pilot, lambda: answered(app), "the first answer")
    backend.answer = "A second story."
    await pilot.press("ctrl+r")
    await until(pilot, lambda: answered(app) and len(backend.calls) == 2, "the regenerated answer")


async def rewriting(pilot, app: SpecchatApp) -> RewriteScreen:
    """The rewrite screen, once it is open and Ctrl+R was pressed on it."""
    await until(pilot, lambda: isinstance(app.screen, RewriteScreen), "the rewrite screen")
    await pilot.press("ctrl+r")
    return app.screen


async def reviewed(pilot, app: SpecchatApp) -> RewriteScreen:
    """The rewrite screen, once Ctrl+R's rewrite is done and its review ready."""
    screen = await rewriting(pilot, app)
    await until(pilot, lambda: screen.review is not None and not screen.running, "the rewrite")
    return screen
