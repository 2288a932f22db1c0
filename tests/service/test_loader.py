"""The loader (service/loader.py) on scripted models described by files: which draft is kept, which is
left out and why, and that nothing it opened stays open when loading fails. No weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakes import ScriptedModel

from specchat.errors import SpecchatError
from specchat.llama.session import Memory
from specchat.service.choices import ModelChoice
from specchat.service.loader import load_pair


@pytest.fixture
def opened(monkeypatch) -> list[ScriptedModel]:
    """Every model the loader opens, opened from its file's description instead of llama.cpp."""
    models: list[ScriptedModel] = []

    def open_model(path, **kwargs) -> ScriptedModel:
        spec = json.loads(Path(path).read_text())
        if spec.get("fails") == "interrupt":
            raise KeyboardInterrupt
        if spec.get("fails"):
            raise SpecchatError(f"{Path(path).name}: broken")
        models.append(ScriptedModel.from_file(path, **kwargs))
        return models[-1]

    monkeypatch.setattr("specchat.service.loader.Model", open_model)
    return models


def model_file(folder: Path, name: str, **spec: object) -> Path:
    path = folder / f"{name}.gguf"
    path.write_text(json.dumps({"name": name, "text": True, "order": 1, **spec}))
    return path


def test_a_draft_of_the_same_vocabulary_is_kept(tmp_path, opened):
    pair = load_pair(ModelChoice(target=model_file(tmp_path, "t"), draft=model_file(tmp_path, "d", seed=3)))
    assert pair.warnings == [] and pair.draft is opened[1]
    assert pair.capabilities == {"rewind", "draft"} and pair.name == "t + d"


def test_a_draft_of_another_vocabulary_is_left_out_closed_and_named(tmp_path, opened):
    target, draft = model_file(tmp_path, "t"), model_file(tmp_path, "d", text=False, vocab=6)
    pair = load_pair(ModelChoice(target=target, draft=draft))
    assert pair.draft is None and pair.capabilities == {"rewind"}
    assert pair.warnings == ["no draft model: draft d.gguf is incompatible with target t.gguf: token 0 is '\\x00' in "
                             "the target but 'a' in the draft; pick a draft of the same model family (`specchat "
                             "drafts TARGET` lists them); the target runs with prompt lookup and plain decoding"]
    assert opened[1].closed and not opened[0].closed


def test_a_draft_that_fails_to_load_is_left_out_with_its_reason(tmp_path, opened):
    pair = load_pair(ModelChoice(target=model_file(tmp_path, "t"), draft=model_file(tmp_path, "d", fails="error")))
    assert pair.draft is None and pair.warnings == ["no draft model: d.gguf: broken; the target runs with prompt "
                                                    "lookup and plain decoding"]


def test_an_interrupted_load_closes_the_target(tmp_path, opened):
    with pytest.raises(KeyboardInterrupt):
        load_pair(ModelChoice(target=model_file(tmp_path, "t"), draft=model_file(tmp_path, "d", fails="interrupt")))
    assert [m.closed for m in opened] == [True]


def test_a_target_that_cannot_take_back_a_guess_decodes_plainly_and_says_so(tmp_path, opened):
    pair = load_pair(ModelChoice(target=model_file(tmp_path, "t", memory="RESTART"), draft=model_file(tmp_path, "d")))
    assert pair.capabilities == frozenset() and pair.target.session.memory is Memory.RESTART
    assert pair.warnings == ["t keeps a state that llama.cpp can neither cut nor save, so a rejected guess cannot be "
                             "taken back: it decodes plainly (the none guesser)"]


def test_a_pair_and_files_at_once_are_refused(tmp_path, opened):
    with pytest.raises(SpecchatError, match="give either --pair or --target, not both"):
        load_pair(ModelChoice(pair="qwen-coder-1.5b", target=model_file(tmp_path, "t")))
    assert opened == []
