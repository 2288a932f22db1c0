"""The conversation service opened the one way (specchat.service.local.open_local), on a real small model."""

from __future__ import annotations

import pytest

from specchat.decoding.engine import GenerationConfig, final
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.choices import ModelChoice
from specchat.service.costs import PairCosts
from specchat.service.local import MEASURING, open_local
from specchat.service.pair import LoadedPair
from specchat.store.conversations import Store


def test_a_guesser_the_pair_cannot_run_is_refused_before_anything_is_said_and_frees_the_models(smol_path,
                                                                                                monkeypatch):
    closed, said, warned = [], [], []
    monkeypatch.setattr(LoadedPair, "close", lambda self: closed.append(self))
    with pytest.raises(SpecchatError, match="the draft guesser needs a draft model"):
        open_local(ModelChoice(target=smol_path, n_ctx=512, threads=1), lambda what, done, total: said.append(what),
                   guesser="draft", warn=warned.append)
    assert len(closed) == 1 and warned == [] and MEASURING not in said


def test_the_service_is_ready_to_answer_with_auto_without_measuring_again(smol_path, tmp_path, monkeypatch):
    service = open_local(ModelChoice(target=smol_path, n_ctx=512, threads=1), store=Store(tmp_path / "chat.db"))
    try:
        assert service.pair.costs.calibration is not None  # measured (or read from the cache) when opened
        assert "history" in service.guessers  # the store's conversations are there to copy from

        def measure_again(*args, **kwargs):
            raise AssertionError("the curve was measured from inside building or running a guesser")

        monkeypatch.setattr(PairCosts, "ensure", measure_again)
        done = final(service.chat([Message("user", "Say hello.")], GenerationConfig(max_tokens=4), "auto"))
        assert done.token_ids and done.reason in ("max_tokens", "eog")
    finally:
        service.close()
        monkeypatch.undo()
    # Without a store, no history guesser: the service says so rather than building one over nothing.
    bare = open_local(ModelChoice(target=smol_path, n_ctx=512, threads=1))
    try:
        assert "history" not in bare.guessers and "auto" in bare.guessers
        with pytest.raises(SpecchatError, match="the history guesser needs the app's conversations"):
            bare.require("history")
    finally:
        bare.close()
