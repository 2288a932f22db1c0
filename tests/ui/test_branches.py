"""Branches as users meet them: the prompt sent after Alt+← has moved to another branch, and two windows
open on one conversation, each on a branch of its own."""

from __future__ import annotations

from fakes import FakeBackend
from pilot import answered, make_app, regenerated, send, until

from specchat.decoding.events import Stats
from specchat.service.conversation import ConversationController
from specchat.service.events import Answered
from specchat.store.conversations import Store
from specchat.ui.widgets import MessageView


def said(messages) -> list[str]:
    """What a prompt holds of the conversation (the system prompt is the settings', not the branch's)."""
    return [m.content for m in messages if m.role != "system"]


async def test_a_message_sent_after_alt_left_is_answered_from_the_branch_on_screen(tmp_path):
    """Regenerated, the question has two answers; Alt+← shows the first again, and the next message
    goes to the backend after that first answer, with nothing of the second."""
    backend = FakeBackend("A first story.")
    app = make_app(tmp_path, backend)
    async with app.run_test(size=(120, 36)) as pilot:
        await regenerated(pilot, app, backend)
        await pilot.press("alt+left")
        await until(pilot, lambda: app.query(MessageView).last().content == "A first story.", "the first branch")
        backend.answer = "Then the model woke."
        await send(pilot, app, "And then?")
        await until(pilot, lambda: answered(app) and len(backend.calls) == 3, "the answer on the first branch")
        assert said(backend.calls[2][0]) == ["Tell me a story", "A first story.", "And then?"]
        assert [m.content for m in app.store.messages(app.conversation_id)] == \
            ["Tell me a story", "A first story.", "And then?", "Then the model woke."]
        assert [view.content for view in app.query(MessageView)] == \
            ["Tell me a story", "A first story.", "And then?", "Then the model woke."]


def answer(chat: ConversationController, text: str) -> None:
    chat.begin_answer("m", None)
    chat.finish(Answered("eog", text, (1,), Stats(n_tokens=1, steps=1)), "none")


def two_windows(tmp_path) -> tuple[ConversationController, ConversationController]:
    """Two specchat windows (each its own Store on one database) on one conversation whose question has two
    answers, the second on screen in both."""
    path = tmp_path / "chat.db"
    first = ConversationController(Store(path), Store(path).new_conversation().id)
    first.add_user("Name a colour.")
    answer(first, "Red.")
    first.end_at(first.messages()[0])
    answer(first, "Blue.")
    return first, ConversationController(Store(path), first.id)


def test_two_windows_sending_on_their_own_branches_lose_nothing(tmp_path):
    """One window goes back to the first answer and goes on from there while the other goes on from the
    second: every message either sent, and every answer, is in the database once."""
    left, right = two_windows(tmp_path)
    assert left.switch(left.messages()[1], -1)
    left.add_user("Why red?")
    answer(left, "Warmth.")
    right.add_user("Why blue?")
    answer(right, "Calm.")
    texts = left.store.texts()
    for text in ("Name a colour.", "Red.", "Blue.", "Why red?", "Warmth.", "Why blue?", "Calm."):
        assert texts.count(text) == 1, text
    assert Store(tmp_path / "chat.db").db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_branch_switched_in_one_window_leaves_the_other_window_on_its_own(tmp_path):
    """The right window keeps showing the second answer while the left goes back to the first and sends: its
    view, the prompt it sends next, and where its message is stored all stay on its own branch."""
    left, right = two_windows(tmp_path)
    assert left.switch(left.messages()[1], -1)
    left.add_user("Why red?")
    answer(left, "Warmth.")
    assert said(right.prompt_messages("")) == ["Name a colour.", "Blue."]
    right.add_user("Why blue?")
    assert said(right.prompt_messages("")) == ["Name a colour.", "Blue.", "Why blue?"]
    answer(right, "Calm.")
    assert [m.content for m in right.messages()] == ["Name a colour.", "Blue.", "Why blue?", "Calm."]
    assert [m.content for m in left.messages()] == ["Name a colour.", "Red.", "Why red?", "Warmth."]
