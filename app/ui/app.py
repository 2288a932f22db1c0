"""specchat's terminal app: the models, the settings and the store, under the chat screen.

The App loads a backend (in a worker, through a factory that tests replace), applies settings and
opens the rewrite screen; everything about chatting lives in `ChatScreen`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from textual import work
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.widgets import ProgressBar

from specchat.backend import Backend, BackendFactory, EngineBackend
from specchat.errors import SpecchatError
from specchat.loader import ModelChoice
from specchat.models.catalog import Catalog, load_catalog
from specchat.remote import RemoteBackend, RemoteChoice
from specchat.store.conversations import Store
from specchat.store.settings import Settings, load_settings, save_settings
from specchat.ui.chat import ChatScreen, ConversationSearch
from specchat.ui.screens import ErrorScreen, HelpScreen, SettingsScreen


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

    def __init__(self, choice: ModelChoice | None = None, backend_factory: BackendFactory = EngineBackend,
                 store: Store | None = None, settings_path: Path | None = None,
                 rewrite_file: Path | None = None, remote: RemoteChoice | None = None,
                 api_key: str | None = None) -> None:
        super().__init__()
        self.choice = choice or ModelChoice()
        # The command line's --server wins over the server setting, until Settings changes that setting.
        # The API key (--api-key or SPECCHAT_API_KEY) lives only in memory, never in the settings file.
        self.remote, self.api_key = remote, api_key
        self.store = store or Store()
        self.settings_path = settings_path
        self.settings, self._settings_problems = load_settings(settings_path)
        self.backend_factory = backend_factory  # tests pass one that makes a scripted backend
        self.backend: Backend | None = None
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

    def watch_theme(self, theme: str) -> None:
        # Remembered across restarts (the command palette's "Change theme" sets it).
        if getattr(self, "_remember_theme", False) and theme != self.settings.theme:
            self.apply_settings(replace(self.settings, theme=theme))

    # --- models ---------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def load_backend(self) -> None:
        self.ready = False
        choice = self.choice
        if self.settings.pair and choice.target is None and choice.pair is None:
            choice = replace(choice, pair=self.settings.pair)
        if self.settings.offline:  # the setting adds to HF_HUB_OFFLINE; it never turns it off
            choice = replace(choice, offline=True)
        # The command line's options win; what it leaves open comes from the settings.
        s = self.settings
        choice = replace(choice, n_ctx=choice.n_ctx or s.context, threads=choice.threads or s.threads or None,
                         gpu_layers=s.gpu_layers if choice.gpu_layers is None else choice.gpu_layers,
                         draft_gpu_layers=s.draft_gpu_layers if choice.draft_gpu_layers is None
                         else choice.draft_gpu_layers)
        if self.backend is not None:  # another pair: free the old one first (after any answer it is writing)
            self.backend.close()
            self.backend = None
        remote = self.remote or (RemoteChoice(s.server, self.api_key) if s.server else None)
        try:
            backend = RemoteBackend(remote) if remote is not None else self.backend_factory(choice)
            backend.load(lambda what, done, total: self.call_from_thread(self._progress, what, done, total))
        except SpecchatError as e:
            self.call_from_thread(self.fail, str(e))
            return
        except OSError as e:  # a full disk or an unreadable file while fetching or loading
            self.call_from_thread(self.fail, f"{e.strerror or e}: {e.filename or ''}".strip(": "))
            return
        self.call_from_thread(self._backend_ready, backend)

    def _progress(self, what: str, done: int, total: int) -> None:
        bar = self.chat.query_one("#progress", ProgressBar)
        bar.display = done < total
        # Steps without a size (loading, measuring) show as an indeterminate bar with what is happening.
        bar.update(total=total if total > 1 else None, progress=done)
        self.chat.status(what + ("…" if done < total else ""))

    def fail(self, message: str) -> None:
        self.chat.query_one("#progress").display = False
        self.chat.status(f"error: {message}")
        self.push_screen(ErrorScreen(message))

    def _backend_ready(self, backend: Backend) -> None:
        self.backend, self.ready = backend, True
        if self.settings.guesser == "draft" and not backend.has_draft:
            self.settings = replace(self.settings, guesser="auto")
        self.chat.query_one("#progress").display = False
        for warning in backend.warnings:  # e.g. the draft failed to load: lookup and plain decoding still work
            self.notify(warning, severity="warning", timeout=20)
        only = " · lookup and plain decoding only (see the notice)" if backend.warnings and not backend.has_draft else ""
        if isinstance(backend, RemoteBackend):
            self.chat.status(f"ready · remote · {backend.name}")
        else:
            self.chat.status(f"ready · guesser {self.settings.guesser} · {backend.name}{only}")
        self.chat.reset_stats()
        self.chat.show_context(None)
        self.chat.refresh_bindings()
        if self.rewrite_file is not None:
            path, self.rewrite_file = self.rewrite_file, None
            self.open_rewrite(path)

    # --- settings, help, rewrite ------------------------------------------------------------

    def action_settings(self) -> None:
        if self.catalog is None:
            return
        try:
            self.catalog = load_catalog()  # `specchat add` in another terminal may have changed it
        except SpecchatError as e:
            self.notify(str(e), severity="error", timeout=20)
        compatibility = {}
        if self.backend is not None and self.ready:
            name = self.settings.pair or self.catalog.default_pair
            compatibility[name] = "draft compatible (checked on load)" if self.backend.has_draft else "no draft"
        self.push_screen(SettingsScreen(self.settings, self.catalog, compatibility), self.apply_settings)

    def apply_settings(self, settings: Settings | None) -> None:
        if settings is None:
            return
        reload = any(getattr(settings, key) != getattr(self.settings, key)
                     for key in ("pair", "context", "threads", "gpu_layers", "draft_gpu_layers", "server"))
        if settings.server != self.settings.server:
            self.remote = None  # the setting now says where to chat: this machine, or that server
        self.settings = settings
        try:
            save_settings(settings, self.settings_path)
        except OSError as e:  # the setting still applies to this session
            self.notify(f"could not save the settings: {e.strerror or e}", severity="error", timeout=10)
        self.chat.status(f"guesser {settings.guesser}")
        if self.backend is not None and self.ready and not self.chat.busy:  # a streaming answer keeps its figures
            self.chat.reset_stats()
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

    def get_system_commands(self, screen):
        yield from super().get_system_commands(screen)
        for binding in [*self.chat.BINDINGS, *self.BINDINGS]:
            if binding.action != "quit":
                yield SystemCommand(binding.description, f"{binding.description} ({binding.key})",
                                    lambda action=binding.action: self.chat.run_action(action))
