"""The package's shape: layers that import one way, and a wheel that works outside the checkout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import threading
import time
import tomllib
import venv
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import platformdirs
import pytest

from specchat.models.fetch import models_dir

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "app"  # installs as `specchat`

# A layer is a folder of app/: what each may import from specchat, besides its own modules and
# specchat.errors. The UI is on top, beside the server; both adapt the conversation service, which
# sits on models, store and decoding; decoding drives llama.cpp through llama. tools (measuring) may use
# anything; cli is the entry point. Every folder must be named here (a new one cannot slip past).
ALLOWED = {
    "llama": set(),
    "decoding": {"llama"},
    "store": set(),
    "models": {"store", "llama"},  # model management reads tokenizers without weights
    "service": {"llama", "decoding", "models", "store"},
    "ui": {"llama", "decoding", "models", "store", "service", "mcptools"},
    "server": {"llama", "decoding", "models", "store", "service"},  # specchat serve: beside the UI, never using it
    "tools": {"llama", "decoding", "models", "store", "service", "ui", "server", "mcptools"},
    # MCP servers' tools: configured in the settings' file, called for the UI and `generate --tools`.
    "mcptools": {"llama", "store", "service"},
}
NO_TEXTUAL = {"llama", "decoding", "models", "store", "service", "server", "mcptools"}
TOP_LEVEL = {"__init__", "__main__", "cli", "errors"}  # the only modules outside a layer


def layers() -> set[str]:
    """The layers, read from the folders: every package under app/."""
    return {init.parent.name for init in PACKAGE.glob("*/__init__.py")}


def layer_of(module: str) -> str | None:
    """'specchat.decoding.engine' -> 'decoding'; None for what is not a layer (cli, errors, other packages)."""
    parts = module.split(".")
    if parts[0] != "specchat" or len(parts) < 2 or parts[1] not in ALLOWED:
        return None
    return parts[1]


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
            if other is None and name.startswith("specchat.") and name.split(".")[1] == "cli":
                found.append(f"{where}, but only the entry point may use the command line")
            elif other not in (None, layer) and other not in ALLOWED[layer]:
                found.append(f"{where}, but {layer} may only use {sorted(ALLOWED[layer]) or 'nothing else'}")
    return found


def test_layers_import_one_way():
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 25
    assert violations(files) == []


def layout_problems() -> list[str]:
    """The folders are the layers: a module at the top of app/ would be a layer no folder shows, and a
    folder missing from ALLOWED one whose imports nothing checks."""
    found = [f"app/{name}/ is a layer that ALLOWED does not name" for name in sorted(layers() - set(ALLOWED))]
    found += [f"app/{name}.py is outside every layer: move it into its layer's folder"
              for name in sorted({p.stem for p in PACKAGE.glob("*.py")} - TOP_LEVEL)]
    packaged = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found += [f"pyproject.toml does not package specchat.{name}" for name in sorted(layers())
              if f"specchat.{name}" not in packaged]
    return found


def runtime_imports(path: Path, modules: set[str]) -> set[str]:
    """The specchat modules a file imports when it runs, lazy imports included and imports for type
    checking only left out (a module may name another's types without ever loading it)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                base = "specchat" if child.module == "specchat" else child.module
                found.update({base} - {"specchat"} | {f"{base}.{alias.name}" for alias in child.names})
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found & modules


def cycles(package: Path) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a loop (Tarjan's components)."""
    files = {module_name(path): path for path in package.rglob("*.py")}
    graph = {m: runtime_imports(path, set(files)) - {m} for m, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_modules_import_each_other():
    """A cycle, even through a lazy import, means two modules that are one role split in two (the model and
    its MTP head shared private loading helpers; the backend protocol and the remote backend; two screens)."""
    assert cycles(PACKAGE) == []


def test_the_cycle_check_finds_a_cycle_through_a_lazy_import(tmp_path, monkeypatch):
    package = tmp_path / "app"
    (package / "decoding").mkdir(parents=True)
    (package / "decoding" / "a.py").write_text("from specchat.decoding.b import x\n")
    (package / "decoding" / "b.py").write_text("def x():\n    from specchat.decoding.a import y\n")
    (package / "decoding" / "c.py").write_text("from typing import TYPE_CHECKING\n"
                                           "if TYPE_CHECKING:\n    from specchat.decoding.a import y\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", package)
    assert cycles(package) == [["specchat.decoding.a", "specchat.decoding.b"]]  # c's typing-only import is no cycle


def test_every_module_lives_in_a_layer_folder():
    assert layers() == set(ALLOWED)
    assert layout_problems() == []


def test_the_tests_are_laid_out_like_the_code():
    """A module's tests are found by its path: app/service/loader.py's in tests/service/test_loader.py. Each
    layer has a test folder of its name; whole/ holds what crosses them all (faults, offline, crashes,
    properties); at the top sit the tests of the top-level modules and conftest.py; the helpers the tests share
    (fakes, the pilot, the model writers, the chi-square) live in helpers/, on pytest's path."""
    tests = REPO / "tests"
    folders = {d.name for d in tests.iterdir() if d.is_dir() and any(d.glob("test_*.py"))}
    assert folders == layers() | {"whole"}
    top = {f.stem.removeprefix("test_") for f in tests.glob("test_*.py")}
    assert top <= TOP_LEVEL | {"layout"}, f"tests of a layer's module belong in its folder: {sorted(top)}"
    helpers = {f.name for f in tests.glob("*.py") if not f.name.startswith("test_")} - {"conftest.py"}
    assert not helpers, f"helpers belong in tests/helpers/: {sorted(helpers)}"


def test_the_layer_check_fails_on_a_forbidden_import(tmp_path, monkeypatch):
    """The check above could pass by finding nothing: show it catches each kind of violation."""
    fake = tmp_path / "app"
    for layer in ("decoding", "store", "service", "extras"):
        (fake / layer).mkdir(parents=True)
        (fake / layer / "__init__.py").write_text("")
    (fake / "decoding" / "engine.py").write_text("from specchat.ui.app import SpecchatApp\n")
    (fake / "store" / "files.py").write_text("def f():\n    import textual.app\n")
    (fake / "service" / "chat.py").write_text("from specchat.ui import widgets\nfrom specchat import cli\n")
    (fake / "backend.py").write_text("")  # a layer the folders do not show
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools]\npackages = ["specchat", "specchat.decoding"]\n')
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = violations(sorted(fake.rglob("*.py")))
    assert found == [
        "app/decoding/engine.py:1 imports specchat.ui.app, but decoding may only use ['llama']",
        "app/service/chat.py:1 imports specchat.ui, but service may only use ['decoding', 'llama', 'models', 'store']",
        "app/service/chat.py:2 imports specchat.cli, but only the entry point may use the command line",
        "app/store/files.py:2 imports textual.app, but nothing below the UI may use Textual",
    ]
    assert layout_problems() == [
        "app/extras/ is a layer that ALLOWED does not name",
        "app/backend.py is outside every layer: move it into its layer's folder",
        "pyproject.toml does not package specchat.extras",
        "pyproject.toml does not package specchat.service",
        "pyproject.toml does not package specchat.store",
    ]


def test_reading_settings_and_the_catalog_loads_neither_llama_cpp_nor_textual(tmp_path):
    code = ("import sys; from specchat.service.settings import load_settings; from specchat.models.catalog import "
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
    is downloaded or built: no build isolation, setuptools comes with the test extra), and run it from
    a directory that has no checkout in it."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                    "-w", str(dist), str(REPO)], check=True, cwd=tmp_path)
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
    # that nothing is downloaded. The cost curve cache is this machine's.
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
           "XDG_CACHE_HOME": platformdirs.user_cache_dir(), "XDG_DATA_HOME": str(home / "data"),
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
    # Where this machine's curve for the pair is not cached yet (a fresh machine), auto first measures it
    # and the progress line says so; nothing else comes before the answer's figures.
    from specchat.service.local import MEASURING

    lines = answer.stderr.strip().splitlines()
    assert answer.stdout.strip() and lines[-1].startswith("[auto] ") and set(lines[:-1]) <= {"", MEASURING}, \
        answer.stderr


def _stack_modules(frame) -> list[str]:
    """The specchat modules on the stack, innermost last, each run of frames of one module as one."""
    found: list[str] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("specchat.") and (not found or found[-1] != name):
            found.append(name)
        frame = frame.f_back
    return found[::-1]


def _entries(frame) -> list[str]:
    """What `_stack_modules` names, as the function through which each module was entered: 'module.qualname'."""
    found: list[tuple[str, str]] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("specchat."):
            if found and found[-1][0] == name:
                found.pop()  # a run of one module: named by its outermost frame, the one that entered it
            found.append((name, f"{name}.{frame.f_code.co_qualname}"))
        frame = frame.f_back
    return [call for _, call in found[::-1]]


def _upward(frame) -> str | None:
    """The call that this frame's function received, if it came from a layer that may not use the callee's:
    decoding calling a service method, say. A callback the upper layer handed down (a lambda or a nested
    function: progress lines, auto's early stop) is the upper layer's own choice, and passes."""
    callee = layer_of(frame.f_globals.get("__name__", ""))
    if callee is None or "<lambda>" in frame.f_code.co_qualname or "<locals>" in frame.f_code.co_qualname:
        return None
    caller = frame.f_back
    while caller is not None and not caller.f_globals.get("__name__", "").startswith("specchat."):
        caller = caller.f_back
    layer = layer_of(caller.f_globals["__name__"]) if caller is not None else None
    if layer in (None, callee) or callee in ALLOWED[layer]:
        return None
    return f"{caller.f_globals['__name__']}.{caller.f_code.co_qualname} -> " \
           f"{frame.f_globals['__name__']}.{frame.f_code.co_qualname}"


# llama.cpp's log callback is called by llama.cpp from wherever it is: a model the garbage collector frees in the
# middle of another module's work logs, and the frame below the callback is that work's, not a caller's.
C_CALLBACKS = {("specchat.llama.loading", "_log")}


class Trace:
    """Every call into specchat while `on`: the modules in the order first entered (`walk`), the stacks that
    hold a module twice, and the calls that go up a layer (a few of each, enough to say what went wrong)."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.walk: list[str] = []
        self.twice: list[str] = []
        self.upward: list[str] = []

    def profile(self, frame, event, arg) -> None:
        if not self.on or event != "call" or not frame.f_globals.get("__name__", "").startswith("specchat.") \
                or (frame.f_globals["__name__"], frame.f_code.co_qualname) in C_CALLBACKS:
            return
        stack = _stack_modules(frame)
        # The stack's outer modules were entered first; the walk keeps that order.
        self.walk += [name for name in stack if name not in self.walk]
        # Each different way once, and a few of them: enough to say what went wrong.
        if len(set(stack)) < len(stack) and len(self.twice) < 8:
            calls = " -> ".join(_entries(frame))
            self.twice += [calls] if calls not in self.twice else []
        up = _upward(frame)
        if up is not None and len(self.upward) < 8 and up not in self.upward:
            self.upward.append(up)

    def check(self, expected: set[str]) -> None:
        """Assert that no module was twice on a stack, no call went up, and each module `expected` was entered."""
        print("\nthe walk:", " -> ".join(name.removeprefix("specchat.") for name in self.walk))
        # Every kind of problem in one message: a fix for one should not hide what else is wrong.
        problems = [f"{what}:\n  " + "\n  ".join(found) for what, found in (
            ("a module entered twice on one call stack", self.twice), ("calls that go up a layer", self.upward),
            ("modules the trace missed", sorted(expected - set(self.walk)))) if found]
        assert problems == [], "\n".join(problems)


@contextmanager
def traced(on: bool = True) -> Iterator[Trace]:
    """Trace this thread, and every thread started from here on (the app's workers: Textual runs them in an
    executor's threads, which may be started before the part of interest, so a test that starts the app inside
    passes on=False and turns the trace on for what it means to see)."""
    trace = Trace(on)
    threading.setprofile(trace.profile)
    sys.setprofile(trace.profile)
    try:
        yield trace
    finally:
        trace.on = False  # a worker thread that outlives the block keeps the hook, which now does nothing
        sys.setprofile(None)
        threading.setprofile(None)


@pytest.mark.real
def test_the_walk_from_pair_to_the_engine_goes_down_and_enters_each_module_once(smol_path, capsys):
    """A real `specchat generate --pair`, traced: at every call into specchat, no module is on the stack
    twice, and no call goes up a layer (building auto once measured the cost curve from inside decoding, through
    the pair's methods in the service's loader: both checks now catch that). Neither would show in the
    imports, which may be lazy or typed."""
    from specchat import cli

    args = ["generate", "Say hello.", "--pair", "smollm2-self", "--max-tokens", "6", "--guesser", "auto"]
    # Once untraced, so that the pair's cost curve is cached: on a machine that never measured it, the
    # measurement's progress lines call back up into cli and local, as callbacks handed down do by design.
    assert cli.main(args) == 0, capsys.readouterr().err
    with traced() as trace:
        code = cli.main(args)
    assert code == 0, capsys.readouterr().err
    with capsys.disabled():
        trace.check({"specchat.cli", "specchat.service.choices", "specchat.service.local", "specchat.service.loader",
                     "specchat.service.pair", "specchat.models.catalog", "specchat.models.fetch",
                     "specchat.llama.model", "specchat.llama.vocab", "specchat.service.chat", "specchat.llama.template",
                     "specchat.decoding.guessers.registry", "specchat.decoding.guessers.auto",
                     "specchat.decoding.engine"})


@pytest.mark.real
async def test_the_apps_send_goes_down_and_enters_each_module_once(smol_path, tmp_path):
    """The real app, a message typed and sent, traced from Enter until the answer is stored: on the UI thread
    (the screen, its answers, the conversation's controller and the store) and on the worker thread that streams
    the answer (the pump, the backend, the engine). The same checks as generate's: the UI may call the service,
    never the service or decoding the UI, except through what the UI hands down (a callback, a message posted to
    it: Textual dispatches those, so no specchat frame calls the handler)."""
    from specchat.service.choices import ModelChoice
    from specchat.service.settings import Settings, save_settings
    from specchat.store.conversations import Store
    from specchat.ui.app import SpecchatApp

    config = tmp_path / "config.toml"
    save_settings(Settings(temperature=0.0, max_tokens=6, guesser="auto"), config)
    app = SpecchatApp(ModelChoice(pair="smollm2-self", n_ctx=1024), store=Store(tmp_path / "chat.db"),
                      settings_path=config)

    def untraced(condition) -> bool:
        """The test's own look at the app (app.generating, the store) is not the app's walk: this thread's hook
        is off while it looks (the worker's stays on)."""
        hook = sys.getprofile()
        sys.setprofile(None)
        try:
            return condition()
        finally:
            sys.setprofile(hook)

    async def until(pilot, condition, what: str, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while not untraced(condition):
            assert time.monotonic() < end, f"timed out waiting for {what}"
            await pilot.pause(0.05)

    def answered() -> bool:
        messages = app.store.messages(app.conversation_id) if app.conversation_id is not None else []
        return not app.generating and len(messages) == 2 and messages[-1].status == "complete"

    # Loading (and measuring the cost curve, on a machine that never did) is not the send: the trace is on only
    # from Enter on, but set up before the app starts any worker thread.
    with traced(on=False) as trace:
        async with app.run_test(headless=True, size=(120, 36)) as pilot:
            await until(pilot, lambda: app.ready, "the models to load", timeout=300.0)
            app.query_one("#input").text = "Say hello."
            trace.on = True
            await pilot.press("enter")
            await until(pilot, answered, "the answer to be stored")
            trace.on = False
    # The UI thread's part (the screen, its answers, the transcript, the controller, the store) and the worker's
    # (the pump, the backend, the engine and auto, the model). The App's own module is not on the way: a send
    # never needs it, unless the answer fails.
    trace.check({"specchat.ui.chat", "specchat.ui.answers", "specchat.ui.transcript", "specchat.ui.widgets",
                 "specchat.service.conversation", "specchat.store.conversations", "specchat.ui.streaming",
                 "specchat.service.local", "specchat.service.chat", "specchat.decoding.engine",
                 "specchat.decoding.guessers.auto", "specchat.llama.model"})
