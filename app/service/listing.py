"""The list of conversations, for every front end that shows one: all of them, or those a search finds.

The store does the searching (full text, a word's start finds the word); this says what a list shows for
what was typed, and, for a search, where the words were found.
"""

from __future__ import annotations

from specchat.store.conversations import Conversation, Store


def listed(store: Store, query: str = "") -> list[Conversation]:
    """The conversations, newest first: every one where nothing is searched for (`query` blank), else those whose
    title or any message (thinking included) holds every word of `query`."""
    return store.search(query)  # which, given no word, lists every conversation


def found(store: Store, query: str, limit: int = 10) -> list[tuple[Conversation, bool]]:
    """At most `limit` conversations that hold every word of `query`, newest first, each with whether only a
    reasoning model's thinking holds them (the answers and questions do not)."""
    said = {c.id for c in store.search(query, limit=limit, thinking=False)}
    return [(c, c.id not in said) for c in store.search(query, limit=limit)]
