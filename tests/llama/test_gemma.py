"""Gemma 3 270M (real, a base model with sliding-window attention): its cache stays full-size, so a
rewind past the 512-token window works like any other, and a base model is completed, not chatted with."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from commands import REPO
from conftest import model_path

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import LookupGuesser, NoGuesser
from specchat.llama.model import Model
from specchat.llama.session import Memory

pytestmark = pytest.mark.real
PARAGRAPH = ("The harbour master kept a ledger of every ship that came in: its name, its cargo, the day it "
             "arrived and the day it left. ")


@pytest.fixture(scope="module")
def gemma() -> Model:
    model = Model(model_path("gemma-3-270m"), n_ctx=2048)
    yield model
    model.close()


def long_prompt(model: Model, at_least: int) -> list[int]:
    text = PARAGRAPH
    while len(model.tokenize(text, add_bos=True)) < at_least:
        text += PARAGRAPH
    return model.tokenize(text, add_bos=True)


def test_lookup_past_the_window_equals_plain_decoding_and_so_does_a_second_run(gemma):
    assert gemma.n_swa == 512 and gemma.memory is Memory.TRIM
    prompt = long_prompt(gemma, 552)
    assert len(prompt) >= 552  # the answer's positions all lie beyond the window
    config = GenerationConfig(max_tokens=48)
    plain = final(Engine(gemma, NoGuesser()).generate(prompt, config))
    lookup = final(Engine(gemma, LookupGuesser()).generate(prompt, config))
    assert lookup.token_ids == plain.token_ids and lookup.stats.accepted > 0
    assert lookup.stats.rejections > 0  # rejected guesses were cut from a cache longer than the window
    again = final(Engine(gemma, LookupGuesser()).generate(prompt, config))
    assert again.token_ids == plain.token_ids and again.stats.cached == len(prompt) - 1


def test_a_base_model_is_refused_a_chat_and_completes_raw_text(tmp_path):
    path = str(model_path("gemma-3-270m"))

    def specchat(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "specchat.cli", "generate", *args, "--target", path,
                               "--max-tokens", "8"], capture_output=True, text=True, cwd=REPO, timeout=300,
                              env=env)

    # As on a machine that never measured this model: the refusal comes first and alone, not after the
    # first run's measurement of the cost curve.
    chat = specchat("Hello", env={**os.environ, "XDG_CACHE_HOME": str(tmp_path),
                                  "SPECCHAT_MODELS_DIR": str(Path(path).parent)})
    assert chat.returncode == 2 and "Traceback" not in chat.stderr
    lines = chat.stderr.strip().splitlines()
    assert len(lines) == 1, chat.stderr
    assert "has no chat template: it is a base model" in lines[0] and "specchat generate --raw" in lines[0]
    raw = specchat("The capital of France is", "--raw")
    assert raw.returncode == 0, raw.stderr
    assert raw.stdout.strip() and raw.stderr.strip().splitlines()[-1].startswith("[auto] ")


def test_costs_says_what_the_full_size_window_cache_takes(tmp_path):
    result = subprocess.run([sys.executable, "-m", "specchat.cli", "costs", "--target", str(model_path("gemma-3-270m")),
                             "--ctx", "4096"], capture_output=True, text=True, cwd=REPO, timeout=600,
                            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("cache: "))
    full, small = map(float, re.search(r"([\d.]+) MiB for the 4096-token context, against ([\d.]+) MiB", line).groups())
    assert line.startswith("cache: sliding window of 512 tokens, kept at full size") and full > 2 * small
