"""The conversation controller, headless: every store call the chat screen makes, with no Textual
(the import check at the end shows none is loaded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specchat.decoding.events import Stats
from specchat.service.conversation import SAVE_INTERVAL_S, ConversationController, summary_line
from specchat.service.events import Answered
from specchat.store.conversations import Store


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def done(text: str, reason: str = "eog", figures: str = "engine") -> Answered:
    return Answered(reason, text, (1, 2, 3), Stats(n_prompt=9, n_tokens=3, steps=2, drafted=2, accepted=1,
                                                   draft_s=0.1, verify_s=0.2), figures=figures)


def make(tmp_path: Path) -> tuple[Store, ConversationController, Clock]:
    store, clock = Store(tmp_path / "chat.db"), Clock()
    return store, ConversationController(store, store.new_conversation().id, clock), clock


def test_the_first_message_names_the_conversation_and_files_go_first(tmp_path):
    store, chat, _ = make(tmp_path)
    content = chat.add_user("Fix the typos\nplease", [(Path("notes.md"), "Teh text.\n")])
    assert content == "File `notes.md`:\n\n````\nTeh text.\n````\n\nFix the typos\nplease"
    chat.add_user("And again")
    assert store.conversations()[0].title == "Fix the typos"  # the first line of the first message only
    assert [m.content for m in chat.messages()] == [content, "And again"]
    assert [m.role for m in chat.prompt_messages("Be brief.")] == ["system", "user", "user"]
    assert [m.role for m in chat.prompt_messages("")] == ["user", "user"]


def test_an_answer_is_stored_before_its_first_token_and_saved_as_it_streams_at_most_four_times_a_second(tmp_path):
    store, chat, clock = make(tmp_path)
    chat.add_user("Hi")
    chat.begin_answer("target + draft", None)
    stored = chat.messages()[-1]
    assert (stored.role, stored.content, stored.status, stored.model) == ("assistant", "", "partial", "target + draft")
    chat.stream("Hel")  # the first piece is written at once
    assert chat.messages()[-1].content == "Hel"
    clock.now += SAVE_INTERVAL_S / 2
    chat.stream("lo")  # too soon: kept in memory only
    assert chat.messages()[-1].content == "Hel"
    clock.now += SAVE_INTERVAL_S
    chat.stream(" there")
    assert (chat.messages()[-1].content, chat.messages()[-1].status) == ("Hello there", "partial")


def test_the_end_stores_the_whole_answer_with_its_figures_and_the_notices(tmp_path):
    store, chat, _ = make(tmp_path)
    chat.add_user("Hi")
    chat.begin_answer("m", None)
    chat.stream("Hello")
    summary = chat.finish(done("Hello there"), "auto", ["the oldest 2 message(s) were left out"])
    stored = chat.messages()[-1]
    assert (stored.content, stored.status) == ("Hello there", "complete")
    assert stored.stats["summary"] == summary and summary.startswith("3 tokens · 0.3s · 10.0 tok/s · 1.50 tok/step")
    assert summary.endswith("· auto · the oldest 2 message(s) were left out")
    assert (stored.stats["tokens"], stored.stats["guesser"], stored.stats["acceptance"]) == (3, "auto", 0.5)


def test_an_answer_that_guessed_nothing_says_so_rather_than_a_zero_acceptance():
    plain = Answered("eog", "Hi", (1,), Stats(n_prompt=9, n_tokens=3, steps=3, drafted=0, accepted=0, verify_s=0.3))
    assert "nothing guessed" in summary_line(plain, "auto") and "acceptance" not in summary_line(plain, "auto")
    assert "acceptance 50%" in summary_line(done("Hello there"), "auto")


def test_a_stopped_answer_is_kept_marked_and_a_servers_figures_are_named(tmp_path):
    store, chat, _ = make(tmp_path)
    chat.add_user("Hi")
    chat.begin_answer("m @ gpu-box:8080", "http://gpu-box:8080")
    assert chat.server == "http://gpu-box:8080" and store.conversations()[0].server == "http://gpu-box:8080"
    summary = chat.finish(done("Hel", "cancelled", figures="server timings"), "auto")
    stored = chat.messages()[-1]
    assert stored.status == "stopped" and "[stopped]" in summary
    assert stored.stats["guesser"] == "server timings"  # where the figures came from, not the guesser asked


def test_a_failed_generation_keeps_what_streamed_and_drops_an_empty_answer(tmp_path):
    store, chat, _ = make(tmp_path)
    chat.add_user("Hi")
    chat.begin_answer("m", None)
    chat.stream("Half an ans")
    assert chat.fail() is True
    assert (chat.messages()[-1].content, chat.messages()[-1].status) == ("Half an ans", "stopped")
    chat.begin_answer("m", None)
    assert chat.fail() is False
    assert [m.role for m in chat.messages()] == ["user", "assistant"]


def answered(chat: ConversationController, question: str, answer: str, instead_of=None) -> None:
    chat.add_user(question, instead_of=instead_of)
    chat.begin_answer("m", None)
    chat.finish(done(answer), "none")


def contents(chat: ConversationController) -> list[str]:
    return [m.content for m in chat.messages()]


def test_regenerate_and_edit_make_branches_and_keep_what_was_there(tmp_path):
    store, chat, _ = make(tmp_path)
    answered(chat, "one", "first")
    answered(chat, "two", "second")
    # Regenerate the first answer: the branch ends at its question, and the new answer is its sibling.
    chat.end_at(chat.messages()[0])
    assert contents(chat) == ["one"]
    chat.begin_answer("m", None)
    chat.finish(done("first again"), "none")
    assert contents(chat) == ["one", "first again"] and (chat.messages()[1].branch, chat.messages()[1].branches) == (2, 2)
    # The old answer, and what followed it, are a branch away.
    assert chat.switch(chat.messages()[1], -1) and contents(chat) == ["one", "first", "two", "second"]
    assert not chat.switch(chat.messages()[1], -1)  # no branch before the first
    # Edit the second question: a sibling of it, with its own answer; the original stays.
    answered(chat, "two, edited", "second, to the edit", instead_of=chat.messages()[2])
    assert contents(chat) == ["one", "first", "two, edited", "second, to the edit"]
    assert [(m.branch, m.branches) for m in chat.messages()] == [(1, 1), (1, 2), (2, 2), (1, 1)]
    assert chat.switch(chat.messages()[2], -1) and contents(chat) == ["one", "first", "two", "second"]
    # Editing the very first message makes a second first message.
    answered(chat, "one, edited", "a new start", instead_of=chat.messages()[0])
    assert contents(chat) == ["one, edited", "a new start"] and chat.messages()[0].branches == 2
    # Every branch's text is there for the history guesser; the export follows the branch on screen.
    assert {"first", "first again", "second", "second, to the edit", "a new start"} <= set(store.texts())
    exported = chat.export().read_text()
    assert "a new start" in exported and "second" not in exported


def test_a_branch_killed_mid_answer_survives_marked(tmp_path):
    store, chat, _ = make(tmp_path)
    answered(chat, "one", "first")
    chat.end_at(chat.messages()[0])
    chat.begin_answer("m", None)
    chat.stream("half a second try")  # the app dies here
    reopened = ConversationController(Store(store.path), chat.id)
    assert [(m.content, m.status) for m in reopened.messages()] == [("one", "complete"), ("half a second try", "partial")]
    assert reopened.switch(reopened.messages()[1], -1) and contents(reopened) == ["one", "first"]


def test_export_rename_and_delete(tmp_path):
    store, chat, _ = make(tmp_path)
    chat.add_user("Hello")
    chat.rename("Greetings")
    out = chat.export()
    assert out == tmp_path / "exports" / f"conversation-{chat.id}.md"
    assert out.read_text().startswith("# Greetings\n") and "## User" in out.read_text()
    older = chat.id
    newer = ConversationController.new(store)
    nxt = newer.delete()
    assert nxt.id == older  # the latest that is left
    assert nxt.delete().messages() == [] and len(store.conversations()) == 1  # none left: a new one


def test_the_controller_loads_no_textual(tmp_path):
    code = ("import sys; from specchat.service.conversation import ConversationController; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False"


def test_the_branches_of_a_conversation_deleted_elsewhere_are_one_line(tmp_path):
    import pytest

    from specchat.errors import SpecchatError

    store, chat, _ = make(tmp_path)
    answered(chat, "one", "first")
    shown = chat.messages()[1]
    Store(store.path).delete(chat.id)  # another window deletes it
    with pytest.raises(SpecchatError, match="deleted in another specchat window"):
        chat.switch(shown, 1)


def test_three_branches_and_the_export_of_the_one_on_screen(tmp_path):
    store, chat, _ = make(tmp_path)
    answered(chat, "Name a colour.", "Red.")
    for again in ("Blue.", "Green."):
        chat.end_at(chat.messages()[0])
        chat.begin_answer("m", None)
        chat.finish(done(again), "none")
    assert [(m.content, m.branch, m.branches) for m in chat.messages()] == [("Name a colour.", 1, 1), ("Green.", 3, 3)]
    assert chat.switch(chat.messages()[1], -1)  # the second of three
    exported = chat.export().read_text()
    assert "## Assistant (branch 2 of 3)\n\nBlue." in exported and "Red." not in exported and "Green." not in exported


def test_a_search_shows_the_branch_that_holds_what_it_found(tmp_path):
    store, chat, _ = make(tmp_path)
    answered(chat, "one", "a zebra crossing")
    answered(chat, "two", "second")
    chat.end_at(chat.messages()[0])  # regenerated: the branch on screen no longer holds "zebra"
    chat.begin_answer("m", None)
    chat.finish(done("a plain answer"), "none")
    assert contents(chat) == ["one", "a plain answer"]
    assert chat.show_found("zebr")  # the start of a word, as the search finds it
    assert contents(chat) == ["one", "a zebra crossing", "two", "second"]  # down to that branch's newest
    assert not chat.show_found("zebra")  # already in view: the branch stays
    assert not chat.show_found("one") and not chat.show_found("giraffe") and not chat.show_found("  ")
    assert contents(chat) == ["one", "a zebra crossing", "two", "second"]


# --- the window's place: the selection, the branches at it, the edit ------------------------------------


def two_turns(tmp_path: Path) -> tuple[Store, ConversationController]:
    store, chat, _ = make(tmp_path)
    answered(chat, "one", "first")
    answered(chat, "two", "second")
    return store, chat


def test_the_selection_moves_among_the_messages_shown_and_says_what_the_keys_act_on(tmp_path):
    _, chat = two_turns(tmp_path)
    assert chat.selected is None and chat.acted_on("user").content == "two" and chat.acted_on("assistant").content == "second"
    chat.select(-1, 4)
    chat.select(-1, 4)
    assert chat.selected == 2 and chat.acted_on("user").content == "two"
    chat.select(-1, 4)  # an answer selected: the user's last message is what an edit takes
    assert chat.acted_on("user").content == "two" and chat.acted_on("assistant").content == "first"
    chat.select(-5, 4)
    assert chat.selected == 0  # the first, not before it
    chat.select(4, 4)
    assert chat.selected is None  # past the last: none, which is the last


def test_regenerate_ends_the_branch_at_the_question_of_the_selected_answer(tmp_path):
    store, chat = two_turns(tmp_path)
    chat.selected = 1
    assert chat.regenerate() and contents(chat) == ["one"] and chat.selected is None
    assert not make(tmp_path)[1].regenerate()  # nothing to regenerate in an empty conversation


def test_alt_arrows_switch_at_the_selected_message_else_at_the_last_that_has_branches(tmp_path):
    _, chat = two_turns(tmp_path)
    assert chat.branch_point() is None  # no branches anywhere
    assert chat.regenerate()  # the last answer: a branch at 3
    answered_again(chat, "second again")
    chat.selected = 1
    assert chat.regenerate()  # the first answer: a branch at 1, on which 3 has none
    answered_again(chat, "first again")
    assert chat.switch_at(1, -1).content == "first" and chat.selected == 1
    assert contents(chat) == ["one", "first", "two", "second again"]
    assert chat.branch_point() == 1  # the selected message, though a later one has branches
    chat.selected = None
    assert chat.branch_point() == 3  # the last that has branches
    assert chat.switch_at(3, 1) is None and chat.selected is None  # nothing after the second of two
    assert chat.switch_at(3, -1).content == "second" and chat.selected == 3


def answered_again(chat: ConversationController, answer: str) -> None:
    chat.begin_answer("m", None)
    chat.finish(done(answer), "none")


def test_an_edit_is_sent_as_a_branch_and_gives_back_what_was_typed_before_it(tmp_path):
    store, chat = two_turns(tmp_path)
    chat.selected = 0
    assert chat.edit("half a thought").content == "one"
    assert chat.edit("the first question, in the input").content == "one"  # an edit begun over the edit
    assert chat.cancel_edit() == "half a thought" and chat.editing is None
    assert chat.cancel_edit() is None  # no edit under way
    chat.edit("typed before")
    sent = chat.send("one, edited")
    assert sent == ("one, edited", False, "typed before") and chat.editing is None and chat.selected is None
    assert contents(chat) == ["one, edited"] and chat.messages()[0].branches == 2
    assert chat.send("and on") == ("and on", False, None)  # no edit: the next message
    assert ConversationController.new(store).send("Hello").first  # which names a new conversation


def test_the_prompt_is_estimated_from_its_messages_text_with_four_tokens_each(tmp_path):
    _, chat, _ = make(tmp_path)
    assert chat.estimated_tokens("", len) == 0
    chat.add_user("Hello")
    assert chat.estimated_tokens("Be brief.", len) == (9 + 4) + (5 + 4)  # the system prompt counts too
