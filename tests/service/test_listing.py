"""The list of conversations: every one, or what a search finds, and for the palette where it found it."""

from __future__ import annotations

from specchat.service.listing import found, listed
from specchat.store.conversations import Store


def two_conversations(store: Store) -> tuple[int, int]:
    """One that says carbonara in a question, one whose answer only thought of it."""
    dinner = store.new_conversation("Dinner").id
    store.add_message(dinner, "user", "how do I cook carbonara")
    lunch = store.new_conversation("Lunch").id
    store.add_message(lunch, "user", "something quick")
    answer = store.add_message(lunch, "assistant", "", "partial")
    store.update_message(answer, "A sandwich.", "complete", thinking="Not carbonara: too slow.")
    return dinner, lunch


def test_the_list_is_every_conversation_newest_first_or_what_a_search_finds(tmp_path):
    store = Store(tmp_path / "chat.db")
    dinner, lunch = two_conversations(store)
    assert [c.id for c in listed(store)] == [c.id for c in listed(store, "   ")] == [lunch, dinner]
    assert [c.id for c in listed(store, " sandw ")] == [lunch]  # a word's start, the spaces round it ignored
    assert [c.id for c in listed(store, "carbonara")] == [lunch, dinner]  # thinking included


def test_a_search_says_where_only_the_thinking_holds_the_words(tmp_path):
    store = Store(tmp_path / "chat.db")
    dinner, lunch = two_conversations(store)
    assert [(c.id, in_thinking) for c, in_thinking in found(store, "carbonara")] == [(lunch, True), (dinner, False)]
    assert found(store, "carbonara", limit=1)[0][0].id == lunch
    assert found(store, "zebra") == []
