"""Assembling registry chunks: verified by hash, never left half-written under the final name."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.models import fetch
from specchat.models.catalog import ModelEntry, PypiSource

DATA = [b"GGUF" + bytes(range(256)) * 40, b"second part" * 500, b"tail"]


def _wheels(tmp_path: Path) -> list[Path]:
    wheels = []
    for n, data in enumerate(DATA, 1):
        wheel = tmp_path / f"fake_part{n}-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"fake_part{n}/data/part{n:02d}.bin", data)
        wheels.append(wheel)
    return wheels


def _entry(sha: str) -> tuple[ModelEntry, PypiSource]:
    src = PypiSource("fake-part{n}", "1.0", len(DATA), "fake_part{n}/data/part{n:02d}.bin", sha)
    return ModelEntry("fake", "Fake", "fake.gguf", "Q0", None, None, src), src


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(tmp_path / "models"))
    wheels = _wheels(tmp_path)
    monkeypatch.setattr(fetch, "_pip_download", lambda src, into, name, progress: wheels)
    return tmp_path / "models"


def test_assembles_parts_in_order_and_verifies(models):
    entry, src = _entry(hashlib.sha256(b"".join(DATA)).hexdigest())
    seen = []
    path = fetch.fetch_pypi(entry, src, lambda what, done, total: seen.append((what, done, total)))
    assert path == models / "fake.gguf" and path.read_bytes() == b"".join(DATA)
    assert ("assembling fake", 3, 3) in seen
    assert fetch.on_disk(entry) == path
    assert sorted(p.name for p in models.iterdir()) == ["fake.gguf"]


def test_hash_mismatch_deletes_the_partial_file(models):
    entry, src = _entry("0" * 64)
    with pytest.raises(SpecchatError, match="sha256 mismatch.*deleted"):
        fetch.fetch_pypi(entry, src)
    assert list(models.iterdir()) == []


def test_interrupted_assembly_leaves_nothing(models, monkeypatch):
    entry, src = _entry(hashlib.sha256(b"".join(DATA)).hexdigest())

    def interrupt(what, done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_pypi(entry, src, interrupt)
    assert list(models.iterdir()) == []


def test_requirements_and_members_follow_the_placeholders():
    src = PypiSource("gemma-part{n}", "1.0.0", 2, "gemma_part{n}/data/model.gguf.part{i:02d}", "0" * 64)
    assert src.requirements() == ["gemma-part1==1.0.0", "gemma-part2==1.0.0"]
    assert src.members() == ["gemma_part1/data/model.gguf.part00", "gemma_part2/data/model.gguf.part01"]
