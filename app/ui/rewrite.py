"""Document rewrite mode: pick an instruction, stream the rewrite with prompt lookup drawing
on the document, review a diff, save next to the original (overwrite only when confirmed)."""

from __future__ import annotations

import threading
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static, TextArea

from specchat.backend import Backend
from specchat.documents import PRESETS, diff_lines, output_path, read_document, rewrite_messages, save, split_paragraphs
from specchat.errors import SpecchatError
from specchat.spec.engine import Done, Step
from specchat.store.settings import Settings
from specchat.ui.screens import ConfirmScreen
from specchat.ui.widgets import StatsPanel

CUSTOM = "custom"


class RewriteScreen(Screen[None]):
    BINDINGS = [Binding("ctrl+r", "start", "Rewrite"), Binding("escape", "stop_or_close", "Stop / back"),
                Binding("ctrl+s", "save", "Save new file"), Binding("ctrl+w", "overwrite", "Overwrite original")]

    def __init__(self, path: Path, backend: Backend | None, settings: Settings) -> None:
        super().__init__()
        if backend is None:
            raise SpecchatError("the models are still loading; open the document again in a moment")
        self.path, self.backend, self.settings = path, backend, settings
        self.original = read_document(path)
        self.result: str | None = None
        self.cancel = threading.Event()
        self.running = False

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="doc-pane"):
                yield Label(f"Original: {self.path.name}", classes="title")
                yield TextArea(self.original, read_only=True, id="original")
            with Vertical(id="rewrite-pane"):
                with Horizontal(id="instruction-row"):
                    yield Select([(k, v) for k, v in PRESETS.items()] + [("Custom…", CUSTOM)],
                                 value=next(iter(PRESETS.values())), id="preset", allow_blank=False)
                    yield Button("Rewrite", id="go", variant="primary")
                yield Input(placeholder="Custom instruction", id="custom")
                yield Label("Rewrite", classes="title", id="result-title")
                yield TextArea("", read_only=True, id="result")
                yield VerticalScroll(Static("", id="diff"), id="diff-pane")
                yield Static("", id="rewrite-status")
            yield StatsPanel(id="rewrite-stats")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#custom").display = False
        self.query_one("#diff-pane").display = False

    @on(Select.Changed, "#preset")
    def _preset(self, event: Select.Changed) -> None:
        self.query_one("#custom").display = event.value == CUSTOM

    def instruction(self) -> str:
        value = self.query_one("#preset", Select).value
        if value == CUSTOM:
            return self.query_one("#custom", Input).value.strip()
        return str(value)

    @on(Button.Pressed, "#go")
    def _go(self, event: Button.Pressed) -> None:
        self.action_start()

    def action_start(self) -> None:
        instruction = self.instruction()
        if self.running or not instruction:
            return
        self.running, self.result = True, None
        self.cancel.clear()
        self.query_one("#result", TextArea).text = ""
        self.query_one("#diff-pane").display = False
        stats = self.query_one(StatsPanel)
        stats.reset(self.backend.name, self.backend.baseline(), "lookup")
        # Leave room for the answer: it is about as long as the chunk it rewrites.
        budget = max(128, (self.backend_ctx() - 200) // 2)
        chunks = split_paragraphs(self.original, budget, self.backend.count_tokens)
        self._run(instruction, chunks, stats, self.query_one("#result", TextArea), budget)

    def backend_ctx(self) -> int:
        target = getattr(self.backend, "target", None)
        return target.n_ctx if target is not None else 4096

    @work(thread=True, exclusive=True, group="rewrite")
    def _run(self, instruction: str, chunks: list[str], stats: StatsPanel, result_box: TextArea,
             budget: int) -> None:
        results: list[str] = []
        config = self.settings.generation()
        config = type(config)(config.sampling, budget + 64, config.draft_length, ())
        for n, chunk in enumerate(chunks, 1):
            self.app.call_from_thread(self._set_status, f"rewriting part {n} of {len(chunks)}… (Esc stops)")
            done = None
            try:
                for event in self.backend.chat(rewrite_messages(instruction, chunk), config, "lookup", self.cancel):
                    if isinstance(event, Step):
                        self.app.call_from_thread(stats.add, [event])
                        if event.text:
                            self.app.call_from_thread(result_box.insert, event.text, result_box.document.end)
                    elif isinstance(event, Done):
                        done = event
            except SpecchatError as e:
                self.app.call_from_thread(self._set_status, f"error: {e}")
                break
            if done is None or done.reason == "cancelled":
                self.app.call_from_thread(self._set_status, "stopped: nothing was saved")
                break
            results.append(done.text.strip())
            if n < len(chunks):
                self.app.call_from_thread(result_box.insert, "\n\n", result_box.document.end)
        else:
            self.app.call_from_thread(self._finished, "\n\n".join(results), stats)
        self.app.call_from_thread(setattr, self, "running", False)

    def _set_status(self, text: str) -> None:
        self.query_one("#rewrite-status", Static).update(text)

    def _finished(self, text: str, stats: StatsPanel) -> None:
        self.result = text
        self.query_one("#result", TextArea).text = text
        diff = Text()
        for line in diff_lines(self.original, text, self.path.name):
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
            diff.append(line + "\n", style=style)
        self.query_one("#diff", Static).update(diff)
        self.query_one("#diff-pane").display = True
        tokens, tps = stats.totals.n_tokens, stats.totals.tokens_per_s
        base = self.backend.baseline()
        speed = f"{tps:.1f} tok/s" + (f", {tps / base.tokens_per_s:.2f}x plain decoding" if base else "")
        self._set_status(f"done: {tokens} tokens, {speed} with prompt lookup. Ctrl+S saves a new file, "
                         "Ctrl+W overwrites the original")

    def action_save(self) -> None:
        if self.result is None:
            self.notify("Nothing to save yet", severity="warning")
            return
        try:
            path = save(self.result, output_path(self.path))
        except OSError as e:  # a full disk or a read-only folder: the rewrite stays here to retry
            self.notify(f"could not save next to {self.path}: {e.strerror}; the original is unchanged",
                        severity="error", timeout=15)
            return
        self.notify(f"Saved to {path}")
        self._set_status(f"saved to {path} (the original is unchanged)")

    def action_overwrite(self) -> None:
        if self.result is None:
            return
        result = self.result

        def done(yes: bool | None) -> None:
            if not yes:
                return
            try:
                save(result, self.path)
            except OSError as e:
                self.notify(f"could not overwrite {self.path}: {e.strerror}; it is unchanged", severity="error",
                            timeout=15)
                return
            self.notify(f"Overwrote {self.path}")
        self.app.push_screen(ConfirmScreen(f"Overwrite {self.path} with the rewrite?"), done)

    def action_stop_or_close(self) -> None:
        if self.running:
            self.cancel.set()
        else:
            self.app.pop_screen()
