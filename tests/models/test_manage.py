"""Bringing your own models: `specchat add`, `models`, `drafts`, `pair`, `remove`, through the real
command line on the registry's GGUF files, with the user catalog in a temporary config dir."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from commands import REPO, with_costs

from specchat.errors import SpecchatError
from specchat.models.fetch import models_dir
from specchat.models.sources import HubFile, LocalFile, parse_source, pick_hub_file, quantization

TARGET = "qwen2.5-coder-1.5b-instruct"


@pytest.fixture
def home(tmp_path: Path) -> dict[str, str]:
    """A user with no catalog of their own yet, who shares the test run's model files."""
    return {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "SPECCHAT_MODELS_DIR": str(models_dir()), "SPECCHAT_CATALOG": ""}


def specchat(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specchat.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300, input=stdin)


def user_catalog(env: dict[str, str]) -> dict:
    path = Path(env["XDG_CONFIG_HOME"]) / "specchat" / "models.toml"
    return tomllib.loads(path.read_text()) if path.exists() else {}


def one_line_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specchat: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.real
def test_add_a_file_find_its_drafts_pair_it_and_generate_with_the_pair(home, tmp_path, smol_path, qwen_paths):
    own = tmp_path / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"  # a file of the user's, outside the catalog
    own.parent.mkdir()
    shutil.copy(smol_path, own)

    added = specchat(home, "add", str(own))
    assert added.returncode == 0, added.stderr
    name = "smollm2-135m-instruct.q4_1"
    entry = user_catalog(home)["models"][name]
    assert entry["path"] == str(own) and entry["size"] == own.stat().st_size
    assert entry["sha256"] == hashlib.sha256(own.read_bytes()).hexdigest() and entry["quantization"] == "Q4_1"
    listing = specchat(home, "models").stdout
    assert any(line.split()[:1] == [name] and "yours" in line and "94 MiB" in line and str(own) in line
               for line in listing.splitlines()), listing
    assert "qwen2.5-coder-1.5b-instruct" in listing and "shipped" in listing  # the shipped ones are listed too

    drafts = specchat(home, "drafts", TARGET)
    assert drafts.returncode == 0, drafts.stderr
    lines = {line.split()[0]: line for line in drafts.stdout.splitlines()[1:] if line.strip()}
    assert lines["qwen2.5-coder-0.5b-instruct"].endswith("compatible")
    assert "no: token 0 is '!' in the target but '<|endoftext|>' in the draft" in lines[name]
    assert drafts.stdout.splitlines()[1].split()[0] == "qwen2.5-coder-0.5b-instruct"  # compatible ones first

    with_costs(Path(home["XDG_CACHE_HOME"]), "--target", str(qwen_paths[0]), "--draft", str(qwen_paths[1]))
    paired = specchat(home, "pair", "my-coder", TARGET)
    assert paired.returncode == 0, paired.stderr
    assert "qwen2.5-coder-0.5b-instruct drafts: the smallest compatible model on disk" in paired.stdout
    assert user_catalog(home)["pairs"]["my-coder"] == {"target": TARGET, "draft": "qwen2.5-coder-0.5b-instruct"}

    answer = specchat(home, "generate", "Write a Python function that adds two numbers.", "--pair", "my-coder",
                      "--guesser", "draft", "--max-tokens", "12")
    assert answer.returncode == 0, answer.stderr
    stats = answer.stderr.strip().splitlines()[-1]
    assert stats.startswith("[draft] 12 tokens") and " (0/0)" not in stats, stats  # the pair's draft drafted

    # A draft that cannot draft for the target is refused, and the catalog is left as it was.
    before = user_catalog(home)
    one_line_error(specchat(home, "pair", "bad", TARGET, name), f"{name} cannot draft for {TARGET}: token 0 is")
    assert user_catalog(home) == before


@pytest.mark.real
def test_a_pair_without_a_compatible_draft_runs_on_lookup_and_remove_forgets_it(home, tmp_path, smol_path):
    own = tmp_path / "tiny.gguf"
    shutil.copy(smol_path, own)
    assert specchat(home, "add", str(own), "--name", "tiny").returncode == 0
    paired = specchat(home, "pair", "tiny-alone", "tiny")
    # SmolLM2 itself (the shipped entry) is the same size as the target, so it cannot save time either.
    assert "no model on disk can draft for tiny" in paired.stdout, paired.stdout + paired.stderr
    assert user_catalog(home)["pairs"]["tiny-alone"] == {"target": "tiny"}
    answer = specchat(home, "generate", "Say hi.", "--pair", "tiny-alone", "--max-tokens", "6")
    assert answer.returncode == 0 and "warning" not in answer.stderr, answer.stderr  # no draft is not a problem

    removed = specchat(home, "remove", "tiny", "--keep-file")
    assert removed.returncode == 0, removed.stderr
    assert "removed tiny and its pairs tiny-alone" in removed.stdout and own.exists()
    assert "tiny" not in user_catalog(home).get("models", {}) and "tiny-alone" not in user_catalog(home).get("pairs", {})
    assert specchat(home, "add", str(own), "--name", "tiny").returncode == 0
    shutil.copy(own, own.with_name("again.gguf"))
    assert specchat(home, "remove", "tiny", "--delete-file").returncode == 0 and not own.exists()
    one_line_error(specchat(home, "remove", "smollm2-135m-instruct"), "ships with specchat")
    one_line_error(specchat(home, "remove", "nothing-like-it"), "not in your catalog")
    # A user catalog that is not valid TOML is never overwritten: one line says what to fix.
    broken = Path(home["XDG_CONFIG_HOME"]) / "specchat" / "models.toml"
    broken.write_text("[models.x\n")
    one_line_error(specchat(home, "add", str(own.with_name("again.gguf"))), "models.toml")
    assert broken.read_text() == "[models.x\n"


@pytest.mark.real
def test_adding_bad_sources_is_one_line_and_changes_nothing(home, tmp_path, smol_path):
    junk = tmp_path / "junk.gguf"
    junk.write_text("not a model")
    one_line_error(specchat(home, "add", str(tmp_path / "missing.gguf")), "model file not found")
    one_line_error(specchat(home, "add", str(junk)), "not a GGUF model file")
    one_line_error(specchat(home, "add", "hf:just-a-name"), "is not a hub model")
    # The hub unreachable (a closed port on this machine): one line, and nothing recorded.
    one_line_error(specchat({**home, "HF_ENDPOINT": "http://127.0.0.1:9"}, "add", "hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF"),
                   "could not look up hf:Qwen/Qwen2.5-0.5B-Instruct-GGUF")
    one_line_error(specchat(home, "add", str(smol_path), "--name", "smollm2-135m-instruct"), "already in the catalog")
    assert user_catalog(home) == {}


def test_sources_are_parsed_as_ollama_and_llama_cpp_name_them():
    assert parse_source("~/models/a.gguf") == LocalFile(Path("~/models/a.gguf").expanduser())
    assert parse_source("hf:Qwen/Qwen2.5-7B-Instruct-GGUF") == HubFile("Qwen/Qwen2.5-7B-Instruct-GGUF")
    assert parse_source("hf:bartowski/Llama-GGUF:Q8_0") == HubFile("bartowski/Llama-GGUF", None, "Q8_0")
    assert parse_source("hf:hf.co/o/r/sub/x.gguf") == HubFile("o/r", "sub/x.gguf")
    for bad in ("hf:", "hf:owner", "hf:o/r/notgguf", "hf://r"):
        with pytest.raises(SpecchatError, match="is not a hub model"):
            parse_source(bad)


def test_the_hub_file_is_picked_by_quantization_or_the_choices_are_listed():
    files = ["README.md", "m-Q4_K_M.gguf", "m-q8_0.gguf", "m-IQ4_XS.gguf", "big-Q4_K_M-00001-of-00002.gguf"]
    assert pick_hub_file("o/r", files, None) == "m-Q4_K_M.gguf"  # split models are left out
    assert pick_hub_file("o/r", files, "q8_0") == "m-q8_0.gguf"
    with pytest.raises(SpecchatError, match=r"no Q5_K_M file; its GGUF files: m-IQ4_XS.gguf, m-Q4_K_M.gguf, m-q8_0.gguf"):
        pick_hub_file("o/r", files, "Q5_K_M")
    with pytest.raises(SpecchatError, match="has no .gguf files"):
        pick_hub_file("o/r", ["README.md"], None)
    assert [quantization(f) for f in ("a-Q4_K_M.gguf", "b.IQ4_XS.gguf", "c-f16.gguf", "d.gguf")] == \
        ["Q4_K_M", "IQ4_XS", "F16", "?"]


@pytest.mark.real
async def test_the_models_screen_adds_a_file_and_offers_only_compatible_drafts(tmp_path, monkeypatch, smol_path,
                                                                               qwen_paths):
    from pilot import make_app, until
    from textual.widgets import Button, Input, Select

    from specchat.ui.models import NO_DRAFT, ModelsScreen
    from specchat.ui.screens import SettingsScreen

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("SPECCHAT_CATALOG", raising=False)
    own = tmp_path / "my-smol.gguf"
    shutil.copy(smol_path, own)
    app = make_app(tmp_path)  # a scripted backend: this is about the screens, which read real GGUF files
    async with app.run_test(size=(140, 50)) as pilot:
        await until(pilot, lambda: app.ready, "the backend")
        app.action_settings()
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#models"), "the settings")
        app.screen.query_one("#models", Button).press()
        await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.query("#add"), "the models screen")
        screen = app.screen
        text = lambda widget: str(screen.query_one(widget).render())  # noqa: E731
        screen.query_one("#source", Input).value = str(own)
        screen.query_one("#add", Button).press()
        await until(pilot, lambda: text("#add-status").startswith("added my-smol (Q4_1, 94 MiB)"), "the file added")
        assert screen.query_one("#target", Select).value == "my-smol"  # the next step: its draft

        screen.query_one("#target", Select).value = TARGET
        draft = screen.query_one("#draft", Select)
        await until(pilot, lambda: draft.value == "qwen2.5-coder-0.5b-instruct", "the drafts listed", timeout=30)
        offered = [value for _, value in draft._options if isinstance(value, str)]
        assert offered == ["qwen2.5-coder-0.5b-instruct", NO_DRAFT]  # SmolLM2's tokenizer is another one
        notes = text("#draft-notes")
        assert "my-smol: token 0 is '!' in the target but '<|endoftext|>' in the draft" in notes
        assert f"{TARGET}: it is the target itself" in notes

        screen.query_one("#pair", Button).press()
        await until(pilot, lambda: isinstance(app.screen, SettingsScreen), "back in the settings")
        name = f"{TARGET}+qwen2.5-coder-0.5b-instruct"
        assert app.screen.query_one("#pair", Select).value == name
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    assert user_catalog(env)["pairs"][name] == {"target": TARGET, "draft": "qwen2.5-coder-0.5b-instruct"}
    assert user_catalog(env)["models"]["my-smol"]["path"] == str(own)


def test_the_file_picker_offers_folders_and_gguf_files_only(tmp_path):
    from specchat.ui.models import folders_and_models

    for name in ("models", ".cache"):
        (tmp_path / name).mkdir()
    for name in ("a.gguf", "notes.txt", ".hidden.gguf", "b.gguf.part"):
        (tmp_path / name).write_bytes(b"")
    shown = folders_and_models(sorted(tmp_path.iterdir()))
    assert [p.name for p in shown] == ["a.gguf", "models"]
