"""The short version of `specchat endurance` (the 20-minute run is in the README, not in CI)."""

from __future__ import annotations

import pytest
from reliability import tally

from specchat.service.choices import ModelChoice
from specchat.tools.endurance import run

pytestmark = pytest.mark.real


def test_short_endurance_session(tmp_path, smol_path):
    # Fourteen turns on any machine, not a minute (21 turns here, 2026-12-07): two rewrites, four stops and three
    # regenerations among them, which the assertions below need.
    report = run(ModelChoice(pair="smollm2-self", n_ctx=2048), tmp_path, minutes=0.0, min_turns=14)
    print("\n".join(report.lines()))
    assert report.problems == []
    assert report.answers >= 10 and report.stops >= 1 and report.regenerations >= 1 and report.rewrites >= 1
    # The same as a fresh process's, or parted at a floating-point near-tie (its cache was written by longer
    # prefills than the fresh process's: noise measured apart, `specchat.tools.ties`), said in a note.
    assert report.final and (report.final == report.fresh or any("near-tie" in note for note in report.notes))
    tally("endurance session (short, CI)", trials=report.answers + report.rewrites, lost=0)
