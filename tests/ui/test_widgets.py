"""The chat's widgets on their own, in host apps: the stats panel given figures, the key line, and a message as
an answer streams into it."""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Collapsible, Markdown
from textual.widgets._collapsible import CollapsibleTitle

from specchat.decoding.events import Source, Stats, Step, Token
from specchat.service.backend import Baseline
from specchat.service.events import Answered, Said
from specchat.ui.app import SpecchatApp
from specchat.ui.keyline import KeyLine
from specchat.ui.widgets import MessageView, StatsPanel, ToolView, growing_block


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield StatsPanel()


def part(tokens: int, step_s: float, plain_s: float) -> tuple[list[Step], Answered]:
    """One answer (a rewrite's part) of plain-looking steps of 2 tokens each, ended by the end of generation."""
    steps = [Step((Token(1, "a", Source.DRAFT), Token(2, "b", Source.BONUS)), "ab", 1, 1, 0.0, step_s)
             for _ in range(tokens // 2)] + [Step((), "", 0, 0, 0.0, step_s / 2, ended=True)]
    stats = Stats()
    for s in steps:
        stats = stats.add_step(s)
    return steps, Answered("eog", "ab" * (tokens // 2), (), stats, plain_s=plain_s)


async def test_a_rewrite_in_parts_is_measured_against_each_parts_own_plain_steps():
    """The issue's bug: the panel divided every part's totals by the last part's baseline. A first part while
    plain steps cost 0.1 s and a second while they cost 0.05 s: each part's tokens are priced at its own."""
    first, second = part(20, 0.12, 0.1), part(20, 0.06, 0.05)
    async with Host().run_test() as pilot:
        panel = pilot.app.query_one(StatsPanel)
        panel.reset("model", Baseline(1 / 0.2, "a stale baseline"))
        for steps, done in (first, second):
            panel.add(steps)
            panel.finish(done)
        decode = first[1].stats.decode_s + second[1].stats.decode_s
        assert panel.totals.produced == 42
        speedup, busy = panel.speedup()
        assert speedup == pytest.approx((21 * 0.1 + 21 * 0.05) / decode) and not busy
        # In the tok/s line's terms (40 tokens shown, 42 produced with each part's end): tok/s over it is the speedup.
        baseline = str(panel.query_one("#baseline").render())
        assert "baseline 12.7 tok/s: plain decoding at this answer's moments" in baseline
        assert panel.totals.tokens_per_s / float(baseline.split()[1]) == pytest.approx(speedup, rel=0.005)


class Panel(App[None]):
    CSS = "StatsPanel { width: 34; padding: 0 1; }"  # as narrow as the chat screen's

    def compose(self) -> ComposeResult:
        yield StatsPanel()


async def test_the_panels_numbers_lay_the_screen_out_only_when_their_height_changes():
    """Every layout is of the whole screen, time the decoding loses. A model's name wider than the panel wraps:
    the numbers' redraws kept laying the screen out although their height never changed. Their height still
    follows their lines: a line more (figures a server reported) grows the panel."""
    async with Panel().run_test(size=(80, 40)) as pilot:
        panel = pilot.app.query_one(StatsPanel)
        numbers = panel.query_one("#numbers")
        panel.reset("a-target-model-Q4_K_M + a-draft-model-Q8_0", None)
        await pilot.pause()
        laid_out = []
        refresh = numbers.refresh

        def spy(*regions, **kwargs):
            laid_out.append(kwargs.get("layout", False))
            return refresh(*regions, **kwargs)

        numbers.refresh = spy
        height = numbers.size.height
        for n in range(5):
            panel.add([Step((Token(n, "a", Source.DRAFT), Token(n + 1, "b", Source.BONUS)), "ab", 1, 1, 0.0,
                            0.01 * (n + 1))])
            panel.flush()
            await pilot.pause()
        assert len(laid_out) >= 5 and not any(laid_out) and numbers.size.height == height
        steps, done = part(10, 0.1, 0.2)
        panel.finish(replace(done, figures="the server's report"))  # a "figures" line more
        await pilot.pause()
        assert any(laid_out) and numbers.size.height == height + 1
        assert "the server's report" in str(numbers.render())


class Keys(App[None]):
    BINDINGS = [Binding("ctrl+n", "note('new')", "New"), Binding("ctrl+s", "note('save')", "Save"),
                Binding("ctrl+x", "note('hidden')", "Hidden", show=False)]

    def __init__(self) -> None:
        super().__init__()
        self.notes: list[str] = []
        self.saving = True

    def compose(self) -> ComposeResult:
        yield KeyLine()

    def action_note(self, what: str) -> None:
        self.notes.append(what)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if parameters == ("save",) and not self.saving else True  # None: shown, dimmed


async def test_the_key_line_shows_the_keys_dims_those_that_do_nothing_and_a_click_presses_one():
    async with Keys().run_test(size=(60, 3)) as pilot:
        app = pilot.app
        line = app.query_one(KeyLine)
        shown = str(line.render())
        assert "^n New" in shown and "^s Save" in shown and "Hidden" not in shown and shown.rstrip().endswith("palette")
        await pilot.click(KeyLine, offset=(shown.index("Save"), 0))
        assert app.notes == ["save"]
        app.saving = False
        app.refresh_bindings()
        await pilot.pause()
        assert any("dim" in str(span.style) for span in line.render().spans if span.start <= shown.index("Save") < span.end)
        await pilot.click(KeyLine, offset=(shown.index("Save"), 0))  # does nothing, as its key would
        await pilot.click(KeyLine, offset=(shown.index("New"), 0))
        assert app.notes == ["save", "new"]


class Folds(App):
    """A failed call whose line is long and holds what markup would take for a style, and a refused one."""

    LINE = "[b]slow[/b] (server 'x') timed out: " + "x" * 300
    CSS_PATH = str(Path(inspect.getfile(SpecchatApp)).with_name(str(SpecchatApp.CSS_PATH)))  # the app's own styles

    def compose(self) -> ComposeResult:
        yield ToolView(self.LINE, "slow({})", failed=True)
        yield ToolView("the user refused this call: it was not run", "pid({})", refused=True)


async def test_a_failed_calls_fold_says_why_on_one_cut_line_as_plain_text():
    async with Folds().run_test(size=(300, 20)) as pilot:
        failed, refused = pilot.app.query(ToolView)
        title = str(failed.query_one(Collapsible).title)
        assert title == "failed · " + Folds.LINE[:ToolView.WHY - 1] + "…"
        assert "[b]slow[/b]" in str(failed.query_one(CollapsibleTitle).render())  # drawn as written
        assert str(refused.query_one(Collapsible).title) == "refused"  # the refusal's line is the word itself


async def test_a_failed_calls_line_wraps_on_a_narrow_terminal():
    async with Folds().run_test(size=(80, 20)) as pilot:
        failed = pilot.app.query(ToolView).first()
        title = failed.query_one(CollapsibleTitle)
        assert title.region.right <= 80 and title.region.height >= 2, title.region  # all of it, on two lines or more


# --- an answer as it streams -------------------------------------------------------------------------------------

ANSWER = """A hash table maps keys to values. With **chaining** each bucket keeps a list, and `dict` in Python uses
*open addressing* instead; both cost O(1) on average.

- load factor
- resizing cost

```python
d = {}

d["a"] = 1
```

| kind | cost |
|------|------|
| get  | O(1) |

That is all.
"""


@pytest.mark.parametrize("markdown, finished, shown", [
    ("one\n\ntwo", 2, "two"),  # a paragraph is finished once the next begins
    ("- a\n- b", 0, "- a\n- b"),  # a list's next item is the same list, shown as written
    ("- a\n- b\n\nnext", 3, "next"),
    ("```py\nx = 1\n\ny = 2\n", 0, "```py\nx = 1\n\ny = 2\n"),  # a blank line inside a fence ends nothing
    ("say **this** and `that`", 0, "say this and that"),
])
def test_the_growing_block_is_the_last_one_and_a_paragraph_is_drawn_styled(markdown, finished, shown):
    lines, content = growing_block(markdown)
    assert (lines, content.plain) == (finished, shown)


def test_a_growing_paragraph_has_the_styles_markdown_gives_it():
    _, content = growing_block("say **this**, *that* and `code` [here](x)")
    styled = {content.plain[span.start:span.end]: span.style for span in content.spans}
    assert styled == {"this": ".strong", "that": ".em", "code": ".code_inline"}


class Conversation(App[None]):
    CSS = "MessageView { height: auto; }"

    def compose(self) -> ComposeResult:
        yield MessageView("assistant")


def step(text: str) -> Said:
    return Said((Token(0, text, Source.PLAIN),), text, 0, 0, 0.0, 0.01)


def blocks(view: MessageView) -> list[str]:
    return [type(block).__name__ for block in view.query_one(Markdown).children]


async def test_a_streamed_answer_shows_every_character_once_and_ends_as_the_stored_message_draws():
    """Each finished block goes to the Markdown once and the growing one to the tail: at every moment the two
    together are what streamed, and at the end the Markdown is the whole answer, block for block as a stored one."""
    async with Conversation().run_test(size=(80, 60)) as pilot:
        view = pilot.app.query_one(MessageView)
        for at in range(0, len(ANSWER), 7):
            await view.append([step(ANSWER[at:at + 7])])
            await pilot.pause()
            assert view.query_one(Markdown).source + view._tail == ANSWER[:at + 7]
            assert view.query_one(".tail").display == bool(view._tail)
        await view.finish(ANSWER, "summary", "complete")
        await pilot.pause()
        assert view.query_one(Markdown).source == ANSWER and not view.query_one(".tail").display
        streamed = blocks(view)
        await view.remove()
        await pilot.app.mount(MessageView("assistant", ANSWER, "summary"))
        await pilot.pause()
        assert blocks(pilot.app.query_one(MessageView)) == streamed
        assert "MarkdownFence" in streamed and "MarkdownTable" in streamed


async def test_a_growing_paragraph_changes_the_messages_height_once_in_several_lines():
    """Textual lays the whole screen out whenever a widget's height changes, and a paragraph streaming into a
    narrow message wraps a line every few words: the rows reserved ahead make that once in several lines."""
    words = [f"word{n} " for n in range(300)]
    async with Conversation().run_test(size=(60, 120)) as pilot:
        view = pilot.app.query_one(MessageView)
        heights = []
        for word in words:
            await view.append([step(word)])
            await pilot.pause()
            heights.append(view.size.height)
        lines = view.query_one(".tail").content_size.height
        changes = sum(a != b for a, b in zip(heights, heights[1:]))
        assert lines >= 40  # it wrapped many times
        assert changes <= lines / 3


@pytest.mark.parametrize("keys, chosen", [(("space", "ctrl+t", "enter"), (("echo",), True)),
                                          (("down", "space", "enter"), (("add",), False)),
                                          (("ctrl+a", "tab", "space", "enter"), (("echo", "add"), True))])
async def test_the_tools_dialog_counts_every_key_typed_ahead_of_enter(keys, chosen):
    """Keys that arrive together, as from a fast typist or a paste, all count, in the order typed, the last Enter
    saving what the ones before it chose. They are sent as a terminal delivers them, one after the other without
    waiting (Pilot's `press` waits for each key to be handled, which hides the race). The dialog's Enter was a
    priority binding, run as the key arrives, ahead of those still queued for the list: all three cases failed so.
    With Enter bound on the list but Space ticking through the list's message to itself, the Enter overtook the tick:
    the first two failed."""
    from textual import events

    from specchat.service.conversation import ToolChoice
    from specchat.ui.tools import ToolsScreen

    saved: list[ToolChoice | None] = []

    class Host(App):
        def on_mount(self) -> None:
            self.push_screen(ToolsScreen([("echo", "says it back"), ("add", "adds two numbers")], None), saved.append)

    app = Host()
    async with app.run_test() as pilot:
        while not isinstance(app.screen, ToolsScreen) or not app.screen.query("#tool-list"):
            await pilot.pause()
        for key in keys:
            app._driver.send_message(events.Key(key, " " if key == "space" else None))
        for _ in range(200):
            if saved:
                break
            await pilot.pause(0.01)
    assert saved == [ToolChoice(*chosen)]
