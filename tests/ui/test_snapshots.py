"""SVG snapshots of the main screens (pytest-textual-snapshot), on the scripted backend so that
every number on screen is fixed. Update with `pytest tests/ui/test_snapshots.py --snapshot-update`."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakes import FakeBackend
from pilot import send, until

from specchat.store.conversations import Store
from specchat.ui.app import SpecchatApp
from specchat.ui.rewrite import RewriteScreen

ANSWER = ("Speculative decoding lets a **small draft model** guess a few tokens, and the target "
          "checks them all in one step:\n\n- accepted guesses cost almost nothing\n- the output is unchanged")


@pytest.fixture(autouse=True)
def no_models_on_disk(tmp_path, monkeypatch):
    # The settings screen says which models are on disk: make that the same on every machine.
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))


def app_for(tmp_path: Path, **kwargs) -> SpecchatApp:
    return SpecchatApp(backend_factory=lambda choice: FakeBackend(ANSWER), store=Store(tmp_path / "chat.db"),
                       settings_path=tmp_path / "config.toml", **kwargs)


async def steady(pilot) -> None:
    """A cursor that does not blink: a snapshot must not depend on when in the blink it is taken."""
    for widget in pilot.app.screen.query("*"):
        if hasattr(widget, "cursor_blink"):
            widget.cursor_blink = False
    await pilot.pause()


async def answered(pilot) -> None:
    app = pilot.app
    await send(pilot, app, "What is speculative decoding?")
    await until(pilot, lambda: len(app.store.messages(app.conversation_id)) == 2 and not app.generating,
                "the answer")
    await steady(pilot)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_chat_after_an_answer(snap_compare, tmp_path, size):
    assert snap_compare(app_for(tmp_path), terminal_size=size, run_before=answered)


def test_provenance_view(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await answered(pilot)
        await pilot.press("ctrl+t")
        await steady(pilot)

    assert snap_compare(app_for(tmp_path), terminal_size=(160, 48), run_before=run_before)


def test_settings_screen(snap_compare, tmp_path):
    async def run_before(pilot) -> None:
        await until(pilot, lambda: pilot.app.ready, "models to load")
        await pilot.press("ctrl+s")
        await steady(pilot)

    assert snap_compare(app_for(tmp_path), terminal_size=(160, 48), run_before=run_before)


def test_rewrite_with_diff(snap_compare, tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_text("Speculative decoding are fast.\n\nIt keep the output the same.\n")

    async def run_before(pilot) -> None:
        app = pilot.app
        await until(pilot, lambda: isinstance(app.screen, RewriteScreen), "the rewrite screen")
        await pilot.press("ctrl+r")
        await until(pilot, lambda: app.screen.result is not None, "the rewrite")
        await steady(pilot)

    backend = FakeBackend("Speculative decoding is fast. It keeps the output the same.")
    app = SpecchatApp(backend_factory=lambda choice: backend, store=Store(tmp_path / "chat.db"),
                      settings_path=tmp_path / "config.toml", rewrite_file=doc)
    assert snap_compare(app, terminal_size=(160, 48), run_before=run_before)
