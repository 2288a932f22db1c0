"""The chat screen: the conversation, the streaming answer, and speculation shown live.

The screen lays the chat out, owns its keys and hands each to what does the work: the conversation's store calls
are a `ConversationController`'s, and so is the window's place in it (the selected message, the edit under way,
the branches at them); the messages are drawn by a `Transcript`, an answer is generated and drawn as it streams by
`Answers`, the list of conversations is a `ConversationList`'s, the tools (F5, "always") a `ChatTools`'. While an
answer streams (`busy`) the actions that would start another generation or leave the conversation are disabled
through `check_action`, so the engine never runs two generations at once and the streaming answer is never lost;
`disabled_reason` says why, for the command palette.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from textual import events, on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message as TMessage
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Header, ProgressBar, Static, TextArea

from specchat.errors import SpecchatError
from specchat.service import choices
from specchat.service.conversation import ConversationController
from specchat.service.documents import read_document
from specchat.ui.answers import Answers
from specchat.ui.conversations import ConversationList
from specchat.ui.keyline import KeyLine
from specchat.ui.screens import ConfirmScreen, PromptScreen
from specchat.ui.streaming import GenerationBatch
from specchat.ui.tools import ChatTools
from specchat.ui.transcript import Transcript
from specchat.ui.widgets import MessageView, StatsPanel

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp


def after(options: Sequence[str], current: str) -> str:
    """The option after `current`, round to the first (the first, too, where `current` is not one of them): what a
    key that cycles a setting chooses next."""
    return options[(options.index(current) + 1) % len(options)] if current in options else options[0]


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
        Binding("ctrl+e", "edit", "Edit", priority=True, show=False),
        Binding("alt+up", "select(-1)", "Select the message above", priority=True, show=False),
        Binding("alt+down", "select(1)", "Select the message below", priority=True, show=False),
        Binding("alt+left", "branch(-1)", "Branch ←", priority=True, show=False),
        Binding("alt+right", "branch(1)", "Branch →", priority=True, show=False),
        Binding("ctrl+y", "copy_answer", "Copy answer", priority=True, show=False),
        Binding("f3", "copy_code", "Copy code", priority=True),
        Binding("ctrl+l", "attach", "Attach file", priority=True, show=False),
        Binding("ctrl+t", "toggle_provenance", "Provenance", priority=True),
        Binding("ctrl+b", "toggle_thinking", "Thinking", priority=True),
        Binding("f4", "cycle_thinking", "Think on/off", priority=True, show=False),
        Binding("ctrl+g", "cycle_guesser", "Guesser", priority=True),
        Binding("ctrl+f", "search", "Search", priority=True, show=False),
        Binding("f2", "rename", "Rename", show=False),
        Binding("ctrl+d", "delete_chat", "Delete", priority=True, show=False),
        Binding("ctrl+x", "export", "Export", priority=True, show=False),
        Binding("ctrl+o", "rewrite", "Rewrite doc", priority=True),
        Binding("f5", "tools", "Tools", priority=True, show=False),
    ]
    # What may not run while an answer streams (it would start a second generation, or take the
    # answer's conversation away from under it), and what needs the models loaded.
    NOT_WHILE_BUSY = {"new_chat", "regenerate", "edit", "cycle_guesser", "delete_chat", "rewrite", "attach",
                      "search", "select", "branch", "tools"}
    NEEDS_MODELS = {"regenerate", "rewrite", "cycle_guesser"}

    # Nothing the screen itself draws depends on it (the key line follows the bindings): a repaint would redraw
    # the whole screen at the start and the end of every answer.
    busy: reactive[bool] = reactive(False, repaint=False, bindings=True)
    """An answer is streaming."""

    def watch_busy(self, busy: bool) -> None:
        # A blinking cursor draws the screen twice a second: while an answer streams, each of those frames
        # is time the decoding loses, so the message box's cursor holds still until the answer ends.
        self.query_one(ChatInput).cursor_blink = not busy

    def __init__(self) -> None:
        super().__init__()
        self.conversation: ConversationController | None = None
        self.cancel = threading.Event()
        self.attachments: list[tuple[Path, str]] = []  # files for the next message: (path, text)
        self.transcript = Transcript(self.status, id="chat")  # the conversation's messages, drawn
        self.answers = Answers(self)  # generating an answer, drawing it as it streams, its figures
        self.tools = ChatTools(self)  # F5, and the tools the user let run without asking

    @property
    def chat_app(self) -> SpecchatApp:
        return self.app  # type: ignore[return-value]

    @property
    def conversation_id(self) -> int | None:
        return self.conversation.id if self.conversation is not None else None

    def disabled_reason(self, action: str) -> str | None:
        """Why an action cannot run now, in words for the user; None if it can."""
        if action == "stop":
            editing = self.conversation is not None and self.conversation.editing is not None
            return None if self.busy or editing else "nothing is being generated"
        if action in self.NOT_WHILE_BUSY and self.busy:
            return "an answer is streaming: Esc stops it"
        if action in self.NEEDS_MODELS and not self.chat_app.ready:
            return "the models are still loading"
        return None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if self.disabled_reason(action) else True  # None: shown, but disabled

    # --- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield ConversationList(self.chat_app.store, id="sidebar")
            with Vertical(id="main"):
                yield self.transcript
                yield Static("", id="status")
                yield ProgressBar(id="progress", show_eta=False)
                yield ChatInput(id="input", placeholder="Message (Enter sends, Shift+Enter or Ctrl+J: newline)")
                yield Static("", id="context-meter")
            yield StatsPanel(id="stats")
        yield KeyLine()

    async def on_mount(self) -> None:
        self.transcript.anchor()
        await self.open(ConversationController.latest(self.chat_app.store))
        self.query_one("#input").focus()

    def status(self, text: str) -> None:
        self.query_one("#status", Static).update(text)

    # --- conversations --------------------------------------------------------------------

    async def open(self, conversation: ConversationController) -> None:
        if self.conversation is not None and conversation.id == self.conversation.id:
            conversation.keep_place(self.conversation)  # opened again: the selection and an edit stay
        else:
            self.cancel_edit()  # an edit of the conversation left: what was typed before it comes back
        self.conversation = conversation
        await self.transcript.show(conversation)
        self.sub_title = f"answered by {conversation.server}" if conversation.server else ""
        self.answers.show_context(None)

    @on(ConversationList.Chosen)
    async def _chosen(self, event: ConversationList.Chosen) -> None:
        if self.busy:
            self.notify("An answer is streaming: Esc stops it, then open the conversation", severity="warning")
        else:
            conversation = ConversationController(self.chat_app.store, event.conversation_id)
            branched = bool(event.query) and conversation.show_found(event.query)
            await self.open(conversation)
            if branched:
                self.status(f"showing the branch that holds “{event.query}”")

    def action_search(self) -> None:
        self.query_one(ConversationList).focus_search()

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
        assert self.conversation is not None
        sent = self.conversation.send(text, self.attachments)
        if sent.draft is not None:
            box.text = sent.draft  # what was being typed when the edit began
        if sent.first:
            self.query_one(ConversationList).refresh_list()  # its first message named it
        self.attachments = []
        self.query_one(StatsPanel).attached([])
        if sent.draft is not None:  # an edit, a new branch: what followed the original is on another branch now
            await self.open(self.conversation)
        else:
            await self.transcript.mount(MessageView("user", sent.content))
        await self.answers.start()

    async def on_generation_batch(self, batch: GenerationBatch) -> None:
        try:
            await self.answers.show(batch)
        finally:
            batch.handled()
        if batch.last:  # the generation ended (or failed): set here, as the screen set it when it began
            self.busy = False

    # --- actions --------------------------------------------------------------------------

    def action_stop(self) -> None:
        if self.busy:
            self.cancel.set()
        elif self.conversation is not None and self.conversation.editing is not None:
            self.cancel_edit()
            self.status("edit cancelled: your message stays as it was")

    def cancel_edit(self) -> None:
        """Drop the edit in the input, if any, and give the input back what it held before (nothing typed is lost)."""
        draft = self.conversation.cancel_edit() if self.conversation is not None else None
        if draft is not None:
            self.query_one("#input", ChatInput).text = draft
            self.refresh_bindings()

    async def action_regenerate(self) -> None:
        """Answer the selected question again (else the last): a new branch; the old answer stays beside it."""
        if self.conversation is None or not self.conversation.regenerate():
            self.notify("Nothing to regenerate")
            return
        self.busy, self.cancel = True, threading.Event()
        await self.open(self.conversation)
        await self.answers.start()

    def action_edit(self) -> None:
        """Put the selected message of yours (else the last) in the input: sent, it starts a new branch."""
        box = self.query_one("#input", ChatInput)
        message = self.conversation.edit(box.text) if self.conversation is not None else None
        if message is None:
            return
        box.text = message.content
        box.focus()
        self.refresh_bindings()  # Esc now cancels the edit
        self.status("editing your message: Enter sends it as a new branch (the original stays: Alt+←/→), Esc cancels")

    def action_select(self, step: int) -> None:
        """Move the selection up or down the messages: regenerate, edit and Alt+←/→ act on it."""
        if self.conversation is not None:
            self.transcript.select(self.conversation, step)

    async def action_branch(self, step: int) -> None:
        """Show another branch at the selected message (else at the last message that has branches)."""
        assert self.conversation is not None
        at = self.conversation.branch_point()
        try:
            shown = self.conversation.switch_at(at, step) if at is not None else None
        except SpecchatError as e:
            self.notify(str(e), severity="error", timeout=10)
            return
        if shown is None:
            self.notify("No other branch there" if at is not None else "This conversation has no branches")
            return
        await self.open(self.conversation)
        self.status(f"branch {shown.branch} of {shown.branches} · Alt+←/→ moves between them")

    def action_copy_answer(self) -> None:
        self.transcript.copy_answer(self.conversation)

    def action_copy_code(self) -> None:
        self.transcript.copy_code(self.conversation)

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
        self.transcript.toggle_provenance()

    def action_toggle_thinking(self) -> None:
        self.transcript.toggle_thinking()

    def action_cycle_thinking(self) -> None:
        """The thinking setting, round default, on and off (the next answer takes it)."""
        app = self.chat_app
        nxt = after(list(choices.THINKING), app.settings.thinking)
        app.apply_settings(replace(app.settings, thinking=nxt))
        self.answers.thinking_noticed = False
        switch = app.backend.thinking_switch if app.backend is not None else None
        self.status(f"thinking {nxt}" + ("" if switch or nxt == "default" else
                                         " (this model's template has no switch: it does as it was trained)"))

    def action_cycle_guesser(self) -> None:
        app = self.chat_app
        options = app.backend.guessers if app.backend is not None else []
        if not options:
            return
        app.apply_settings(replace(app.settings, guesser=after(options, app.settings.guesser)))

    def action_tools(self) -> None:
        self.tools.choose()

    async def action_new_chat(self) -> None:
        await self.open(ConversationController.new(self.chat_app.store))
        self.query_one(ConversationList).refresh_list()

    def action_rename(self) -> None:
        def done(title: str | None) -> None:
            if title and self.conversation is not None:
                self.conversation.rename(title)
                self.query_one(ConversationList).refresh_list()
        self.app.push_screen(PromptScreen("Rename conversation"), done)

    def action_delete_chat(self) -> None:
        if self.conversation is None:
            return

        async def done(yes: bool | None) -> None:
            if yes and self.conversation is not None:
                await self.open(self.conversation.delete())
                self.query_one(ConversationList).refresh_list()
        self.app.push_screen(ConfirmScreen("Delete this conversation? This cannot be undone."), done)

    def action_export(self) -> None:
        if self.conversation is not None:
            self.notify(f"Exported to {self.conversation.export()}")

    def action_rewrite(self) -> None:
        def done(path: str | None) -> None:
            if path:
                self.chat_app.open_rewrite(Path(path).expanduser())
        self.app.push_screen(PromptScreen("Document to rewrite (path)", complete_paths=True), done)
