"""The stats panel on its own, in a host app: what it shows for answers whose figures it is given."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult
from textual.binding import Binding

from specchat.decoding.events import Done, Source, Stats, Step, Token
from specchat.service.backend import Baseline
from specchat.ui.keyline import KeyLine
from specchat.ui.widgets import StatsPanel


class Host(App[None]):
    def compose(self) -> ComposeResult:
        yield StatsPanel()


def part(tokens: int, step_s: float, plain_s: float) -> tuple[list[Step], Done]:
    """One answer (a rewrite's part) of plain-looking steps of 2 tokens each, ended by the end of generation."""
    steps = [Step((Token(1, "a", Source.DRAFT), Token(2, "b", Source.BONUS)), "ab", 1, 1, 0.0, step_s)
             for _ in range(tokens // 2)] + [Step((), "", 0, 0, 0.0, step_s / 2, ended=True)]
    stats = Stats()
    for s in steps:
        stats = stats.add_step(s)
    return steps, Done("eog", "ab" * (tokens // 2), (), stats, plain_s=plain_s)


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
        assert "baseline 13.3 tok/s: plain steps at this answer's moments" in str(panel.query_one("#baseline").render())


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
