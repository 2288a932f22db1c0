"""Tools in the app: which of the configured MCP servers' tools a conversation offers the model (F5), and the
question before each call runs: once, always for that tool (in this conversation), or no. `ChatTools` is what the
chat screen's keys hand these to.

The agent loop runs in the generation's worker thread and asks its question from there (`ask_from_worker`):
the dialog is pushed on the UI thread, and the worker waits for the answer, or for Esc, which stops the
generation and refuses the call."""

from __future__ import annotations

import concurrent.futures
import json
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterator, MutableSet, Sequence

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Label, SelectionList, Static

from specchat.errors import SpecchatError
from specchat.llama.template import Message, ToolCall
from specchat.mcptools.agent import Choice, agent_loop
from specchat.service.conversation import ToolChoice
from specchat.service.events import Notice

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp
    from specchat.ui.chat import ChatScreen

Answer = Callable[[Sequence[Message], "list[dict[str, Any]] | None", str], Iterator[Any]]


def with_tools(app: SpecchatApp, messages: Sequence[Message], choice: ToolChoice, answer: Answer, rounds: int,
               always: MutableSet[str], cancel: threading.Event) -> Iterator[Any]:
    """The agent loop over `answer(conversation, tools, tool_choice)` (in a worker thread), offering the tools
    `choice` names, at most `rounds` rounds of calls (`call_first`: the first answer must call, and the next is in
    words); the servers are started first where they are not yet, a Notice for each that did not start."""
    box, problems = app.start_toolbox()
    for line in problems:
        yield Notice(line)
    schemas, answers = box.schemas(choice.names), 0

    def one(conversation: Sequence[Message], offered: bool) -> Iterator[Any]:
        nonlocal answers
        answers += 1
        return answer(conversation, schemas if offered else None,
                      "required" if choice.call_first and answers == 1 else "auto")

    yield from agent_loop(one, messages, box.call, lambda call: ask_from_worker(app, call, box.server_of(call.name), cancel),
                          1 if choice.call_first else rounds, always)


def _arguments(arguments: str) -> str:
    """A call's arguments laid out for reading (as given where they are not JSON: the tool will say so)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False) if arguments.strip() else "(none)"
    except ValueError:
        return arguments


class ToolCallScreen(ModalScreen[Choice]):
    """The model asks to run a tool: its name, its server and its arguments, for the user to allow or refuse."""

    BINDINGS = [Binding("y", "choose('once')", "Run once"), Binding("a", "choose('always')", "Always"),
                Binding("n", "choose('refuse')", "Refuse"), Binding("escape", "choose('refuse')", "Refuse")]

    def __init__(self, call: ToolCall, server: str) -> None:
        super().__init__()
        self.call, self.server = call, server

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(f"The model calls {self.call.name}" + (f" (server {self.server})" if self.server else ""),
                        classes="dialog-title")
            yield Static(_arguments(self.call.arguments), id="tool-arguments")
            with Horizontal(classes="buttons"):
                yield Button("Run once (y)", id="once", variant="primary")
                yield Button("Always for this tool (a)", id="always")
                yield Button("Refuse (n)", id="refuse", variant="error")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_choose(event.button.id or "refuse")

    def action_choose(self, choice: str) -> None:
        self.dismiss(Choice(choice))


def ask_from_worker(app: App, call: ToolCall, server: str, cancel: threading.Event) -> Choice:
    """Ask about one call from a worker thread and wait for the answer; Esc on the chat (`cancel`) refuses it
    and closes the dialog."""
    answer: concurrent.futures.Future[Choice] = concurrent.futures.Future()
    app.call_from_thread(app.push_screen, ToolCallScreen(call, server), answer.set_result)
    while not cancel.is_set():
        try:
            return answer.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            continue
    if not answer.done():
        app.call_from_thread(_close_question, app)
    return Choice.REFUSE


def _close_question(app: App) -> None:
    if isinstance(app.screen, ToolCallScreen):
        app.screen.dismiss(Choice.REFUSE)


class _ToolList(SelectionList[str]):
    """Enter saves the dialog, Space ticks. Keys typed ahead (a fast typist, a paste) must all count, in order: Enter
    is bound here on the focused list, not as the screen's priority binding, which runs as its key arrives, ahead of
    the keys typed before it still waiting in the list's queue; and Space ticks at once, not through the message the
    list posts to itself, which an Enter already queued would overtake. Either way the choice was saved without
    what was typed before Enter."""

    BINDINGS = [Binding("enter", "screen.save", "Save", show=False)]

    def action_select(self) -> None:
        if self.highlighted is not None:
            self.toggle(self.get_option_at_index(self.highlighted))


class _CallFirst(Checkbox):
    """Enter saves here too, once Tab has brought the focus (Space ticks)."""

    BINDINGS = [Binding("enter", "screen.save", "Save", show=False)]


class ToolsScreen(ModalScreen["ToolChoice | None"]):
    """The tools this conversation offers the model: each configured tool, ticked or not, and whether each reply
    begins with a call. Enter saves (none ticked: tools off), Esc leaves them as they were (dismissed with None)."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+a", "all", "All"),
                Binding("ctrl+t", "call_first", "Call first")]

    def __init__(self, tools: list[tuple[str, str]], chosen: ToolChoice | None) -> None:
        super().__init__()
        self.tools, self.chosen = tools, chosen  # (name, description) each; the conversation's choice (None: off)

    def compose(self) -> ComposeResult:
        ticked = self.chosen.names if self.chosen is not None else ()
        with Vertical(classes="dialog"):
            yield Label("Tools for this conversation", classes="dialog-title")
            yield _ToolList(*((f"{name}  {description[:60]}", name, name in ticked)
                              for name, description in self.tools), id="tool-list")
            yield _CallFirst("Call first: each reply begins with a call, then answers in words (for a small model, "
                             "which will not decide to call by itself)", self.chosen is not None and self.chosen.call_first,
                             id="call-first")
            yield Static("Space ticks a tool · Ctrl+A ticks all · Ctrl+T call first · Enter saves (none ticked: tools "
                         "off) · Esc cancels", classes="hint")

    def on_mount(self) -> None:
        self.query_one(SelectionList).focus()

    def action_all(self) -> None:
        self.query_one(SelectionList).select_all()

    def action_call_first(self) -> None:
        self.query_one(Checkbox).toggle()

    def action_save(self) -> None:
        self.dismiss(ToolChoice(tuple(self.query_one(SelectionList).selected), self.query_one(Checkbox).value))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ChatTools:
    """The chat screen's tools: F5 (the servers started the first time, then the dialog, whose choice is saved with
    the conversation), and the generation's agent loop with the tools the user let run without asking: per
    conversation, for this session, so that "always" holds for the conversation's next answers too."""

    def __init__(self, screen: ChatScreen) -> None:
        self.screen = screen
        self._always: dict[int, set[str]] = {}  # by conversation id

    def choose(self) -> None:
        """F5: choose the tools this conversation offers the model, from the configured MCP servers' (started now,
        the first time)."""
        app = self.screen.chat_app
        self.screen.status("starting the MCP servers…" if app.toolbox is None else "")
        # A worker of the screen's, as before: exclusive, so F5 pressed again while servers start waits for none.
        self.screen.run_worker(self._offer, thread=True, exclusive=True, group="tools")

    def _offer(self) -> None:
        """In a worker: start the servers (a server may take seconds), then offer their tools in the dialog."""
        app, screen = self.screen.chat_app, self.screen
        try:
            box, problems = app.start_toolbox()
        except SpecchatError as e:
            app.call_from_thread(screen.status, "")
            app.call_from_thread(app.notify, str(e), severity="error", timeout=15)
            return
        for line in problems:
            app.call_from_thread(app.notify, line, severity="warning", timeout=15)
        described = box.described()
        app.call_from_thread(screen.status, "")
        if not described:
            app.call_from_thread(app.notify, "The configured MCP servers offer no tools", severity="warning")
        elif screen.conversation is not None:
            app.call_from_thread(app.push_screen, ToolsScreen(described, screen.conversation.tools), self._chosen)

    def _chosen(self, choice: ToolChoice | None) -> None:
        conversation = self.screen.conversation
        if choice is None or conversation is None:
            return
        conversation.tools = choice if choice.names else None
        self.screen.status(f"tools for this conversation: {', '.join(choice.names)}"
                           + (" · each reply calls one first" if choice.call_first else "") if choice.names else
                           "tools off for this conversation")

    def answer(self, messages: Sequence[Message], choice: ToolChoice, answer: Answer, rounds: int,
               cancel: threading.Event) -> Iterator[Any]:
        """`with_tools` for the conversation on screen (in the generation's worker thread)."""
        always = self._always.setdefault(self.screen.conversation_id or 0, set())
        return with_tools(self.screen.chat_app, messages, choice, answer, rounds, always, cancel)
