"""The Models screen: add a model by path (with a file picker) or hub name, and pair a target with
a draft from a list that holds only compatible drafts, saying why the others are missing.

It does what `specchat add` and `specchat pair` do (specchat.models.manage), in threads: adding hashes
the file (or downloads it) and listing drafts reads every tokenizer on disk, neither of which
may freeze the screen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, DirectoryTree, Input, Label, Select, Static

from specchat.errors import SpecchatError
from specchat.models.catalog import Catalog, load_catalog, size_text
from specchat.models.fetch import on_disk
from specchat.models.manage import add_model, find_drafts, make_pair
from specchat.ui.paths import PathSuggester

NO_DRAFT = "-"  # the draft picker's "none": the target alone, with lookup


def folders_and_models(paths: Iterable[Path]) -> list[Path]:
    """What the file picker shows: folders and .gguf files, not hidden ones."""
    return [p for p in paths if not p.name.startswith(".") and (p.is_dir() or p.suffix == ".gguf")]


class GgufTree(DirectoryTree):
    def filter_paths(self, paths: Iterable[Path]) -> Iterable[Path]:
        return folders_and_models(paths)


class GgufPicker(ModalScreen[Path | None]):
    """Pick a .gguf file from the disk."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, start: Path) -> None:
        super().__init__()
        self.start = start

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog picker"):
            yield Label(f"Pick a .gguf file (Enter opens a folder or picks a file, Esc cancels): {self.start}",
                        classes="dialog-title")
            yield GgufTree(self.start, id="tree")

    def on_directory_tree_file_selected(self, event: DirectoryTree.FileSelected) -> None:
        self.dismiss(Path(event.path))

    def action_cancel(self) -> None:
        self.dismiss(None)


class ModelsScreen(ModalScreen[str | None]):
    """Dismissed with the name of the pair it made (for the caller to select), or None."""

    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, offline: bool = False) -> None:
        super().__init__()
        self.offline = offline
        self.catalog: Catalog = load_catalog()

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog models"):
            yield Label("Models (Esc closes)", classes="dialog-title")
            yield Label("Add a model: a .gguf path, hf:OWNER/REPO (its Q4_K_M file), hf:OWNER/REPO:QUANT "
                        "or hf:OWNER/REPO/FILE.gguf")
            with Horizontal(classes="row"):
                yield Input(id="source", placeholder="~/models/model.gguf or hf:OWNER/REPO", suggester=PathSuggester())
                yield Button("Browse…", id="browse")
                yield Button("Add", id="add", variant="primary")
            yield Static("", id="add-status")
            yield Label("Make a pair: the target, then a draft with its tokenizer")
            yield Select(self._targets(), id="target", prompt="target (models on disk)")
            yield Select([], id="draft", prompt="draft (pick a target first)")
            yield Static("", id="draft-notes", classes="hint")
            with Horizontal(classes="row"):
                yield Input(id="pair-name", placeholder="pair name")
                yield Button("Make pair", id="pair", variant="primary")
            yield Static("", id="pair-status", classes="error-line")

    def _targets(self) -> list[tuple[str, str]]:
        return [(f"{e.name} ({e.quantization}, {size_text(e.size)})", e.name)
                for e in self.catalog.models.values() if on_disk(e) is not None]

    # --- adding ---------------------------------------------------------------------------

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "browse":
            typed = Path(self.query_one("#source", Input).value or "~").expanduser()
            start = typed if typed.is_dir() else typed.parent if typed.parent.is_dir() else Path.home()
            self.app.push_screen(GgufPicker(start), self._picked)
        elif event.button.id == "add":
            self._add()
        elif event.button.id == "pair":
            self._pair()

    def _picked(self, path: Path | None) -> None:
        if path is not None:
            self.query_one("#source", Input).value = str(path)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "source":
            self._add()
        elif event.input.id == "pair-name":
            self._pair()

    def _add(self) -> None:
        source = self.query_one("#source", Input).value.strip()
        if not source:
            self._say("#add-status", "type a path or hf:OWNER/REPO first")
            return
        if source.startswith("hf:") and self.offline:
            self._say("#add-status", "the offline setting is on: turn it off to look up and download hub models")
            return
        self.query_one("#add", Button).disabled = True
        self._say("#add-status", f"adding {source}…")
        self._add_in_thread(source)

    @work(thread=True, exclusive=True, group="add")
    def _add_in_thread(self, source: str) -> None:
        def progress(what: str, done: int, total: int) -> None:
            self.app.call_from_thread(self._say, "#add-status", what)

        try:
            added = add_model(source, progress=progress)
        except (SpecchatError, OSError) as e:
            self.app.call_from_thread(self._added, None, str(e))
            return
        self.app.call_from_thread(self._added, added.name, f"added {added.name} ({added.entry.quantization}, "
                                                          f"{size_text(added.entry.size)})")

    def _added(self, name: str | None, message: str) -> None:
        self.query_one("#add", Button).disabled = False
        self._say("#add-status", message)
        if name is not None:
            self.catalog = load_catalog()
            target = self.query_one("#target", Select)
            target.set_options(self._targets())
            target.value = name  # the usual next step: find its draft

    # --- pairing --------------------------------------------------------------------------

    def on_select_changed(self, event: Select.Changed) -> None:
        if event.select.id == "target" and isinstance(event.value, str):
            self.query_one("#draft", Select).set_options([])
            self._say("#draft-notes", "reading the tokenizers of every model on disk…")
            self._list_drafts(event.value)
        if event.select.id in ("target", "draft"):
            target, draft = self.query_one("#target", Select).value, self.query_one("#draft", Select).value
            if isinstance(target, str):
                suffix = "" if not isinstance(draft, str) or draft == NO_DRAFT else "+" + draft
                self.query_one("#pair-name", Input).value = f"{target}{suffix}"

    @work(thread=True, exclusive=True, group="drafts")
    def _list_drafts(self, target: str) -> None:
        try:
            path = on_disk(self.catalog.model(target))
            candidates = find_drafts(path, self.catalog) if path is not None else []
        except SpecchatError as e:
            self.app.call_from_thread(self._say, "#draft-notes", str(e))
            return
        self.app.call_from_thread(self._show_drafts, candidates)

    def _show_drafts(self, candidates: list) -> None:
        usable = [c for c in candidates if c.compatible and c.name is not None]
        own = bool(candidates) and candidates[0].own
        options = [(f"{c.name} ({size_text(c.size)})", c.name) for c in usable]
        # A target with MTP layers drafts for itself: no file needed, and nothing drafts cheaper.
        if own:
            options.insert(0, ("none needed: its own MTP layers draft (the mtp guesser)", NO_DRAFT))
        else:
            options.append(("none: prompt lookup and plain decoding", NO_DRAFT))
        draft = self.query_one("#draft", Select)
        draft.set_options(options)
        draft.value = options[0][1]  # the smallest compatible draft, as `specchat pair` picks
        others = [f"{c.label}: {'not in the catalog (add it to use it)' if c.compatible else c.reason}"
                  for c in candidates if not (c.compatible and c.name is not None) and not c.own]
        self._say("#draft-notes", "Not offered:\n" + "\n".join(others) if others else "")

    def _pair(self) -> None:
        target, draft = self.query_one("#target", Select).value, self.query_one("#draft", Select).value
        name = self.query_one("#pair-name", Input).value.strip()
        if not isinstance(target, str) or not isinstance(draft, str) or not name:
            self._say("#pair-status", "pick a target and a draft, and name the pair")
            return
        try:
            make_pair(name, target, None if draft == NO_DRAFT else draft, catalog=self.catalog, choose_draft=False)
        except SpecchatError as e:
            self._say("#pair-status", str(e))
            return
        self.dismiss(name)

    def _say(self, widget: str, text: str) -> None:
        self.query_one(widget, Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)
