"""The conversation list: the sidebar's titles and its search, and the command palette's search.

The list shows what the service lists (`service/listing.py`) and says which conversation was chosen with
a message; what opening one means is the chat screen's business.
"""

from __future__ import annotations

from functools import partial
from urllib.parse import urlsplit

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.command import Hit, Hits, Provider
from textual.containers import Vertical
from textual.message import Message as TMessage
from textual.widgets import Input, Label, OptionList
from textual.widgets.option_list import Option

from specchat.service.listing import found, listed
from specchat.store.conversations import Conversation, Store


def _entry(conversation: Conversation) -> Option:
    """A conversation's line in the list: its title and, for one a remote server answered, which one."""
    server = conversation.server
    title = Text.assemble(conversation.title, ("\n⇄ " + urlsplit(server).netloc, "dim")) if server else conversation.title
    return Option(title, id=str(conversation.id))


class ConversationList(Vertical):
    """Every conversation, newest first, filtered by what is typed into the search box."""

    class Chosen(TMessage):
        """The user picked a conversation (in the list, or in the command palette's search)."""

        def __init__(self, conversation_id: int, query: str = "") -> None:
            super().__init__()
            self.conversation_id = conversation_id
            self.query = query  # what the search that found it was for ("": it was not searched for)

    def __init__(self, store: Store, **kwargs) -> None:
        super().__init__(**kwargs)
        self.store = store

    def compose(self) -> ComposeResult:
        yield Label("Conversations", classes="title")
        yield Input(placeholder="Search (Ctrl+F)", id="search")
        # One widget that draws the lines it shows, not a widget per conversation: every layout of the screen
        # (several a second while an answer streams) arranges each widget, and a user's hundreds of
        # conversations made that a third of a core, taken from the decoding the app exists to show.
        yield OptionList(id="conversations")

    def on_mount(self) -> None:
        self.refresh_list()

    def refresh_list(self) -> None:
        """Read the list again (a conversation was added, renamed, deleted or answered)."""
        view = self.query_one("#conversations", OptionList)
        view.set_options(_entry(c) for c in listed(self.store, self.query_one("#search", Input).value))

    @property
    def listed(self) -> list[int]:
        """The conversations in the list, in its order."""
        view = self.query_one("#conversations", OptionList)
        return [int(option.id) for option in view.options if option.id is not None]

    def focus_search(self) -> None:
        self.query_one("#search", Input).focus()

    @on(OptionList.OptionSelected, "#conversations")
    def _selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id is not None:
            self.post_message(self.Chosen(int(event.option.id), self.query_one("#search", Input).value.strip()))

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        event.stop()
        self.refresh_list()


class ConversationSearch(Provider):
    """The command palette finds conversations by any word in them (full-text search)."""

    async def search(self, query: str) -> Hits:
        lists = self.app.screen_stack[0].query(ConversationList)
        if not query.strip() or not lists:
            return
        sidebar = lists.first()
        for conv, in_thinking in found(sidebar.store, query):
            yield Hit(1.0, f"Open conversation: {conv.title}",
                      partial(sidebar.post_message, ConversationList.Chosen(conv.id, query.strip())),
                      help=f"holds “{query.strip()}”" + (" in its thinking" if in_thinking else ""))
