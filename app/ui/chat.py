"""The chat screen: conversations, the streaming answer, and speculation shown live.

The screen owns the chat's keys. While an answer streams (`busy`) the actions that would start
another generation or leave the conversation are disabled through `check_action`, so the engine
never runs two generations at once and the streaming answer is never lost.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from rich.text import Text
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.command import Hit, Hits, Provider
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message as TMessage
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Header, Input, Label, ListItem, ListView, ProgressBar, Static, TextArea
from textual.widgets.markdown import MarkdownFence

from specchat.documents import read_document
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.spec.guessers import GUESSERS
from specchat.store.files import atomic_write
from specchat.ui.screens import ConfirmScreen, PromptScreen
from specchat.ui.streaming import GenerationBatch, Pump
from specchat.ui.widgets import STREAMING, MessageView, StatsPanel, code_blocks, summary_line

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp

_SAVE_INTERVAL_S = 0.25  # how often a streaming answer is written to the database
CONTEXT_WARNING = 0.8  # share of the context after which the meter warns that old turns will be left out


def remote_server(backend: object) -> str | None:
    """The server a remote backend talks to; None for this machine's engine (or no backend yet)."""
    return getattr(backend, "server", None)


class ConversationItem(ListItem):
    # No DOM id: the list is cleared and refilled, and a cleared item is removed only later,
    # so a quick second refresh would otherwise collide with ids still in the tree.
    def __init__(self, conversation_id: int, title: str, server: str | None = None) -> None:
        # A conversation answered by a remote server says which, under its title.
        super().__init__(Label(Text.assemble(title, ("\n⇄ " + urlsplit(server).netloc, "dim")) if server else title))
        self.conversation_id = conversation_id


class ChatInput(TextArea):
    """Enter sends; Shift+Enter (or Ctrl+J, for terminals that can't tell them apart) is a newline;
    ↑ and ↓ in an empty box (or on a recalled prompt) walk through the prompts sent before.

    These keys are handled in `on_key`, in order with the characters typed before them: as
    bindings they would run as soon as the App saw them, ahead of characters still queued for
    the box, and a fast typist's (or a paste's) newlines would land in the wrong place."""

    class Submitted(TMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sent: list[str] = []
        self._recalled: int | None = None  # the history entry on show, while it is unedited

    async def on_key(self, event: events.Key) -> None:
        # prevent_default keeps TextArea's own handling (inserting a newline) from running too.
        if event.key == "enter":
            self.post_message(self.Submitted(self.text))
        elif event.key in ("shift+enter", "ctrl+j"):
            self.insert("\n")
        elif event.key in ("up", "down") and self.sent and (
                self.text == "" or (self._recalled is not None and self.text == self.sent[self._recalled])):
            self._recall(-1 if event.key == "up" else 1)
        else:  # text of one's own: up/down move the cursor (TextArea's bindings), as in any text box
            return
        event.prevent_default()
        event.stop()

    def _recall(self, direction: int) -> None:
        at = len(self.sent) if self._recalled is None else self._recalled
        at = max(0, min(len(self.sent), at + direction))
        self._recalled = at if at < len(self.sent) else None
        self.text = self.sent[at] if self._recalled is not None else ""
        self.move_cursor(self.document.end)

    def remember(self, text: str) -> None:
        if not self.sent or self.sent[-1] != text:
            self.sent.append(text)
        self._recalled = None


class ChatScreen(Screen[None]):
    BINDINGS = [
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
        Binding("ctrl+e", "edit_last", "Edit last", priority=True, show=False),
        Binding("ctrl+y", "copy_answer", "Copy answer", priority=True, show=False),
        Binding("f3", "copy_code", "Copy code", priority=True),
        Binding("ctrl+l", "attach", "Attach file", priority=True, show=False),
        Binding("ctrl+t", "toggle_provenance", "Provenance", priority=True),
        Binding("ctrl+g", "cycle_guesser", "Guesser", priority=True),
        Binding("ctrl+f", "search", "Search", priority=True, show=False),
        Binding("f2", "rename", "Rename", show=False),
        Binding("ctrl+d", "delete_chat", "Delete", priority=True, show=False),
        Binding("ctrl+x", "export", "Export", priority=True, show=False),
        Binding("ctrl+o", "rewrite", "Rewrite doc", priority=True),
    ]
    # What may not run while an answer streams (it would start a second generation, or take the
    # answer's conversation away from under it), and what needs the models loaded.
    NOT_WHILE_BUSY = {"new_chat", "regenerate", "edit_last", "cycle_guesser", "delete_chat", "rewrite", "attach",
                      "search"}
    NEEDS_MODELS = {"regenerate", "rewrite"}

    busy: reactive[bool] = reactive(False, bindings=True)
    """An answer is streaming."""

    def __init__(self) -> None:
        super().__init__()
        self.conversation_id: int | None = None
        self.cancel = threading.Event()
        self.provenance = False
        self.attachments: list[tuple[Path, str]] = []  # files for the next message: (path, text)
        self._code_cursor = -1  # which code block of the last answer F3 copied last
        self._answer: tuple[MessageView, int, list[str]] | None = None  # view, stored id, notices
        self._saved = float("-inf")

    @property
    def chat_app(self) -> SpecchatApp:
        return self.app  # type: ignore[return-value]

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            return True if self.busy else None
        if action in self.NOT_WHILE_BUSY and self.busy:
            return None  # shown, but disabled
        if action in self.NEEDS_MODELS and not self.chat_app.ready:
            return None
        return True

    # --- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="sidebar"):
                yield Label("Conversations", classes="title")
                yield Input(placeholder="Search (Ctrl+F)", id="search")
                yield ListView(id="conversations")
            with Vertical(id="main"):
                yield VerticalScroll(id="chat")
                yield Static("", id="status")
                yield ProgressBar(id="progress", show_eta=False)
                yield ChatInput(id="input", placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: newline)")
                yield Static("", id="context-meter")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#chat", VerticalScroll).anchor()
        self.refresh_conversations()
        conversations = self.chat_app.store.conversations()
        self.open(conversations[0].id if conversations else self.chat_app.store.new_conversation().id)
        self.query_one("#input").focus()

    def status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    # --- conversations --------------------------------------------------------------------

    def refresh_conversations(self, query: str = "") -> None:
        view = self.query_one("#conversations", ListView)
        view.clear()
        store = self.chat_app.store
        for conv in store.search(query) if query else store.conversations():
            view.append(ConversationItem(conv.id, conv.title, conv.server))

    def open(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        chat = self.query_one("#chat", VerticalScroll)
        chat.remove_children()
        messages = self.chat_app.store.messages(conversation_id)
        for m in messages:
            chat.mount(MessageView(m.role, m.content, (m.stats or {}).get("summary", ""), m.status))
        chat.scroll_end(animate=False)
        server = self.chat_app.store.server(conversation_id)
        self.sub_title = f"answered by {server}" if server else ""
        self.show_context(None)

    @on(ListView.Selected, "#conversations")
    def _selected(self, event: ListView.Selected) -> None:
        if not self.busy and isinstance(event.item, ConversationItem):
            self.open(event.item.conversation_id)

    @on(Input.Changed, "#search")
    def _search(self, event: Input.Changed) -> None:
        self.refresh_conversations(event.value.strip())

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    def open_found(self, conversation_id: int) -> None:
        if self.busy:
            self.notify("An answer is streaming: Esc stops it, then open the conversation", severity="warning")
        else:
            self.open(conversation_id)

    def history(self) -> list[Message]:
        assert self.conversation_id is not None
        system = self.chat_app.settings.system_prompt
        messages = [Message("system", system)] if system else []
        return messages + [Message(m.role, m.content) for m in self.chat_app.store.messages(self.conversation_id)]

    # --- the context meter -------------------------------------------------------------------

    def show_context(self, used: int | None) -> None:
        """Tokens used out of the context: exact after an answer (its prompt plus the answer),
        estimated from the messages' text when a conversation is opened."""
        backend, meter = self.chat_app.backend, self.query_one("#context-meter", Static)
        if backend is None or not self.chat_app.ready:
            meter.update("")
            return
        estimated = used is None
        if used is None:
            used = sum(backend.count_tokens(m.content) + 4 for m in self.history()) if self.conversation_id else 0
        share = used / backend.n_ctx
        text = f"context {'≈' if estimated else ''}{used:,} / {backend.n_ctx:,} tokens ({share:.0%})"
        if share >= CONTEXT_WARNING:
            text += ": the oldest turns will soon be left out (Ctrl+N starts a new chat; Settings sets the size)"
        meter.update(text)
        meter.set_class(share >= CONTEXT_WARNING, "warning")

    # --- chatting -------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    async def _submitted(self, event: ChatInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.busy:
            self.notify("Still generating: Esc stops it", severity="warning")
            return
        if not self.chat_app.ready:
            self.notify("The models are still loading", severity="warning")
            return
        self.busy, self.cancel = True, threading.Event()  # from here: no second generation, and Esc counts
        box = self.query_one("#input", ChatInput)
        box.remember(text)
        box.clear()
        assert self.conversation_id is not None
        store = self.chat_app.store
        if not store.messages(self.conversation_id):
            store.rename(self.conversation_id, text.splitlines()[0][:40])
            self.refresh_conversations()
        content = attach(text, self.attachments)
        self.attachments = []
        self.query_one(StatsPanel).attached([])
        store.add_message(self.conversation_id, "user", content)
        await self.query_one("#chat").mount(MessageView("user", content))
        await self.answer()

    async def answer(self) -> None:
        app = self.chat_app
        assert self.conversation_id is not None and app.backend is not None
        view = MessageView("assistant")
        chat = self.query_one("#chat", VerticalScroll)
        # Mounted before anything streams into it: the Markdown body's first (empty) render, run on
        # mount, would otherwise land after the first blocks and show them twice.
        await chat.mount(view)
        chat.anchor()
        self.busy = True
        settings = app.settings
        self.reset_stats()
        server = remote_server(app.backend)
        self.status(f"generating on {server}… (Esc stops)" if server else
                    f"generating with {settings.guesser}… (Esc stops)")
        history = self.history()
        if server is not None and app.store.server(self.conversation_id) != server:
            app.store.set_server(self.conversation_id, server)  # the conversation says where its answers came from
            self.sub_title = f"answered by {server}"
            self.refresh_conversations()
        # Stored before the first token and updated as it streams: if specchat is killed, the
        # answer so far survives, marked partial.
        answer_id = app.store.add_message(self.conversation_id, "assistant", "", "partial", model=app.backend.name)
        self._answer, self._saved = (view, answer_id, []), float("-inf")
        self._generate(history)

    @work(thread=True, group="generate")
    def _generate(self, history: list[Message]) -> None:
        app, settings = self.chat_app, self.chat_app.settings
        assert app.backend is not None
        Pump(self).run(app.backend.chat(history, settings.generation(), settings.guesser, self.cancel))

    async def on_generation_batch(self, batch: GenerationBatch) -> None:
        try:
            await self._show(batch)
        finally:
            batch.handled()

    def reset_stats(self) -> None:
        """Clear the panel for the next answer (or a new backend): a remote one is labelled as such."""
        backend, settings = self.chat_app.backend, self.chat_app.settings
        if backend is None:
            return
        remote = remote_server(backend) is not None
        self.query_one(StatsPanel).reset(backend.name, backend.baseline(), f"{settings.guesser} (asked)" if remote else
                                         settings.guesser, STREAMING if remote else "")

    async def _show(self, batch: GenerationBatch) -> None:
        assert self._answer is not None
        view, answer_id, notices = self._answer
        store, stats, guesser = self.chat_app.store, self.query_one(StatsPanel), self.chat_app.settings.guesser
        # A remote answer's figures are the server's; the summary names their source where a guesser would be.
        figures = getattr(self.chat_app.backend, "figures", "") if remote_server(self.chat_app.backend) else ""
        if batch.prefill is not None:
            stats.prefill(batch.prefill.seconds)
        for text in batch.notices:
            notices.append(text)
            self.notify(text, severity="warning", timeout=10)
        if batch.steps:
            stats.add(batch.steps)
            await view.append(batch.steps)
            if time.monotonic() - self._saved >= _SAVE_INTERVAL_S:
                store.update_message(answer_id, view.content)
                self._saved = time.monotonic()
        if batch.last:
            stats.flush()
        if batch.done is not None:
            done = batch.done
            if figures:
                stats.finish(done.stats, figures)
                guesser = figures
            status = "stopped" if done.reason == "cancelled" else "complete"
            # A notice (e.g. old turns dropped to fit the context) stays with the answer it concerns.
            summary = " · ".join([summary_line(done.stats, guesser, done.reason), *notices])
            await view.finish(done.text, summary, status)
            # A stopped answer is kept, marked as such, so nothing the user saw is lost.
            store.update_message(answer_id, done.text, status,
                                 {"summary": summary, "reason": done.reason, "tokens": done.stats.n_tokens,
                                  "acceptance": done.stats.acceptance, "guesser": guesser,
                                  "tokens_per_s": done.stats.tokens_per_s,
                                  "tokens_per_step": done.stats.tokens_per_step,
                                  "wall_tokens_per_s": done.stats.wall_tokens_per_s})
            source = f"figures: {figures}" if figures else f"guesser {guesser}"
            self.status(f"{status if status == 'stopped' else 'done'} · {source} · Ctrl+R regenerates")
            self.show_context(done.stats.n_prompt + done.stats.n_tokens)
        elif batch.error is not None:
            # Whatever streamed before the failure stays, marked stopped; an empty answer goes.
            if view.content:
                store.update_message(answer_id, view.content, "stopped")
            else:
                store.delete_message(answer_id)
                await view.remove()
            self.chat_app.fail(batch.error)
        if batch.last:
            self._answer, self._code_cursor = None, -1
            self.busy = False

    # --- actions --------------------------------------------------------------------------

    def action_stop(self) -> None:
        self.cancel.set()

    def _last(self, role: str):
        store = self.chat_app.store
        messages = store.messages(self.conversation_id) if self.conversation_id else []
        return next((m for m in reversed(messages) if m.role == role), None), messages

    async def action_regenerate(self) -> None:
        last, messages = self._last("assistant")
        if last is None or messages[-1].id != last.id:
            self.notify("Nothing to regenerate")
            return
        self.busy, self.cancel = True, threading.Event()
        self.chat_app.store.delete_message(last.id)
        await self.query(MessageView).last().remove()
        await self.answer()

    def action_edit_last(self) -> None:
        last_user, messages = self._last("user")
        if last_user is None:
            return
        for m in messages[messages.index(last_user):]:
            self.chat_app.store.delete_message(m.id)
        self.open(self.conversation_id)
        box = self.query_one("#input", ChatInput)
        box.text = last_user.content
        box.focus()

    def action_copy_answer(self) -> None:
        last, _ = self._last("assistant")
        if last is not None:
            self.app.copy_to_clipboard(last.content)  # OSC 52: works over SSH too
            self.notify("Answer copied to the clipboard")

    def action_copy_code(self) -> None:
        """Copy the next code block of the last answer (F3 again: the one after it)."""
        last, _ = self._last("assistant")
        blocks = code_blocks(last.content) if last is not None else []
        if not blocks:
            self.notify("The last answer has no code block")
            return
        self._code_cursor = (self._code_cursor + 1) % len(blocks)
        language, code = blocks[self._code_cursor]
        self._copy_code(code, f"code block {self._code_cursor + 1} of {len(blocks)}" + (f" ({language})" if language else ""))

    @on(events.Click)
    def _clicked(self, event: events.Click) -> None:
        """A click on a code block copies it."""
        widget = event.widget
        while widget is not None and not isinstance(widget, MarkdownFence):
            widget = widget.parent if widget.parent is not self else None
        if isinstance(widget, MarkdownFence):
            self._copy_code(widget.code, "code block" + (f" ({widget.lexer})" if widget.lexer else ""))

    def _copy_code(self, code: str, what: str) -> None:
        self.app.copy_to_clipboard(code)
        self.notify(f"Copied {what}: {len(code.splitlines())} lines")

    def action_attach(self) -> None:
        def done(path: str | None) -> None:
            if not path:
                return
            try:
                file = Path(path).expanduser()
                text = read_document(file)
            except SpecchatError as e:
                self.notify(str(e), severity="error", timeout=10)
                return
            self.attachments.append((file, text))
            backend = self.chat_app.backend
            tokens = f", {backend.count_tokens(text):,} tokens" if backend is not None and self.chat_app.ready else ""
            self.query_one(StatsPanel).attached([(p.name, len(t)) for p, t in self.attachments])
            self.status(f"attached {file.name}{tokens}: it goes with your next message, and prompt lookup copies from it")
        self.app.push_screen(PromptScreen("Attach a file to the next message (path)", complete_paths=True), done)

    def action_toggle_provenance(self) -> None:
        self.provenance = not self.provenance
        for view in self.query(MessageView):
            view.show_provenance(self.provenance)
        self.status("provenance " + ("on: green accepted guess, red target correction, cyan bonus token"
                                     if self.provenance else "off"))

    def action_cycle_guesser(self) -> None:
        app = self.chat_app
        has_draft = app.backend is not None and app.backend.has_draft
        options = [g for g in GUESSERS if g != "draft" or has_draft]
        current = app.settings.guesser
        nxt = options[(options.index(current) + 1) % len(options)] if current in options else options[0]
        app.apply_settings(replace(app.settings, guesser=nxt))

    def action_new_chat(self) -> None:
        conv = self.chat_app.store.new_conversation()
        self.refresh_conversations()
        self.open(conv.id)

    def action_rename(self) -> None:
        def done(title: str | None) -> None:
            if title and self.conversation_id is not None:
                self.chat_app.store.rename(self.conversation_id, title)
                self.refresh_conversations()
        self.app.push_screen(PromptScreen("Rename conversation"), done)

    def action_delete_chat(self) -> None:
        if self.conversation_id is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                store = self.chat_app.store
                store.delete(self.conversation_id)
                conversations = store.conversations()
                self.open(conversations[0].id if conversations else store.new_conversation().id)
                self.refresh_conversations()
        self.app.push_screen(ConfirmScreen("Delete this conversation? This cannot be undone."), done)

    def action_export(self) -> None:
        if self.conversation_id is None:
            return
        store = self.chat_app.store
        out = store.path.parent / "exports" / f"conversation-{self.conversation_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, store.export_markdown(self.conversation_id))
        self.notify(f"Exported to {out}")

    def action_rewrite(self) -> None:
        def done(path: str | None) -> None:
            if path:
                self.chat_app.open_rewrite(Path(path).expanduser())
        self.app.push_screen(PromptScreen("Document to rewrite (path)", complete_paths=True), done)


class ConversationSearch(Provider):
    """The command palette finds conversations by any word in them (full-text search)."""

    async def search(self, query: str) -> Hits:
        app = self.app
        chat = app.screen_stack[0]
        if not query.strip() or not isinstance(chat, ChatScreen):
            return
        for conv in app.store.search(query, limit=10):  # type: ignore[attr-defined]
            yield Hit(1.0, f"Open conversation: {conv.title}", partial(chat.open_found, conv.id),
                      help=f"holds “{query.strip()}”")


def attach(text: str, files: list[tuple[Path, str]]) -> str:
    """The message with its attached files ahead of it, each fenced and named, so the model can
    refer to them and prompt lookup can copy from them."""
    parts = [f"File `{path.name}`:\n\n````\n{content.rstrip()}\n````" for path, content in files]
    return "\n\n".join([*parts, text])
