"""Tools in the app: which of the configured MCP servers' tools a conversation offers the model (F5), and the
question before each call runs: once, always for that tool (in this conversation), or no.

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
from textual.widgets import Button, Label, SelectionList, Static

from specchat.llama.template import Message, ToolCall
from specchat.mcptools.agent import Choice, agent_loop
from specchat.service.events import Notice

if TYPE_CHECKING:
    from specchat.ui.app import SpecchatApp

Answer = Callable[[Sequence[Message], "list[dict[str, Any]] | None"], Iterator[Any]]


def with_tools(app: SpecchatApp, messages: Sequence[Message], names: Sequence[str], answer: Answer, rounds: int,
               always: MutableSet[str], cancel: threading.Event) -> Iterator[Any]:
    """The agent loop over `answer(conversation, tools)` (in a worker thread), offering the tools `names` lists;
    the servers are started first where they are not yet, a Notice for each that did not start."""
    box, problems = app.start_toolbox()
    for line in problems:
        yield Notice(line)
    schemas = box.schemas(names)
    yield from agent_loop(lambda conversation, offered: answer(conversation, schemas if offered else None), messages,
                          box.call, lambda call: ask_from_worker(app, call, box.server_of(call.name), cancel), rounds,
                          always)


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


class ToolsScreen(ModalScreen["list[str] | None"]):
    """The tools this conversation offers the model: each configured tool, ticked or not. Enter saves (none
    ticked: tools off), Esc leaves them as they were. Dismissed with the names ticked, or None for no change."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("enter", "save", "Save", priority=True),
                Binding("ctrl+a", "all", "All")]

    def __init__(self, tools: list[tuple[str, str]], chosen: list[str] | None) -> None:
        super().__init__()
        self.tools, self.chosen = tools, chosen  # (name, description) each; the conversation's choice (None: off)

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Tools for this conversation", classes="dialog-title")
            yield SelectionList[str](*((f"{name}  {description[:60]}", name, self.chosen is not None and name in self.chosen)
                                       for name, description in self.tools), id="tool-list")
            yield Static("Space ticks a tool · Ctrl+A ticks all · Enter saves (none ticked: tools off) · Esc cancels",
                         classes="hint")

    def on_mount(self) -> None:
        self.query_one(SelectionList).focus()

    def action_all(self) -> None:
        self.query_one(SelectionList).select_all()

    def action_save(self) -> None:
        self.dismiss(list(self.query_one(SelectionList).selected))

    def action_cancel(self) -> None:
        self.dismiss(None)
