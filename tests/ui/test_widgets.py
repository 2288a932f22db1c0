"""The stats panel on its own, in a host app: what it shows for answers whose figures it is given."""

from __future__ import annotations

import pytest
from textual.app import App, ComposeResult

from specchat.decoding.events import Done, Source, Stats, Step, Token
from specchat.service.backend import Baseline
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
