"""Figures for the README's reliability table, counted while the tests run.

A test calls `from reliability import tally; tally(area, trials=…, faults=…, inputs=…, lost=…)`; at the end of the run
pytest prints one row per area (see conftest.py), so every figure in the table comes from
`python -m pytest` and nothing is typed in by hand.
"""

from __future__ import annotations

from collections import Counter, defaultdict

COLUMNS = ("trials", "faults", "inputs", "lost")
FIGURES: dict[str, Counter[str]] = defaultdict(Counter)
NOT_RUN: dict[str, str] = {}  # areas whose tests could not run here, and why: their row says so


def tally(area: str, **counts: int) -> None:
    unknown = set(counts) - set(COLUMNS)
    assert not unknown, f"unknown reliability columns {unknown}"
    FIGURES[area].update(counts)


def not_run(area: str, why: str) -> None:
    """A test of this area could not run on this machine: the table marks the row, rather than leave a
    count that says nothing, and then skip."""
    NOT_RUN[area] = why


def table() -> list[str]:
    rows = [f"| {'area':<40} | " + " | ".join(f"{c:>6}" for c in COLUMNS) + " |",
            "| " + "-" * 40 + " | " + " | ".join("-" * 6 for _ in COLUMNS) + " |"]
    for area in sorted(set(FIGURES) | set(NOT_RUN)):
        if area in NOT_RUN:
            rows.append(f"| {area:<40} | NOT RUN: {NOT_RUN[area]}")
        else:
            rows.append(f"| {area:<40} | " + " | ".join(f"{FIGURES[area][c]:>6}" for c in COLUMNS) + " |")
    return rows
