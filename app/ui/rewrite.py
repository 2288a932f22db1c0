"""Document rewrite mode: pick an instruction, stream the rewrite with the auto guesser (prompt
lookup drawing on the document wherever the rewrite copies it), review a word diff, save next to
the original (overwrite only when confirmed)."""

from __future__ import annotations

import threading
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message as TMessage
from textual.screen import Screen
from textual.widgets import Button, Input, Label, Select, Static, TextArea

from specchat.decoding.engine import GenerationConfig
from specchat.errors import SpecchatError
from specchat.service.backend import Backend
from specchat.service.choices import Given, answering
from specchat.service.documents import PRESETS, Parts, Review, open_document, output_path, rewrite_requests, save, unchanged_since
from specchat.service.events import Answered
from specchat.service.settings import Settings
from specchat.ui.keyline import KeyLine
from specchat.ui.screens import ConfirmScreen
from specchat.ui.streaming import GenerationBatch, Pump
from specchat.ui.widgets import StatsPanel

# The guesser rewrites run with: auto copies from the document where the rewrite follows it and
# decodes plainly where it does not, so it never loses to plain decoding the way fixed-length
# lookup does on a CPU.
GUESSER = "auto"
# An accepted change shows what it removes and adds; a rejected one its original words as they stay, and
# the words it would have put, dimmed.
DIFF_STYLE = {"same": "", "removed": "strike red", "added": "bold green", "kept": "", "declined": "dim strike"}
DIFF_MARKS = {"same": ("", ""), "removed": ("[-", "-]"), "added": ("{+", "+}"),  # as git diff --word-diff
              "kept": ("", ""), "declined": ("{x", "x}")}
CURRENT = " reverse"  # the change that the review keys act on


def _marked(run: str, kind: str, current: bool = False) -> tuple[str, str]:
    start, end = DIFF_MARKS[kind]
    shown = run.replace("\n", "⏎\n") if kind != "same" and not run.strip() else run  # a joined paragraph shows
    return start + shown + end, DIFF_STYLE[kind] + (CURRENT if current else "")

CUSTOM = "custom"


class RewriteScreen(Screen[None]):
    BINDINGS = [Binding("ctrl+r", "start", "Rewrite"), Binding("escape", "stop_or_close", "Stop / back"),
                # Priority: the review keys work wherever the focus is (the text areas have their own ctrl+y).
                Binding("ctrl+down", "move(1)", "Next change", priority=True),
                Binding("ctrl+up", "move(-1)", "Previous", priority=True),
                Binding("ctrl+y", "decide(True)", "Accept", priority=True),
                Binding("ctrl+n", "decide(False)", "Reject", priority=True),
                Binding("alt+y", "decide_all(True)", "Accept all", show=False, priority=True),
                Binding("alt+n", "decide_all(False)", "Reject all", show=False, priority=True),
                Binding("ctrl+s", "save", "Save new file"), Binding("ctrl+w", "overwrite", "Overwrite original", priority=True)]

    def __init__(self, path: Path, backend: Backend | None, settings: Settings, guesser: str = GUESSER) -> None:
        super().__init__()
        self.guesser = guesser  # bench/rewrite runs plain decoding ("none") through the same screen
        if backend is None:
            raise SpecchatError("the models are still loading; open the document again in a moment")
        self.path, self.backend, self.settings = path, backend, settings
        self.document = open_document(path)  # as it is on disk: saves keep its encoding and line ends
        self.review: Review | None = None  # the finished rewrite, change by change
        self.current = 0  # the change the review keys act on
        self.cancel = threading.Event()
        self.running = False
        self.error: str | None = None  # the rewrite's failure, as the last batch said it
        # A rewrite stopped before its last part: its instruction, the parts and the rewrites of those done, so that
        # Ctrl+R with the same instruction goes on from where it stopped.
        self.unfinished: tuple[str, Parts, list[str]] | None = None

    @property
    def result(self) -> str | None:
        """What saving writes now: the document with the accepted changes (None until a rewrite is done)."""
        return self.review.text if self.review is not None else None

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="doc-pane"):
                yield Label(f"Original: {self.path.name}", classes="title")
                yield TextArea(self.document.text, read_only=True, id="original")
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
        yield KeyLine()

    def on_mount(self) -> None:
        self.query_one("#custom").display = False
        self.query_one("#diff-pane").display = False
        # Which model and guesser will rewrite, said before the first Ctrl+R as the chat says it before its first answer.
        self.query_one(StatsPanel).reset(self.backend.name, self.backend.baseline(), self.guesser)

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
        unfinished = self.unfinished if self.unfinished is not None and self.unfinished[0] == instruction else None
        before, self.unfinished = (self.review if unfinished else None), None
        self.running, self.review, self.error = True, None, None
        self.cancel.clear()
        self.query_one("#result", TextArea).text = ""
        self.query_one("#diff-pane").display = False
        self.query_one(StatsPanel).reset(self.backend.name, self.backend.baseline(), self.guesser)
        # The settings' sampling and lengths; the guesser is the screen's own. A rewrite sends no system prompt and
        # leaves thinking to the model, so their lines are not said here.
        config = answering(self.settings, self.backend.guessers, self.backend.thinking_switch,
                           Given(guesser=self.guesser)).config
        self._run(instruction, config, unfinished[1:] if unfinished else None, before)

    class Progress(TMessage):
        """From the rewrite worker, in order with its generation batches (a call_from_thread could
        overtake batches still queued): a status line, and at the end the review of the rewrite, or None; with it,
        where it ended before the last part, what Ctrl+R goes on from (`unfinished`), and whether it went on from a
        stopped rewrite, with the decisions made on it (`resumed`)."""

        def __init__(self, status: str, result: Review | None = None, finished: bool = False,
                     unfinished: tuple[str, Parts, list[str]] | None = None, resumed: bool = False) -> None:
            super().__init__()
            self.status, self.result, self.finished = status, result, finished
            self.unfinished, self.resumed = unfinished, resumed

    @work(thread=True, exclusive=True, group="rewrite")
    def _run(self, instruction: str, config: GenerationConfig, resumed: tuple[Parts, list[str]] | None = None,
             before: Review | None = None) -> None:
        """Rewrite the document part by part, or go on with `resumed` (its parts, and the rewrites of those done),
        keeping `before`'s decisions on the parts done."""
        # Cut into parts here, not on the screen's thread: a long document takes a while to tokenize, and the
        # screen stays drawn and answers keys meanwhile.
        self.post_message(self.Progress("reading the document… (Esc stops)"))
        try:
            parts, requests = rewrite_requests(instruction, self.document.text, self.backend.n_ctx,
                                               self.backend.count_tokens, config)
        except SpecchatError as e:  # said before any part is rewritten, not after
            self.post_message(self.Progress(f"error: {e}", finished=True))
            return
        results = list(resumed[1]) if resumed is not None and resumed[0] == parts else []
        done: Answered | None = None
        for n, (messages, part_config) in enumerate(requests[len(results):], len(results) + 1):
            self.post_message(self.Progress(f"rewriting part {n} of {len(requests)}… (Esc stops)"))
            done = Pump(self).run(self.backend.chat(messages, part_config, self.guesser, self.cancel))
            if done is None or done.reason == "cancelled":
                break
            results.append(done.text.strip())
        if requests and not results:  # a failure's own line stays (its batch said it)
            self.post_message(self.Progress("stopped: nothing was saved" if done else "", finished=True))
            return
        # Stopped or failed after some parts: those are kept for review, the rest of the document as it was, and
        # Ctrl+R goes on from there. Minutes of rewriting on a CPU are not thrown away for one Esc.
        review = Review.of_parts(parts, results + list(parts.texts[len(results):]))
        if before is not None:
            review.keep_decisions(before)
        unfinished = (instruction, parts, results) if len(results) < len(requests) else None
        self.post_message(self.Progress("", review, finished=True, unfinished=unfinished, resumed=before is not None))

    def on_rewrite_screen_progress(self, message: Progress) -> None:
        if message.status:
            self._set_status(message.status)
        if message.result is not None:
            self.unfinished = message.unfinished
            self._finished(message.result, message.resumed)
        if message.finished:
            self.running = False

    async def on_generation_batch(self, batch: GenerationBatch) -> None:
        try:
            if batch.prefill is not None:  # a part of a long document is read for tens of seconds on a CPU
                self.query_one(StatsPanel).prefill(batch.prefill.seconds)
            if batch.pieces:
                self.query_one(StatsPanel).add(batch.pieces)
                self._append(batch.text)
            if batch.done is not None:
                self.query_one(StatsPanel).finish(batch.done)
            elif batch.last:
                self.query_one(StatsPanel).flush()
            if batch.done is not None and batch.done.reason != "cancelled":
                self._append("\n\n")  # between parts; the finished rewrite replaces it all
            if batch.error is not None:
                self.error = batch.error
                self._set_status(f"error: {batch.error}")  # the worker's next message keeps it
        finally:
            batch.handled()

    def _append(self, text: str) -> None:
        box = self.query_one("#result", TextArea)
        box.insert(text, box.document.end)

    def _set_status(self, text: str) -> None:
        self.query_one("#rewrite-status", Static).update(text)

    def _finished(self, review: Review, resumed: bool = False) -> None:
        self.review, self.current = review, 0
        self.query_one("#diff-pane").display = True
        self._show_review()
        panel = self.query_one(StatsPanel)
        totals, (speedup, busy) = panel.totals, panel.speedup()
        speed = f"{totals.tokens_per_s:.1f} tok/s" + (f", {speedup:.2f}x plain decoding" if speedup else "") + (
            " (uncertain: the machine was busy)" if busy else "")
        # Where the rewrite stopped short of the document's end (or a part's), the change that drops the rest starts
        # rejected: the status says why.
        cut, rejected = self.review.cut_short, self.review.accepted.count(False)
        taken = f"all accepted but {'one' if rejected == 1 else rejected}" if rejected else "all accepted"
        if cut:
            taken += (": the rewrite stopped before the end of the document or of a part, and what it left out is kept "
                      "(Ctrl+Y on that change drops it)")
        if resumed:
            taken += (", and" if cut else ":") + " what you decided on the parts before Ctrl+R went on is kept"
        lead = "done"
        if self.unfinished is not None:
            done, total = len(self.unfinished[2]), len(self.unfinished[1].texts)
            lead = (f"{'error: ' + self.error if self.error else 'stopped'} in part {done + 1} of {total}; "
                    f"the {'part' if done == 1 else f'{done} parts'} before it rewritten, the rest as it was "
                    f"(Ctrl+R goes on from part {done + 1})")
        self._set_status(f"{lead}: {totals.n_tokens} tokens, {speed} ({self.guesser}, {totals.tokens_per_step:.2f} tok/step). "
                         f"{len(self.review.changes)} changes, {taken}: Ctrl+↓/↑ steps through them, Ctrl+Y/"
                         "Ctrl+N accepts/rejects one (Alt+Y/Alt+N all); Ctrl+S saves, Ctrl+W overwrites the original")

    def _show_review(self) -> None:
        """The diff and the text as the review now stands, the current change highlighted."""
        assert self.review is not None
        self.query_one("#result", TextArea).text = self.review.text
        self.query_one("#diff", Static).update(Text.assemble(
            *(_marked(run, kind, n == self.current) for run, kind, n in self.review.runs())))

    def action_move(self, step: int) -> None:
        if self.review is None or not self.review.changes:
            return
        self.current = (self.current + step) % len(self.review.changes)
        self._show_review()
        self._set_status(f"change {self.current + 1} of {len(self.review.changes)} "
                         f"({'accepted' if self.review.accepted[self.current] else 'rejected'}) · {self.review.summary()}")

    def action_decide(self, accept: bool) -> None:
        if self.review is None or not self.review.changes:
            return
        self.review.decide(self.current, accept)
        self.action_move(1 if self.current + 1 < len(self.review.changes) else 0)  # on to the next one

    def action_decide_all(self, accept: bool) -> None:
        if self.review is None:
            return
        self.review.decide_all(accept)
        self._show_review()
        self._set_status(self.review.summary())

    def action_save(self) -> None:
        if self.review is None:
            self.notify("Nothing to save yet", severity="warning")
            return
        try:
            path = save(self.review.text, output_path(self.path), self.document)
        except OSError as e:  # a full disk or a read-only folder: the review stays here to retry
            self.notify(f"could not save next to {self.path}: {e.strerror}; the original is unchanged",
                        severity="error", timeout=15)
            return
        moved = "" if unchanged_since(self.path, self.document) else \
            f"; note: {self.path.name} changed on disk since it was opened, and this is a rewrite of the version opened"
        self.notify(f"Saved to {path} ({self.review.summary()}){moved}", severity="warning" if moved else "information")
        self._set_status(f"saved to {path}: {self.review.summary()} (the original is unchanged){moved}")

    def action_overwrite(self) -> None:
        if self.review is None:
            return
        text, summary = self.review.text, self.review.summary()

        def changed() -> bool:
            # Another program's save since the document was opened is never lost to the rewrite.
            if unchanged_since(self.path, self.document):
                return False
            self.notify(f"{self.path} changed on disk since it was opened, so it was not overwritten; Ctrl+S saves "
                        "the review as a new file", severity="error", timeout=15)
            return True

        def done(yes: bool | None) -> None:
            if not yes or changed():  # checked again at the last moment
                return
            try:
                save(text, self.path, self.document)
            except OSError as e:
                self.notify(f"could not overwrite {self.path}: {e.strerror}; it is unchanged", severity="error",
                            timeout=15)
                return
            self.notify(f"Overwrote {self.path} ({summary})")
        if not changed():
            self.app.push_screen(ConfirmScreen(f"Overwrite {self.path} with the rewrite ({summary})?"), done)

    def action_stop_or_close(self) -> None:
        if self.running:
            self.cancel.set()
        else:
            self.app.pop_screen()
