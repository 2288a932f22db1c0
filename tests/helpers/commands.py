"""The real command line, run as a user runs it, for the tests that check what it prints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import platformdirs

REPO = Path(__file__).resolve().parents[2]


def specchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specchat.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


@lru_cache(maxsize=None)
def _measured(cache: Path, *models: str) -> None:
    result = specchat("costs", *models, env={"XDG_CACHE_HOME": str(cache)})
    assert result.returncode == 0, result.stderr


def with_costs(cache: Path, *models: str) -> Path:
    """A cache dir of a test's own that starts with this machine's cost curve for these models (`--target T
    --draft D`): measured once in the user's cache (on a fresh machine; read from it afterwards), so that a test
    about something else spends no 5 to 30 s measuring it again, while what its processes learn stays here."""
    user = Path(platformdirs.user_cache_dir())
    _measured(user, *models)
    (cache / "specchat").mkdir(parents=True, exist_ok=True)
    shutil.copy(user / "specchat" / "costs.json", cache / "specchat" / "costs.json")
    return cache


def assert_clean_error(result: subprocess.CompletedProcess, *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specchat: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]
