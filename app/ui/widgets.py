"""The chat's widgets: a message (Markdown, streamed), and the live speculation panel."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

from markdown_it import MarkdownIt
from markdown_it.token import Token
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content, Span
from textual.widgets import Collapsible, Markdown, Static

from specchat.decoding.events import Source, Stats, Step
from specchat.mcptools.results import one_line
from specchat.service.backend import Baseline
from specchat.service.events import ENGINE_FIGURES, Answered, Chunk
from specchat.ui.streaming import Piece

SOURCE_STYLE = {
    Source.DRAFT: "bold green",
    Source.CORRECTION: "bold red",
    Source.BONUS: "bold cyan",
    Source.PLAIN: "",
}
LEGEND = Text.assemble(("accepted guess", SOURCE_STYLE[Source.DRAFT]), "  ",
                       ("target correction", SOURCE_STYLE[Source.CORRECTION]), "  ",
                       ("bonus token", SOURCE_STYLE[Source.BONUS]), "  plain")


STATUS_LABELS = {"stopped": "  (stopped)", "partial": "  (interrupted: specchat closed while writing it)"}
STREAMING = "the stream, until the server reports"  # figures of text that streams without its steps

SPARK = " ▁▂▃▄▅▆▇█"
# The numbers need not move faster than this while an answer streams: every redraw of the panel
# relayouts the screen, which on a 2-core CPU slows the decoding it reports on.
SHOW_INTERVAL_S = 0.5


def sparkline(values: list[int], top: int) -> str:
    """One row of bars scaled from 0 to `top`, so equal steps look equal and 1 token looks small."""
    return "".join(SPARK[round(8 * min(v, top) / top)] if v else SPARK[0] for v in values)


def code_blocks(markdown: str) -> list[tuple[str, str]]:
    """The fenced and indented code blocks of a Markdown text: (language, code), in order."""
    return [(token.info.strip(), token.content.rstrip("\n")) for token in MarkdownIt("gfm-like").parse(markdown)
            if token.type in ("fence", "code_block")]


_BLOCKS = MarkdownIt("gfm-like")
_INLINE_STYLES = {"em_open": ".em", "strong_open": ".strong", "s_open": ".s"}  # as Textual's Markdown styles them


def growing_block(markdown: str) -> tuple[int, Content]:
    """Where the finished blocks of `markdown` end (a line number), and the last block, which may still grow, as
    the stream shows it. A block is finished once another has begun; a list's next item or a fence's next line is
    the same block. A paragraph, the commonest, is styled as Textual's Markdown will style it; another block is
    shown as written until it is finished."""
    tokens = _BLOCKS.parse(markdown)
    starts = [n for n, token in enumerate(tokens) if token.map is not None and token.level == 0]
    if not starts:
        return 0, Content(markdown)
    last = tokens[starts[-1]]
    assert last.map is not None
    if last.type == "paragraph_open":
        return last.map[0], inline_content(tokens[starts[-1] + 1])
    return last.map[0], Content("".join(markdown.splitlines(keepends=True)[last.map[0]:]))


def inline_content(inline: Token) -> Content:
    """A paragraph's text with its emphasis, strong, struck and code spans, as Textual's Markdown draws them."""
    text: list[str] = []
    spans: list[Span] = []
    opened: list[tuple[str | None, int]] = []
    at = 0
    for child in inline.children or ():
        if child.type.endswith("_open"):
            opened.append((_INLINE_STYLES.get(child.type), at))
        elif child.type.endswith("_close"):
            style, start = opened.pop()
            if style:
                spans.append(Span(start, at, style))
        else:
            piece = {"softbreak": " ", "hardbreak": "\n"}.get(child.type, child.content)
            if child.type == "code_inline":
                spans.append(Span(at, at + len(piece), ".code_inline"))
            text.append(piece)
            at += len(piece)
    return Content("".join(text), spans)


class _Growing(Static):
    """What grows while an answer streams, in rows reserved RESERVE at a time. Textual lays the whole
    screen out (every message of the conversation, the panel) whenever a widget's height changes, and a line
    wraps about every 20 tokens: on a small CPU that work is time the decoding loses. In reserved rows, a new word
    costs this widget's repaint only, and a layout comes once in RESERVE lines."""

    RESERVE = 4
    COMPONENT_CLASSES = {"em", "strong", "s", "code_inline"}
    DEFAULT_CSS = """
    _Growing {
        & > .em { text-style: italic; }
        & > .strong { text-style: bold; }
        & > .s { text-style: strike; }
        &:dark > .code_inline { background: $warning 10%; color: $text-warning 95%; }
        &:light > .code_inline { background: $error 5%; color: $text-error 95%; }
    }
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._rows = 0

    def show(self, what: Content) -> None:
        self.update(what, layout=False)
        width = self.content_size.width
        if not width:  # not laid out yet, or hidden: the layout that shows it sizes it
            self.fit()
            return
        need = self.get_content_height(self.content_size, self.app.size, width)
        if need > self._rows or need <= self._rows - self.RESERVE:
            self._rows = need + self.RESERVE - 1
            self.styles.height = self._rows

    def fit(self) -> None:
        """As tall as the text, no more (streaming is over)."""
        if self._rows:
            self._rows = 0
            self.styles.height = "auto"


class MessageView(Vertical):
    """One message, in Markdown. While an answer streams, its finished blocks go to the Markdown once each, and
    the block still growing is drawn in one widget (`_Growing`): a new word then costs that widget's repaint,
    where Textual's Markdown re-parses the last block, mounts it again (a list or a fence) and lays the screen
    out. With provenance on, it shows each token coloured by where it came from instead."""

    def __init__(self, role: str, content: str = "", summary: str = "", status: str = "complete",
                 thinking: str = "", thinking_figures: str = "", branches: tuple[int, int] = (1, 1)) -> None:
        super().__init__(classes=f"message {role}")
        self.role, self.content, self.summary = role, content, summary
        self.status = status
        self.branches = branches  # (which, of how many) branches at this point of the conversation
        self.thinking, self._thinking_figures = thinking, thinking_figures
        self.tokens: list[tuple[str, Source]] = []
        self._tail = ""  # the streamed text not yet in the Markdown: its last block, still growing

    def label(self) -> str:
        """Who wrote it, how it ended when not whole, and which branch of how many it is."""
        return ({"user": "You", "assistant": "Assistant", "system": "System"}.get(self.role, self.role)
                + STATUS_LABELS.get(self.status, "") + self.branch_mark())

    def branch_mark(self) -> str:
        """Which branch of how many at this point of the conversation ("" where there is one)."""
        which, of = self.branches
        return f"  ← {which}/{of} →" if of > 1 else ""

    def relabel(self) -> None:
        self.query_one(".role", Static).update(self.label())

    def compose(self) -> ComposeResult:
        yield Static(self.label(), classes="role")
        # A reasoning model's thinking: open while it streams, folded once the answer begins (Ctrl+B).
        with Collapsible(collapsed=bool(self.content), classes="thinking"):
            yield _Growing(classes="thought")
        yield Markdown(self.content, classes="body")
        yield _Growing(classes="tail")
        yield Static(Text(), classes="provenance")
        yield Static(self.summary, classes="summary")

    def on_mount(self) -> None:
        self.query_one(".provenance").display = False
        self.query_one(".tail").display = False
        self.query_one(".summary").display = bool(self.summary)
        self._show_thinking()

    def _show_thinking(self) -> None:
        """The thinking section as the message now stands: its text and figures, hidden while there is none."""
        fold = self.query_one(Collapsible)
        fold.title = "Thinking" + (f" · {self._thinking_figures}" if self._thinking_figures else "")
        fold.display = bool(self.thinking)
        self.query_one(".thought", _Growing).show(Content.styled(self.thinking.lstrip(), "italic"))

    def toggle_thinking(self) -> bool:
        """Fold or open the thinking; False if this message has none."""
        if not self.thinking:
            return False
        fold = self.query_one(Collapsible)
        fold.collapsed = not fold.collapsed
        return True

    async def append(self, pieces: list[Piece]) -> None:
        thought = "".join(p.thinking for p in pieces)
        if thought:
            self.thinking += thought
            self._show_thinking()
        text = "".join(p.text for p in pieces)
        if text and self.thinking and not self.content:  # the answer begins: the thinking folds away
            self.query_one(Collapsible).collapsed = True
        # Provenance is known token by token for the engine's steps; a server's chunks are plain text.
        for piece in pieces:
            self.tokens += [(t.text, t.source) for t in piece.tokens] if isinstance(piece, Step) else \
                [(piece.text, Source.PLAIN)]
        self.content += text
        if text:
            await self._stream_text(text)
        if self.query_one(".provenance").display:
            self._render_provenance()

    async def _stream_text(self, text: str) -> None:
        self._tail += text
        done, block = growing_block(self._tail)
        if done:
            lines = self._tail.splitlines(keepends=True)
            await self.query_one(Markdown).append("".join(lines[:done]))
            self._tail = "".join(lines[done:])
        tail = self.query_one(".tail", _Growing)
        tail.display = not self.query_one(".provenance").display
        tail.show(block)

    async def finish(self, content: str, summary: str, status: str, thinking: str = "",
                     thinking_figures: str = "") -> None:
        streamed, tail = self.content, self.query_one(".tail", _Growing)
        self.content, self.summary, self.status = content, summary, status
        if thinking:
            self.thinking, self._thinking_figures = thinking, thinking_figures
            self._show_thinking()
            self.query_one(Collapsible).collapsed = bool(content)
        if content != streamed:  # the stream already shows it all, unless the end was held back
            await self.query_one(Markdown).update(content)
        elif self._tail:
            await self.query_one(Markdown).append(self._tail)
        self._tail, tail.display = "", False
        tail.fit()
        self.query_one(".thought", _Growing).fit()
        self.query_one(".summary", Static).update(summary)
        self.query_one(".summary").display = True
        self.relabel()

    def show_provenance(self, on: bool) -> None:
        on = on and bool(self.tokens)
        self.query_one(Markdown).display = not on
        self.query_one(".tail").display = not on and bool(self._tail)
        self.query_one(".provenance").display = on
        if on:
            self._render_provenance()

    def _render_provenance(self) -> None:
        self.query_one(".provenance", Static).update(
            Text.assemble(*((text, SOURCE_STYLE[src]) for text, src in self.tokens)))


class ToolView(MessageView):
    """A tool call and its result (or the line saying why there is none), folded like the thinking: the call's
    line shows, the result opens with a click. It stands for the `tool` message, so the conversation's views
    stay one per message (selection counts them)."""

    SHOWN = 20_000  # characters of a result drawn when opened: a megabyte would take the screen seconds to lay out
    WHY = 120  # characters of a failure's line shown on its fold

    def __init__(self, content: str, call: str, refused: bool = False, failed: bool = False,
                 branches: tuple[int, int] = (1, 1)) -> None:
        super().__init__("tool", content, branches=branches)
        self.call, self.refused, self.failed = call, refused, failed

    def label(self) -> str:
        return f"Tool · {self.call}" + self.branch_mark()

    def compose(self) -> ComposeResult:
        yield Static(self.label(), classes="role")
        # A failure's line is short and says why (timed out, raised, not run): shown on the fold, so the user need
        # not open it; a long one is cut there, whole inside.
        what = "refused" if self.refused else f"failed · {one_line(self.content, self.WHY)}" if self.failed else \
            f"result · {len(self.content):,} characters"
        # Plain text, not markup: a server's line may hold square brackets.
        with Collapsible(title=Content(what), collapsed=True, classes="result"):
            cut = len(self.content) - self.SHOWN
            yield Static(Text(self.content[:self.SHOWN] + (f"\n… {cut:,} more characters (in the export)" if cut > 0
                                                            else "")))

    def on_mount(self, event: events.Mount) -> None:
        event.prevent_default()  # a message's own set-up (provenance, summary, thinking) is not this view's

    def toggle_thinking(self) -> bool:
        return False

    def show_provenance(self, on: bool) -> None:
        pass


def call_line(name: str, arguments: str, limit: int = 200) -> str:
    """A call as one line: the tool and its arguments, cut where they run long."""
    return one_line(f"{name}({' '.join(arguments.split())})", limit)


class StatsPanel(Vertical):
    """Speculation, live: speed, tokens per step, acceptance, draft length, measured speedup.

    It shows what the stream carries: the engine's steps (everything), or a server's chunks of text
    (their rate only) until its Done brings the figures the server reported, labelled with their source."""

    _shown_at = float("-inf")

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._shown: dict[str, str] = {}  # what each part shows now
        self._start("", None)

    def compose(self) -> ComposeResult:
        yield Static("Speculation", classes="title")
        yield Static("", id="numbers")
        yield Static("tokens per step", classes="caption", id="spark-caption")
        yield Static("", id="spark")
        yield Static("accepted run lengths", classes="caption")
        yield Static("", id="runs")
        yield Static("", id="baseline")
        yield Static("", id="attached")
        yield Static(LEGEND, id="legend")

    def on_mount(self) -> None:
        # Draw what is there, never reset it: a model that loads at once may have filled the panel
        # before its Mount event is handled.
        self._show()

    def reset(self, model: str, baseline: Baseline | None, guesser: str = "") -> None:
        self._start(model, baseline, guesser)
        self._show()

    def _start(self, model: str, baseline: Baseline | None, guesser: str = "") -> None:
        self.model, self.baseline, self.guesser = model, baseline, guesser
        self.figures = ""  # where the numbers come from, when not from the engine's own steps
        self.reported = Stats()  # what servers reported for the answers since the reset
        self.parts: list[Answered] = []  # every answer that ended since the reset (a rewrite's parts), with what
        # plain decoding cost meanwhile
        self.steps: list[Step] = []
        self.chunks = 0
        self.totals = Stats()  # kept as pieces arrive, so a redraw does not re-add them all
        self.ttft: float | None = None
        self.prefill_s = 0.0

    def attached(self, files: list[tuple[str, int]]) -> None:
        """Files going with the next message: prompt lookup copies from them."""
        self.query_one("#attached", Static).update(
            "\n".join(["attached (lookup copies from these)"] + [f"  {name}  {size:,} chars" for name, size in files])
            if files else "")

    def prefill(self, seconds: float) -> None:
        self.prefill_s = seconds

    def add(self, pieces: list[Piece]) -> None:
        """Count what streamed; redraw at most every SHOW_INTERVAL_S (call `flush` at the end)."""
        for piece in pieces:
            if self.ttft is None:
                self.ttft = self.prefill_s + (piece.draft_s + piece.verify_s if isinstance(piece, Step) else 0.0)
            if isinstance(piece, Chunk):
                # Tokens as the stream delivered them, about a token a chunk, until the server reports.
                self.chunks += 1
                self.figures = self.figures or STREAMING
                self.totals = replace(self.totals, n_tokens=self.totals.n_tokens + 1,
                                      verify_s=self.totals.verify_s + piece.seconds)
            else:
                self.steps.append(piece)
                self.totals = self.totals.add_step(piece)
        if time.monotonic() - self._shown_at >= SHOW_INTERVAL_S:
            self._show()

    def flush(self) -> None:
        self._show()

    def finish(self, done: Answered) -> None:
        """The answer ended: figures that are not the engine's own count (a server's report, or the
        stream alone) replace what the stream suggested, labelled with where they came from."""
        if done.figures != ENGINE_FIGURES:
            # Rewrite mode shows the parts of one document together: what the server reported adds up.
            self.reported = done.stats if self.figures in ("", STREAMING) else self.reported.plus(done.stats)
            self.totals, self.figures = self.reported, done.figures
        self.parts.append(done)
        self._show()

    def plain_s(self) -> float:
        """One plain step's seconds for every token shown since the reset, on average: each answer that ended
        at the plain steps of its own moments, what still streams at the baseline (0: not known)."""
        t, base = self.totals, 1 / self.baseline.tokens_per_s if self.baseline and self.baseline.tokens_per_s else 0.0
        if not t.produced:
            return 0.0
        streaming = t.produced - sum(d.stats.produced for d in self.parts)
        seconds = sum(d.stats.produced * (d.plain_s or base) for d in self.parts) + max(0, streaming) * base
        return seconds / t.produced

    def speedup(self) -> tuple[float | None, bool]:
        """Against plain decoding (`Stats.speedup`), and whether the machine was busy during any of the
        answers (the figure is then uncertain)."""
        return self.totals.speedup(self.plain_s()), any(d.busy for d in self.parts)

    def _show(self) -> None:
        self._shown_at = time.monotonic()
        steps, t = self.steps, self.totals
        base = self.baseline.tokens_per_s if self.baseline is not None else None
        # Tokens per step, acceptance and the speedup are known from the engine's steps or from what a
        # server reported at the end; a chunk of a stream is not a step.
        known = bool(steps) or self.figures not in ("", STREAMING)
        speedup, busy = self.speedup() if known else (None, False)
        lines = [
            f"model     {self.model}",
            f"guesser   {self.guesser}",
            *([f"figures   {self.figures}"] if self.figures else []),
            f"tok/s     {t.tokens_per_s:6.1f}  (decode only)",
            f"first tok {self.ttft:6.2f}s" if self.ttft is not None else "first tok      –",
            f"tok/step  {t.tokens_per_step:6.2f}" if t.steps and known else "tok/step       –",
            f"accept    {t.acceptance:6.0%}  ({t.accepted}/{t.drafted})" if t.drafted else "accept         –",
            f"draft len {steps[-1].drafted:6d}" if steps else "draft len      –",
            "steps     " + ", ".join(f"{n} {src}" for src, n in Counter(s.guesser for s in steps).most_common())
            if steps else f"chunks    {self.chunks:6d}" if self.chunks else "steps          –",
            (f"speedup   {speedup:6.2f}x" + (" ?" if busy else "")) if speedup is not None else "speedup        –",
            *([f"          uncertain: this machine was busy ({next(d.busy_why for d in self.parts if d.busy)})"]
              if busy else []),
        ]
        self._set("numbers", "\n".join(lines))
        # The last steps that fit, on a fixed scale: none yet is an empty chart, not a full one.
        recent = [len(s.tokens) for s in steps[-28:]]
        top = max([*recent, 2])
        self._set("spark-caption", f"tok/step, last {len(recent)} (top {top})" if recent else "tokens per step")
        self._set("spark", sparkline(recent, top) if recent else "·")
        runs = Counter(s.accepted for s in steps if s.drafted)
        top = max(runs.values(), default=1)
        self._set("runs", "\n".join(f"{k:2d} {'█' * max(1, round(12 * v / top))} {v}" for k, v in sorted(runs.items()))
                  or "–")
        if self.parts and all(d.plain_s for d in self.parts) and speedup is not None:
            # What the speedup above was divided by, not the estimate it replaced when the answer ended, in the tok/s
            # line's terms: plain decoding's time for every token produced (the one that ends the answer too, which
            # shows no text) over the tokens shown. A plain answer's tok/s is then its baseline, and tok/s over the
            # baseline the speedup; a plain step's own rate read 6% above a 16-token plain answer's tok/s.
            how = f"baseline {t.n_tokens / (t.produced * self.plain_s()):.1f} tok/s: plain decoding at this answer's moments"
        else:
            how = "baseline: not measured yet" if self.baseline is None else \
                f"baseline {base:.1f} tok/s: {self.baseline.how}" if base else f"baseline: {self.baseline.how}"
        self._set("baseline", how)

    def _set(self, name: str, text: str) -> None:
        """Redraw one of the panel's parts if its text changed, and lay the screen out again only if its height
        did: while an answer streams, every layout of the whole screen is time the decoding loses. The height is
        measured as drawn, wrapped lines included (a model's name longer than the panel is wide wraps, and a
        check of each line against the width laid the screen out at every redraw of the numbers)."""
        widget = self.query_one(f"#{name}", Static)
        if text == self._shown.get(name):
            return
        self._shown[name] = text
        width = widget.content_size.width
        if not width:  # not laid out yet, or hidden: the layout that shows it sizes it
            widget.update(text)
            return
        widget.update(text, layout=False)
        # Against the height it was last laid out at, not the old text's: a layout may still be due.
        if widget.get_content_height(widget.content_size, self.app.size, width) != widget.content_size.height:
            widget.refresh(layout=True)
