"""The guesser registry: what each guesser needs, and one answer for every front end."""

from __future__ import annotations

import argparse

import pytest

from specchat import cli
from specchat.errors import SpecchatError
from specchat.server.api import ChatRequest
from specchat.spec.guessers import GUESSERS, REGISTRY, DraftGuesser, NoGuesser, available, build, unavailable
from specchat.store.settings import Settings


class Pair:
    """What a factory builds from, without models: a draft (or none) and why it is missing."""

    def __init__(self, draft: object | None = None, warnings: list[str] | None = None, rewinds: bool = True) -> None:
        self.target, self.draft, self.mtp, self.warnings, self.rewinds = object(), draft, None, warnings or [], rewinds

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({"rewind"} if self.rewinds else ()) | frozenset(
            {"draft"} if self.draft is not None and self.rewinds else ())

    def curve(self):  # not needed by the guessers built here
        raise AssertionError("the curve was not asked for")


def test_what_runs_depends_on_what_the_pair_has():
    assert GUESSERS == ("auto", "none", "lookup", "draft", "mtp", "history")
    assert available(Pair(draft=object()).capabilities) == ["auto", "none", "lookup", "draft"]
    assert available(Pair().capabilities) == ["auto", "none", "lookup"]
    assert available(Pair(draft=object(), rewinds=False).capabilities) == ["auto", "none"]
    assert isinstance(build("none", Pair()), NoGuesser)
    assert isinstance(build("draft", Pair(draft=object())), DraftGuesser)
    assert isinstance(build("auto", Pair(rewinds=False)), NoGuesser)  # nothing could be taken back


def test_a_guesser_that_cannot_run_says_why_in_one_line():
    assert unavailable("draft", {"rewind"}) == ("the draft guesser needs a draft model: pass --draft PATH or use a "
                                                "--pair that has one")
    left_out = "no draft model: it would not fit in memory"
    with pytest.raises(SpecchatError, match=f"the draft guesser cannot run: {left_out} \\(choose another guesser\\)"):
        build("draft", Pair(warnings=[left_out]))
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
