"""specchat's terminal app: conversations, streaming answers, and speculation shown live."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.events import Key
from textual.message import Message as TMessage
from textual.widgets import Footer, Header, Label, ListItem, ListView, ProgressBar, Static, TextArea

from specchat.backend import Backend, BackendFactory, EngineBackend
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.loader import ModelChoice
from specchat.models.catalog import Catalog, load_catalog
from specchat.spec.engine import Done, Prefill, Step
from specchat.spec.guessers import GUESSERS
from specchat.store.conversations import Store
from specchat.store.files import atomic_write
from specchat.store.settings import Settings, load_settings, save_settings
from specchat.ui.screens import ConfirmScreen, ErrorScreen, HelpScreen, PromptScreen, SettingsScreen
from specchat.ui.streaming import pump
from specchat.ui.widgets import MessageView, StatsPanel, summary_line


class ConversationItem(ListItem):
    # No DOM id: the list is cleared and refilled, and a cleared item is removed only later,
    # so a quick second refresh would otherwise collide with ids still in the tree.
    def __init__(self, conversation_id: int, title: str) -> None:
        super().__init__(Label(title))
        self.conversation_id = conversation_id


_SAVE_INTERVAL_S = 0.25  # how often a streaming answer is written to the database


class ChatInput(TextArea):
    """Enter sends; Shift+Enter (or Ctrl+J, for terminals that can't tell them apart) is a newline."""

    class Submitted(TMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    async def _on_key(self, event: Key) -> None:
        if event.key == "escape" and getattr(self.app, "generating", False):
            event.stop()
            self.app.action_stop()
        elif event.key == "enter":
            event.prevent_default()
            event.stop()
            self.post_message(self.Submitted(self.text))
        elif event.key in ("shift+enter", "ctrl+j"):
            event.prevent_default()
            event.stop()
            self.insert("\n")
        else:
            await super()._on_key(event)


class SpecchatApp(App[None]):
    CSS_PATH = "specchat.tcss"
    # Below 120 columns the conversation list hides and the stats panel narrows (see the CSS).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    TITLE = "specchat"
    BINDINGS = [
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("escape", "stop", "Stop", show=True),
        Binding("ctrl+r", "regenerate", "Regenerate", priority=True),
        Binding("ctrl+e", "edit_last", "Edit last", priority=True, show=False),
        Binding("ctrl+y", "copy_answer", "Copy answer", priority=True, show=False),
        Binding("ctrl+t", "toggle_provenance", "Provenance", priority=True),
        Binding("ctrl+g", "cycle_guesser", "Guesser", priority=True),
        Binding("f2", "rename", "Rename", show=False),
        Binding("ctrl+d", "delete_chat", "Delete", priority=True, show=False),
        Binding("ctrl+x", "export", "Export", priority=True, show=False),
        Binding("ctrl+o", "rewrite", "Rewrite doc", priority=True),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    _CHAT_ACTIONS = {"new_chat", "regenerate", "edit_last", "copy_answer", "toggle_provenance", "cycle_guesser",
                     "delete_chat", "export", "rewrite", "rename"}

    def __init__(self, choice: ModelChoice | None = None, backend_factory: BackendFactory = EngineBackend,
                 store: Store | None = None, settings_path: Path | None = None,
                 rewrite_file: Path | None = None) -> None:
        super().__init__()
        self.choice = choice or ModelChoice()
        self.store = store or Store()
        self.settings_path = settings_path
        self.settings, self._settings_problems = load_settings(settings_path)
        self.catalog: Catalog | None = None
        self.backend_factory = backend_factory  # tests pass one that makes a scripted backend
        self.backend: Backend | None = None
        self.ready = False
        self.conversation_id: int | None = None
        self.generating = False
        self.cancel = threading.Event()
        self.provenance = False
        self.rewrite_file = rewrite_file

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The chat's shortcuts win over the input box's own keys, but only on the chat screen:
        # dialogs and the rewrite screen keep theirs.
        if action in self._CHAT_ACTIONS and len(self.screen_stack) > 1:
            return False
        return True

    # --- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            with Vertical(id="sidebar"):
                yield Label("Conversations", classes="title")
                yield ListView(id="conversations")
            with Vertical(id="main"):
                yield VerticalScroll(id="chat")
                yield Static("", id="status")
                yield ProgressBar(id="progress", show_eta=False)
                yield ChatInput(id="input", placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: newline)")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        if self.store.notice:
            self.notify(self.store.notice, severity="error", timeout=30)
        for problem in self._settings_problems:
            self.notify(problem, severity="warning", timeout=10)
        try:
            self.catalog = load_catalog()
        except SpecchatError as e:
            self.push_screen(ErrorScreen(str(e)))
        self.query_one("#chat", VerticalScroll).anchor()
        self._refresh_conversations()
        conversations = self.store.conversations()
        self._open(conversations[0].id if conversations else self.store.new_conversation().id)
        self.query_one("#input").focus()
        self._load_backend()

    # --- models ---------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def _load_backend(self) -> None:
        self.ready = False
        choice = self.choice
        if self.settings.pair and choice.target is None and choice.pair is None:
            choice = replace(choice, pair=self.settings.pair)
        if self.settings.offline:  # the setting adds to HF_HUB_OFFLINE; it never turns it off
            choice = replace(choice, offline=True)
        if self.backend is not None:  # another pair: free the old one first (after any answer it is writing)
            self.backend.close()
            self.backend = None
        backend = self.backend_factory(choice)
        try:
            backend.load(lambda what, done, total: self.call_from_thread(self._progress, what, done, total))
        except SpecchatError as e:
            self.call_from_thread(self._fail, str(e))
            return
        except OSError as e:  # a full disk or an unreadable file while fetching or loading
            self.call_from_thread(self._fail, f"{e.strerror or e}: {e.filename or ''}".strip(": "))
            return
        self.call_from_thread(self._backend_ready, backend)

    def _progress(self, what: str, done: int, total: int) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.display = done < total
        bar.update(total=total, progress=done)
        self._status(what + ("…" if done < total else ""))

    def _fail(self, message: str) -> None:
        self.query_one("#progress").display = False
        self._status(f"error: {message}")
        self.push_screen(ErrorScreen(message))

    def _backend_ready(self, backend: Backend) -> None:
        self.backend, self.ready = backend, True
        if self.settings.guesser == "draft" and not backend.has_draft:
            self.settings = replace(self.settings, guesser="auto")
        self.query_one("#progress").display = False
        self._status(f"ready · guesser {self.settings.guesser} · {backend.name}")
        self.query_one(StatsPanel).reset(backend.name, backend.baseline(), self.settings.guesser)
        if self.rewrite_file is not None:
            path, self.rewrite_file = self.rewrite_file, None
            self._open_rewrite(path)

    def _status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    # --- conversations --------------------------------------------------------------------

    def _refresh_conversations(self) -> None:
        view = self.query_one("#conversations", ListView)
        view.clear()
        for conv in self.store.conversations():
            view.append(ConversationItem(conv.id, conv.title))

    def _open(self, conversation_id: int) -> None:
        self.conversation_id = conversation_id
        chat = self.query_one("#chat", VerticalScroll)
        chat.remove_children()
        for m in self.store.messages(conversation_id):
            summary = ""
            if m.stats:
                summary = m.stats.get("summary", "")
            chat.mount(MessageView(m.role, m.content, summary, m.status))
        chat.scroll_end(animate=False)

    @on(ListView.Selected, "#conversations")
    def _selected(self, event: ListView.Selected) -> None:
        if self.generating or not isinstance(event.item, ConversationItem):
            return
        self._open(event.item.conversation_id)

    def _history(self) -> list[Message]:
        assert self.conversation_id is not None
        messages = [Message("system", self.settings.system_prompt)] if self.settings.system_prompt else []
        return messages + [Message(m.role, m.content) for m in self.store.messages(self.conversation_id)]

    # --- chatting -------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    def _submitted(self, event: ChatInput.Submitted) -> None:
        text = event.text.strip()
        if not text:
            return
        if self.generating:
            self.notify("Still generating: Esc stops it", severity="warning")
            return
        if not self.ready:
            self.notify("The models are still loading", severity="warning")
            return
        self.query_one("#input", ChatInput).clear()
        assert self.conversation_id is not None
        if not self.store.messages(self.conversation_id):
            title = text.splitlines()[0][:40]
            self.store.rename(self.conversation_id, title)
            self._refresh_conversations()
        self.store.add_message(self.conversation_id, "user", text)
        self.query_one("#chat").mount(MessageView("user", text))
        self._answer()

    def _answer(self) -> None:
        assert self.conversation_id is not None and self.backend is not None
        view = MessageView("assistant")
        chat = self.query_one("#chat", VerticalScroll)
        chat.mount(view)
        chat.anchor()
        self.generating = True
        self.cancel.clear()
        stats = self.query_one(StatsPanel)
        stats.reset(self.backend.name, self.backend.baseline(), self.settings.guesser)
        self._status(f"generating with {self.settings.guesser}… (Esc stops)")
        history = self._history()
        # Stored before the first token and updated as it streams: if specchat is killed, the
        # answer so far survives, marked partial.
        answer_id = self.store.add_message(self.conversation_id, "assistant", "", "partial", model=self.backend.name)
        self._generate(view, stats, history, self.settings, answer_id)

    @work(thread=True, group="generate")
    def _generate(self, view: MessageView, stats: StatsPanel, history: list[Message], settings: Settings,
                  answer_id: int) -> None:
        saved = float("-inf")
        notices: list[str] = []

        def post(callback, arg) -> None:
            self.call_from_thread(callback, arg)

        async def steps(batch: list[Step]) -> None:
            nonlocal saved
            stats.add(batch)
            await view.append(batch)
            if time.monotonic() - saved >= _SAVE_INTERVAL_S:
                self.store.update_message(answer_id, view.content)
                saved = time.monotonic()

        async def done(event: Done) -> None:
            status = "stopped" if event.reason == "cancelled" else "complete"
            # A notice (e.g. old turns dropped to fit the context) stays with the answer it concerns.
            summary = " · ".join([summary_line(event.stats, settings.guesser, event.reason), *notices])
            await view.finish(event.text, summary, status)
            # A stopped answer is kept, marked as such, so nothing the user saw is lost.
            self.store.update_message(answer_id, event.text, status,
                                      {"summary": summary, "reason": event.reason, "tokens": event.stats.n_tokens,
                                       "acceptance": event.stats.acceptance, "guesser": settings.guesser})
            self._status(f"{status if status == 'stopped' else 'done'} · guesser {settings.guesser} · "
                         "Ctrl+R regenerates")

        def failed(message: str) -> None:
            # Whatever streamed before the failure stays, marked stopped; an empty answer goes.
            if view.content:
                self.store.update_message(answer_id, view.content, "stopped")
            else:
                self.store.delete_message(answer_id)
                view.remove()
            self._fail(message)

        def prefill(event: Prefill) -> None:
            stats.prefill(event.seconds)

        def notice(text: str) -> None:
            notices.append(text)
            self.notify(text, severity="warning", timeout=10)

        try:
            events = self.backend.chat(history, settings.generation(), settings.guesser, self.cancel)
            pump(events, post, steps, done, notice, prefill)
        except SpecchatError as e:
            self.call_from_thread(failed, str(e))
        finally:
            self.call_from_thread(setattr, self, "generating", False)

    # --- actions --------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.generating:
            self.cancel.set()

    def _last(self, role: str):
        messages = self.store.messages(self.conversation_id) if self.conversation_id else []
        return next((m for m in reversed(messages) if m.role == role), None), messages

    def action_regenerate(self) -> None:
        if self.generating or not self.ready:
            return
        last, messages = self._last("assistant")
        if last is None or messages[-1].id != last.id:
            self.notify("Nothing to regenerate")
            return
        self.store.delete_message(last.id)
        self.query(MessageView).last().remove()
        self._answer()

    def action_edit_last(self) -> None:
        if self.generating:
            return
        last_user, messages = self._last("user")
        if last_user is None:
            return
        for m in messages[messages.index(last_user):]:
            self.store.delete_message(m.id)
        self._open(self.conversation_id)
        box = self.query_one("#input", ChatInput)
        box.text = last_user.content
        box.focus()

    def action_copy_answer(self) -> None:
        last, _ = self._last("assistant")
        if last is not None:
            self.copy_to_clipboard(last.content)  # OSC 52: works over SSH too
            self.notify("Answer copied to the clipboard")

    def action_toggle_provenance(self) -> None:
        self.provenance = not self.provenance
        for view in self.query(MessageView):
            view.show_provenance(self.provenance)
        self._status("provenance " + ("on: green accepted guess, red target correction, cyan bonus token"
                                      if self.provenance else "off"))

    def action_cycle_guesser(self) -> None:
        has_draft = self.backend is not None and self.backend.has_draft
        options = [g for g in GUESSERS if g != "draft" or has_draft]
        nxt = options[(options.index(self.settings.guesser) + 1) % len(options)] if self.settings.guesser in options \
            else options[0]
        self._apply_settings(replace(self.settings, guesser=nxt))

    def action_new_chat(self) -> None:
        if self.generating:
            return
        conv = self.store.new_conversation()
        self._refresh_conversations()
        self._open(conv.id)

    def action_rename(self) -> None:
        def done(title: str | None) -> None:
            if title and self.conversation_id is not None:
                self.store.rename(self.conversation_id, title)
                self._refresh_conversations()
        self.push_screen(PromptScreen("Rename conversation"), done)

    def action_delete_chat(self) -> None:
        if self.generating or self.conversation_id is None:
            return

        def done(yes: bool | None) -> None:
            if yes:
                self.store.delete(self.conversation_id)
                conversations = self.store.conversations()
                self._open(conversations[0].id if conversations else self.store.new_conversation().id)
                self._refresh_conversations()
        self.push_screen(ConfirmScreen("Delete this conversation? This cannot be undone."), done)

    def action_export(self) -> None:
        if self.conversation_id is None:
            return
        out = self.store.path.parent / "exports" / f"conversation-{self.conversation_id}.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(out, self.store.export_markdown(self.conversation_id))
        self.notify(f"Exported to {out}")

    def action_settings(self) -> None:
        if self.catalog is None:
            return
        compatibility = {}
        if self.backend is not None and self.ready:
            name = self.settings.pair or self.catalog.default_pair
            compatibility[name] = "draft compatible (checked on load)" if self.backend.has_draft else "no draft"
        self.push_screen(SettingsScreen(self.settings, self.catalog, compatibility), self._apply_settings)

    def _apply_settings(self, settings: Settings | None) -> None:
        if settings is None:
            return
        reload = settings.pair != self.settings.pair
        self.settings = settings
        save_settings(settings, self.settings_path)
        self._status(f"guesser {settings.guesser}")
        if self.backend is not None and self.ready:
            self.query_one(StatsPanel).reset(self.backend.name, self.backend.baseline(), settings.guesser)
        if reload:
            self._load_backend()

    def action_help(self) -> None:
        self.push_screen(HelpScreen([(b.key, b.description) for b in self.BINDINGS]))

    def action_rewrite(self) -> None:
        def done(path: str | None) -> None:
            if path:
                self._open_rewrite(Path(path).expanduser())
        self.push_screen(PromptScreen("Document to rewrite (path)"), done)

    def _open_rewrite(self, path: Path) -> None:
        from specchat.ui.rewrite import RewriteScreen

        try:
            screen = RewriteScreen(path, self.backend, self.settings)
        except SpecchatError as e:
            self.push_screen(ErrorScreen(str(e)))
            return
        self.push_screen(screen)

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            if binding.action not in ("quit",):
                yield SystemCommand(binding.description, f"{binding.description} ({binding.key})",
                                    lambda action=binding.action: self.run_action(action))
