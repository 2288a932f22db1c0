"""The package's shape: layers that import one way, and a wheel that works outside the checkout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import venv
from pathlib import Path

import platformdirs
import pytest

from specchat.models.fetch import models_dir

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "app"  # installs as `specchat`

# What each layer may import from specchat, besides its own modules and specchat.errors. The UI is
# on top; the app services (backend, loader, documents) sit on models, store and spec; spec drives
# llama.cpp through llama. tools (measuring) may use anything; cli is the entry point.
ALLOWED = {
    "llama": set(),
    "spec": {"llama"},
    "store": {"spec"},  # settings validate sampling values and guesser names
    "models": {"store"},
    "services": {"llama", "spec", "models", "store"},
    "ui": {"llama", "spec", "models", "store", "services"},
    "server": {"llama", "spec", "models", "store", "services"},  # specchat serve: beside the UI, never using it
}
SERVICES = {"backend", "loader", "documents", "remote", "manage"}
NO_TEXTUAL = {"llama", "spec", "models", "store", "services", "server"}


def layer_of(module: str) -> str | None:
    """'specchat.spec.engine' -> 'spec'; top-level service modules -> 'services'."""
    parts = module.split(".")
    if parts[0] != "specchat" or len(parts) < 2:
        return None
    if parts[1] in ALLOWED or parts[1] in ("tools", "cli", "errors"):
        return parts[1]
    return "services" if parts[1] in SERVICES else parts[1]


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module a file imports, at any depth (lazy imports inside functions count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from specchat import ui` is specchat.ui: name the first module below the package.
            top = node.module == "specchat"
            found += [(node.lineno, f"specchat.{alias.name}") for alias in node.names] if top \
                else [(node.lineno, node.module)]
    return found


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return ".".join(("specchat", *rel.parts)).removesuffix(".__init__")


def violations(files: list[Path]) -> list[str]:
    found = []
    for path in files:
        layer = layer_of(module_name(path))
        if layer not in ALLOWED:
            continue
        for line, name in imports(path):
            where = f"{path.relative_to(REPO)}:{line} imports {name}"
            if layer in NO_TEXTUAL and name.split(".")[0] in ("textual", "rich"):
                found.append(f"{where}, but nothing below the UI may use Textual")
            other = layer_of(name)
            if other in (None, "errors", layer) or other not in ALLOWED and other != "tools" and other != "cli":
                continue
            if other not in ALLOWED[layer]:
                found.append(f"{where}, but {layer} may only use {sorted(ALLOWED[layer]) or 'nothing else'}")
    return found


def test_layers_import_one_way():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 25
    assert violations(files) == []


def test_the_layer_check_fails_on_a_forbidden_import(tmp_path, monkeypatch):
    """The check above could pass by finding nothing: show it catches each kind of violation."""
    fake = tmp_path / "app"
    (fake / "spec").mkdir(parents=True)
    (fake / "store").mkdir()
    (fake / "spec" / "engine.py").write_text("from specchat.ui.app import SpecchatApp\n")
    (fake / "store" / "files.py").write_text("def f():\n    import textual.app\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = violations(sorted(fake.rglob("*.py")))
    assert len(found) == 2
    assert "app/spec/engine.py:1 imports specchat.ui.app, but spec may only use ['llama']" in found[0]
    assert "app/store/files.py:2 imports textual.app, but nothing below the UI may use Textual" in found[1]


def test_reading_settings_and_the_catalog_loads_neither_llama_cpp_nor_textual(tmp_path):
    code = ("import sys; from specchat.store.settings import load_settings; from specchat.models.catalog import "
            "load_catalog; load_settings(); load_catalog(); "
            "print(sorted(m for m in ('llama_cpp', 'textual') if m in sys.modules))")
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path, check=True)
    assert out.stdout.strip() == "[]"


def test_every_subpackage_says_what_it_is():
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.split()) >= 12, f"{init.relative_to(REPO)} needs a docstring saying what the layer is"


@pytest.mark.real
def test_the_wheel_works_outside_the_checkout(tmp_path, qwen_paths):
    """Build the wheel, install it into a fresh venv (reusing this environment's packages, so nothing
    is downloaded or built), and run it from a directory that has no checkout in it."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                    str(REPO)], check=True, cwd=tmp_path)
    wheel, = dist.glob("specchat-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=False, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # This environment's dependencies, behind the wheel: the wheel must bring every file of its own.
    ours = [p for p in sys.path if p.endswith("site-packages")]
    Path(site, "deps.pth").write_text("\n".join(ours) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", site, str(wheel)],
                   check=True, cwd=tmp_path)
    home = tmp_path / "home"
    # A new user's dirs, with the default pair already on disk (the tests fetched it) and offline, so
    # that nothing is downloaded. The cost curve cache is this machine's, so auto need not measure it.
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_CACHE_HOME": str(Path(platformdirs.user_cache_dir()).parent), "XDG_DATA_HOME": str(home / "data"),
           "SPECCHAT_MODELS_DIR": str(models_dir()), "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "elsewhere"
    run.mkdir()

    def specchat(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(python), "-m", "specchat.cli", *args], capture_output=True, text=True,
                              env=env, cwd=run, timeout=300)

    assert subprocess.run([str(python), "-c", "import app"], capture_output=True, cwd=run, env=env).returncode != 0
    where = subprocess.run([str(python), "-c", "import specchat; print(specchat.__file__)"], capture_output=True,
                           text=True, cwd=run, env=env, check=True).stdout
    assert where.startswith(site), where  # the installed copy, not the checkout
    models = specchat("models")
    assert models.returncode == 0, models.stderr
    assert "qwen2.5-coder-1.5b-instruct" in models.stdout and " *qwen-coder-1.5b " in models.stdout
    answer = specchat("generate", "Say hello.", "--max-tokens", "8")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() and answer.stderr.startswith("[auto] ")
