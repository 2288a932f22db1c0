"""specchat's terminal app: the backend, the settings and the store, under the chat screen.

The App opens a backend in a worker (through a factory that tests replace), which reports back with
messages; it applies settings and opens the rewrite screen. Everything about chatting lives in
`ChatScreen`, and every user choice about models goes through `specchat.service.choices`.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from textual import on, work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import ProgressBar

from specchat.errors import SpecchatError
from specchat.mcptools.toolbox import configured as configured_toolbox
from specchat.models.catalog import Catalog, load_catalog
from specchat.service import choices
from specchat.service.backend import Backend, BackendFactory
from specchat.service.choices import ModelChoice, RemoteChoice, same_models, where_to_chat
from specchat.service.local import open_backend
from specchat.service.settings import Settings, load_settings, save_settings
from specchat.store.conversations import Store
from specchat.store.files import log_path
from specchat.ui.chat import ChatScreen
from specchat.ui.conversations import ConversationSearch
from specchat.ui.screens import ErrorScreen, HelpScreen, SettingsScreen

if TYPE_CHECKING:
    from specchat.mcptools.toolbox import Toolbox


def settle_memory() -> None:
    """What is alive once the models have loaded (modules, styles, the screen, the models' Python side) lives as
    long as the session: frozen out of Python's garbage collector, whose full collections walk every object there
    is. One came at a random moment of an answer every few answers and took the UI thread 50-90 ms (bench/ui_cost:
    more than the drawing of the whole answer otherwise takes); the young objects an answer makes are still
    collected. Run again after a reload, so what the old models left is collected first, not frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


class BackendProgress(TMessage):
    def __init__(self, what: str, done: int, total: int) -> None:
        super().__init__()
        self.what, self.done, self.total = what, done, total


class BackendReady(TMessage):
    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self.backend = backend


class BackendFailed(TMessage):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class SpecchatApp(App[None]):
    CSS_PATH = "specchat.tcss"
    # Below 120 columns the conversation list hides and the stats panel narrows (see the CSS).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    TITLE = "specchat"
    COMMANDS = App.COMMANDS | {ConversationSearch}
    BINDINGS = [
        Binding("ctrl+s", "settings", "Settings"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit"),
    ]

    def __init__(self, choice: ModelChoice | None = None, backend_factory: BackendFactory | None = None,
                 store: Store | None = None, settings_path: Path | None = None,
                 rewrite_file: Path | None = None, remote: RemoteChoice | None = None,
                 api_key: str | None = None, toolbox_factory: Callable[[], Toolbox] | None = None) -> None:
        super().__init__()
        self.choice = choice or ModelChoice()  # what the command line said; the settings fill the rest
        # The command line's --server wins over the server setting, until Settings changes that setting.
        # The API key (--api-key or SPECCHAT_API_KEY) lives only in memory, never in the settings file.
        self.remote, self.api_key = remote, api_key
        self.store = store or Store()
        self.settings_path = settings_path
        self.settings, self._settings_problems = load_settings(settings_path)
        # Tests pass one that makes a scripted backend; the app's own copies from its conversations.
        self.backend_factory = backend_factory or (lambda choice: open_backend(choice, self.store))
        self.backend: Backend | None = None
        # The configured MCP servers, started the first time a conversation's tools are chosen (F5): nothing
        # starts or connects before. Tests pass a factory for servers of their own.
        self.toolbox_factory = toolbox_factory or configured_toolbox
        self.toolbox: Toolbox | None = None
        self.catalog: Catalog | None = None
        self.ready = False
        self.rewrite_file = rewrite_file
        if self.settings.theme in self.available_themes:
            self.theme = self.settings.theme
        self._remember_theme = False  # from on_mount on: the initial theme is not a choice to save

    def get_default_screen(self) -> ChatScreen:
        return ChatScreen()

    @property
    def chat(self) -> ChatScreen:
        """The chat screen: the bottom of the screen stack, under any dialog or the rewrite screen."""
        return self.screen_stack[0]  # type: ignore[return-value]

    # What tests and the endurance harness look at, kept on the App for them.
    @property
    def conversation_id(self) -> int | None:
        return self.chat.conversation_id

    @property
    def generating(self) -> bool:
        return self.chat.busy

    def on_mount(self) -> None:
        _log_to_file()
        if self.store.notice:
            self.notify(self.store.notice, severity="error", timeout=30)
        for problem in self._settings_problems:
            self.notify(problem, severity="warning", timeout=10)
        try:
            self.catalog = load_catalog()
        except SpecchatError as e:
            self.push_screen(ErrorScreen(str(e)))
        self._remember_theme = True
        self.load_backend()

    def start_toolbox(self) -> tuple[Toolbox, list[str]]:
        """The configured MCP servers, started the first time (called from a worker: a server may take seconds);
        a line for each that did not start. Raises, in one line, where none is configured."""
        if self.toolbox is None:
            self.toolbox = self.toolbox_factory()
        return self.toolbox, self.toolbox.start()

    def on_unmount(self) -> None:
        if self.toolbox is not None:
            self.toolbox.close()  # each server's process has exited when this returns

    def watch_theme(self, theme: str) -> None:
        # Remembered across restarts (the command palette's "Change theme" sets it).
        if getattr(self, "_remember_theme", False) and theme != self.settings.theme:
            self.apply_settings(replace(self.settings, theme=theme))

    # --- the backend ------------------------------------------------------------------------

    def load_backend(self) -> None:
        """Open the backend the command line and the settings choose, in a worker; the old one is freed
        there first (after any answer it is writing: closing waits for it)."""
        old, self.backend, self.ready = self.backend, None, False
        self._open_backend(old, where_to_chat(self.choice, self.remote, self.settings, self.api_key))

    @work(thread=True, exclusive=True, group="load")
    def _open_backend(self, old: Backend | None, choice: ModelChoice | RemoteChoice) -> None:
        # The messages go to the chat screen, which shows the progress, and bubble up to the App: they are
        # handled only once that screen is there, however fast a backend loads.
        post = self.chat.post_message
        if old is not None:
            old.close()
        try:
            backend = self.backend_factory(choice)
            backend.load(lambda what, done, total: post(BackendProgress(what, done, total)))
        except SpecchatError as e:
            post(BackendFailed(str(e)))
            return
        except OSError as e:  # a full disk or an unreadable file while fetching or loading
            post(BackendFailed(f"{e.strerror or e}: {e.filename or ''}".strip(": ")))
            return
        post(BackendReady(backend))

    @on(BackendProgress)
    def _backend_progress(self, message: BackendProgress) -> None:
        self._progress(message.done, message.total)
        self.chat.status(message.what + ("…" if message.done < message.total else ""))

    def _progress(self, done: float, total: float) -> None:
        """The bar under the chat while models load. Steps without a size (loading, measuring) show as an
        indeterminate bar, which animates; once hidden it is made still, as its animation would go on drawing
        the screen 15 times a second for the rest of the session, each time a frame the decoding pays for."""
        bar = self.chat.query_one("#progress", ProgressBar)
        bar.display = done < total
        bar.update(total=(total if total > 1 else None) if bar.display else 1, progress=done if bar.display else 1)

    @on(BackendFailed)
    def _backend_failed(self, message: BackendFailed) -> None:
        self.fail(message.message)

    def fail(self, message: str) -> None:
        self._progress(1, 1)
        self.chat.status(f"error: {message}")
        self.push_screen(ErrorScreen(message))

    @on(BackendReady)
    def _backend_ready(self, message: BackendReady) -> None:
        backend = self.backend = message.backend
        self.ready = True
        # The guesser's line is said now, once: e.g. draft, its draft left out. The thinking line waits for an answer.
        answering = choices.answering(self.settings, backend.guessers, backend.thinking_switch)
        if answering.guesser_notice is not None:  # auto for this session; the saved setting stays the user's
            if not backend.warnings:  # which otherwise say what was left out (the status line names auto)
                self.notify(answering.guesser_notice, severity="warning", timeout=20)
            self.settings = replace(self.settings, guesser=answering.guesser)
        self._progress(1, 1)
        for warning in backend.warnings:  # e.g. the draft failed to load: lookup and plain decoding still work
            self.notify(warning, severity="warning", timeout=20)
        only = " · lookup and plain decoding only (see the notice)" if backend.warnings and backend.draft is None \
            else ""
        self.chat.status(f"ready · guesser {self.chat.answers.guesser_label()} · {backend.name}{only}")
        self.chat.answers.reset_stats()
        self.chat.answers.show_context(None)
        self.chat.refresh_bindings()
        settle_memory()
        if self.rewrite_file is not None:
            path, self.rewrite_file = self.rewrite_file, None
            self.open_rewrite(path)

    # --- settings, help, rewrite ------------------------------------------------------------

    def action_settings(self) -> None:
        if self.catalog is None:
            self.notify("The model catalog could not be read (see the error); fix it and restart", severity="error")
            return
        try:
            self.catalog = load_catalog()  # `specchat add` in another terminal may have changed it
        except SpecchatError as e:
            self.notify(str(e), severity="error", timeout=20)
        compatibility = {}
        if self.backend is not None and self.ready and self.backend.pair is not None:
            name = self.backend.pair or self.catalog.default_pair
            compatibility[name] = "draft compatible (checked on load)" if self.backend.draft else "no draft"
        guessers = self.backend.guessers if self.backend is not None and self.ready else None
        self.push_screen(SettingsScreen(self.settings, self.catalog, compatibility, guessers), self.apply_settings)

    def apply_settings(self, settings: Settings | None) -> None:
        if settings is None:
            return
        before = where_to_chat(self.choice, self.remote, self.settings, self.api_key)
        if settings.server != self.settings.server:
            self.remote = None  # the setting now says where to chat: this machine, or that server
        # Which settings choose the models is service/choices.py's to say: reload when the choice changes.
        reload = not same_models(before, where_to_chat(self.choice, self.remote, settings, self.api_key))
        self.settings = settings
        try:
            save_settings(settings, self.settings_path)
        except OSError as e:  # the setting still applies to this session
            self.notify(f"could not save the settings: {e.strerror or e}", severity="error", timeout=10)
        self.chat.status(f"guesser {settings.guesser}")
        if self.backend is not None and self.ready and not self.chat.busy:  # a streaming answer keeps its figures
            self.chat.answers.reset_stats()
        if reload:
            self.load_backend()

    def action_help(self) -> None:
        bindings = [*self.chat.BINDINGS, *self.BINDINGS]
        self.push_screen(HelpScreen([(b.key, b.description) for b in bindings]))

    def open_rewrite(self, path: Path) -> None:
        from specchat.ui.rewrite import RewriteScreen

        try:
            screen = RewriteScreen(path, self.backend if self.ready else None, self.settings)
        except SpecchatError as e:
            self.push_screen(ErrorScreen(str(e)))
            return
        self.push_screen(screen)

    # --- the command palette ----------------------------------------------------------------

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        # Every key's action, run where it is defined: the chat screen's, or the App's own.
        for namespace, bindings in ((self.chat, self.chat.BINDINGS), (self, self.BINDINGS)):
            for binding in bindings:
                if binding.action != "quit":
                    yield SystemCommand(binding.description, f"{binding.description} ({binding.key})",
                                        lambda ns=namespace, action=binding.action: self._command(ns, action))

    async def _command(self, namespace: App | Screen, action: str) -> None:
        """Run a palette command, or say why it cannot run now (the key would be disabled)."""
        name = action.split("(")[0]  # "branch(1)": the action branch, given 1
        why = self.chat.disabled_reason(name) if namespace is self.chat else None
        if why is not None:
            self.notify(f"Cannot {name.replace('_', ' ')} now: {why}", severity="warning")
            return
        await namespace.run_action(action)


def _log_to_file() -> None:
    """Errors that are bugs go, with their traceback, to a log file rather than over the screen."""
    logger = logging.getLogger("specchat")
    if not any(isinstance(h, logging.FileHandler) for h in logger.handlers):
        try:
            log_path().parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(log_path(), encoding="utf-8")
        except OSError:  # a read-only home: the message on screen still says what happened
            return
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
        logger.addHandler(handler)
