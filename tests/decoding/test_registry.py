"""The guesser registry: what each guesser needs, and one answer for every front end."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from specchat import cli
from specchat.decoding.guessers import (
    GUESSERS,
    REGISTRY,
    AutoGuesser,
    DraftGuesser,
    Inputs,
    NoGuesser,
    available,
    build,
    unavailable,
)
from specchat.decoding.policy import CostCurve
from specchat.errors import SpecchatError
from specchat.server.api import ChatRequest
from specchat.service.settings import Settings


def inputs(draft: object | None = None, warnings: tuple[str, ...] = (), rewinds: bool = True, **more) -> Inputs:
    """What the service would build guessers from, without models: a draft (or none) and why it is missing."""
    capabilities = frozenset({"rewind"} if rewinds else ()) | frozenset({"draft"} if draft is not None and rewinds else ())
    target = SimpleNamespace(piece=lambda token: b"", tree_branches=1)
    return Inputs(target, draft, None, capabilities, warnings=warnings, **more)  # type: ignore[arg-type]


def test_what_runs_depends_on_what_the_pair_has():
    assert GUESSERS == ("auto", "none", "lookup", "draft", "mtp", "history")
    assert available(inputs(draft=object()).capabilities) == ["auto", "none", "lookup", "draft"]
    assert available(inputs().capabilities) == ["auto", "none", "lookup"]
    assert available(inputs(draft=object(), rewinds=False).capabilities) == ["auto", "none"]
    assert isinstance(build("none", inputs()), NoGuesser)
    assert isinstance(build("draft", inputs(draft=object())), DraftGuesser)
    assert isinstance(build("auto", inputs(rewinds=False)), NoGuesser)  # nothing could be taken back


def test_auto_is_built_from_the_curve_it_is_given_and_measures_nothing():
    # Building a guesser reaches nothing above decoding: auto takes the live curve the service measured, the
    # same object (which the service keeps current), and without one it is a one-line error, not a measurement.
    curve = CostCurve([0.02, 0.03, 0.04])
    auto = build("auto", inputs(curve=curve))
    assert isinstance(auto, AutoGuesser) and auto.curve is curve
    assert REGISTRY["auto"].costs and not any(entry.costs for name, entry in REGISTRY.items() if name != "auto")
    with pytest.raises(SpecchatError, match="auto needs this machine's cost curve"):
        build("auto", inputs())


def test_a_guesser_that_cannot_run_says_why_in_one_line():
    assert unavailable("draft", {"rewind"}) == ("the draft guesser needs a draft model: pass --draft PATH or use a "
                                                "--pair that has one")
    left_out = "no draft model: it would not fit in memory"
    with pytest.raises(SpecchatError, match=f"the draft guesser cannot run: {left_out} \\(choose another guesser\\)"):
        build("draft", inputs(warnings=(left_out,)))
    assert unavailable("psychic", ()) == "unknown guesser 'psychic'; choose one of auto, none, lookup, draft, mtp, history"
    assert unavailable("lookup", {"rewind"}) is None
    assert unavailable("mtp", {"rewind"}).startswith("the mtp guesser needs MTP layers: a model that has them")
    assert unavailable("history", {"rewind"}).startswith("the history guesser needs the app's conversations")


def test_every_front_end_offers_the_registry():
    parser, _ = cli._parser()
    generate = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
    option = next(a for a in generate.choices["generate"]._actions if a.dest == "guesser")
    assert list(option.choices) == list(REGISTRY)
    assert all(entry.help in option.help for entry in REGISTRY.values())
    for name in REGISTRY:
        assert Settings(guesser=name).guesser == name
        assert ChatRequest(messages=[{"role": "user", "content": "hi"}], guesser=name).guesser == name
    with pytest.raises(SpecchatError):
        Settings(guesser="psychic")
    with pytest.raises(ValueError):
        ChatRequest(messages=[{"role": "user", "content": "hi"}], guesser="psychic")
