"""Modal screens: errors, confirmations, text prompts, help and settings."""

from __future__ import annotations

from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, TextArea

from specchat.decoding.guessers import GUESSERS
from specchat.errors import SpecchatError
from specchat.models.catalog import Catalog, load_catalog, size_text
from specchat.models.fetch import on_disk
from specchat.service.choices import THINKING
from specchat.service.settings import Settings
from specchat.ui.models import ModelsScreen
from specchat.ui.paths import PathSuggester


class ErrorScreen(ModalScreen[None]):
    """A problem the user can act on: one clear message, never a traceback."""

    BINDINGS = [Binding("escape", "dismiss", "Close"), Binding("q", "app.quit", "Quit")]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog error"):
            yield Label("specchat could not continue", classes="dialog-title")
            yield Static(self.message, id="error-message")
            yield Static("Esc to close, q to quit", classes="hint")


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("y", "confirm", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question)
            with Horizontal(classes="buttons"):
                yield Button("Yes (y)", id="yes", variant="error")
                yield Button("No (Esc)", id="no")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_cancel(self) -> None:
        self.dismiss(False)


class PromptScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, title: str, value: str = "", complete_paths: bool = False) -> None:
        super().__init__()
        self.title_text, self.value = title, value
        self.suggester = PathSuggester() if complete_paths else None

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label(self.title_text, classes="dialog-title")
            yield Input(self.value, id="prompt-input", suggester=self.suggester)
            if self.suggester is not None:
                yield Static("→ completes the path", classes="hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Label("Keys (every action is also in the command palette, Ctrl+P)", classes="dialog-title")
            yield Static("\n".join(f"{key:>14}  {text}" for key, text in self.rows))
            yield Static("Colours with provenance on: green = accepted guess, red = target correction, "
                         "cyan = bonus token.", classes="hint")


THINKING_LABELS = {"default": "as the model does unasked", "on": "on: think before answering",
                   "off": "off: answer at once"}


class SettingsScreen(ModalScreen[Settings | None]):
    """Every setting, validated as a whole on save; the pair picker shows what is on disk."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: Settings, catalog: Catalog, compatibility: dict[str, str],
                 guessers: list[str] | None = None) -> None:
        super().__init__()
        self.settings, self.catalog, self.compatibility = settings, catalog, compatibility
        # What the loaded models can run (None: not known, every one is offered).
        self.guessers = list(GUESSERS) if guessers is None else guessers

    def _pair_label(self, name: str) -> str:
        pair = self.catalog.pairs[name]
        parts = []
        for model in (pair.target, pair.draft):
            if model is None:
                parts.append("no draft (lookup)")
                continue
            m = self.catalog.models[model]
            parts.append(f"{m.name} ({m.quantization}, {size_text(m.size)}, {'on disk' if on_disk(m) else 'not on disk'})")
        return f"{name}: {' + '.join(parts)} · {self.compatibility.get(name, 'compatibility checked on load')}"

    def _pair_options(self) -> list[tuple[str, str]]:
        return [(self._pair_label(n), n) for n in self.catalog.pairs]

    def compose(self) -> ComposeResult:
        s = self.settings
        with VerticalScroll(classes="dialog settings"):
            yield Label("Settings (Ctrl+S saves, Esc cancels)", classes="dialog-title")
            yield Label("Server URL: an OpenAI-compatible server to chat with instead (empty: this machine's models)")
            yield Input(s.server, id="server", placeholder="http://HOST:8080")
            yield Label("Model pair")
            with Horizontal(classes="row"):
                yield Select(self._pair_options(), value=s.pair or self.catalog.default_pair, id="pair",
                             allow_blank=False)
                yield Button("Models…", id="models")
            yield Label("Guesser")
            offered = self.guessers if s.guesser in self.guessers else [*self.guessers, s.guesser]
            yield Select([(g, g) for g in offered], value=s.guesser, id="guesser", allow_blank=False)
            yield Label("Thinking, for reasoning models whose template has a switch (F4 in the chat)")
            yield Select([(THINKING_LABELS[t], t) for t in THINKING], value=s.thinking, id="thinking", allow_blank=False)
            with Grid(classes="numbers"):
                for key, label in (("temperature", "Temperature"), ("top_p", "Top-p"), ("top_k", "Top-k"),
                                   ("min_p", "Min-p"), ("max_tokens", "Max tokens"),
                                   ("draft_length", "Draft length (0 = default)"), ("seed", "Seed (-1 = random)"),
                                   ("context", "Context size (tokens)"), ("threads", "Threads (0 = every core)"),
                                   ("gpu_layers", "GPU layers, target (-1 = all)"),
                                   ("draft_gpu_layers", "GPU layers, draft (-1 = all)"),
                                   ("tool_rounds", "Tool rounds per answer (F5: tools)")):
                    yield Label(label)
                    yield Input(str(getattr(s, key)), id=key)
            yield Label("System prompt")
            yield TextArea(s.system_prompt, id="system_prompt")
            yield Checkbox("Offline: never fetch models (only files already on disk are used)", s.offline,
                           id="offline")
            yield Static("", id="settings-error", classes="error-line")
            with Horizontal(classes="buttons"):
                yield Button("Save", id="save", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "models":
            self.app.push_screen(ModelsScreen(self.query_one("#offline", Checkbox).value), self._models_changed)
        else:
            self.action_save() if event.button.id == "save" else self.dismiss(None)

    def _models_changed(self, pair: str | None) -> None:
        """Back from the Models screen: models and pairs may have been added; select the new pair."""
        self.catalog = load_catalog()
        select = self.query_one("#pair", Select)
        chosen = pair or select.value
        select.set_options(self._pair_options())
        select.value = chosen

    def action_cancel(self) -> None:
        self.dismiss(None)

    def action_save(self) -> None:
        values: dict[str, object] = {}
        try:
            for key, kind in (("temperature", float), ("top_p", float), ("top_k", int), ("min_p", float),
                              ("max_tokens", int), ("draft_length", int), ("seed", int), ("context", int),
                              ("threads", int),
                              ("gpu_layers", int), ("draft_gpu_layers", int), ("tool_rounds", int)):
                raw = self.query_one(f"#{key}", Input).value.strip()
                try:
                    values[key] = kind(raw)
                except ValueError:
                    raise SpecchatError(f"{key.replace('_', ' ')} must be a number, got {raw!r}") from None
            values["guesser"] = self.query_one("#guesser", Select).value
            values["thinking"] = self.query_one("#thinking", Select).value
            values["pair"] = self.query_one("#pair", Select).value
            values["system_prompt"] = self.query_one("#system_prompt", TextArea).text
            values["offline"] = self.query_one("#offline", Checkbox).value
            values["server"] = self.query_one("#server", Input).value.strip()
            self.dismiss(replace(self.settings, **values))
        except SpecchatError as e:
            self.query_one("#settings-error", Static).update(str(e))
