"""llama.cpp's threads follow the cores other programs leave free (`specchat.llama.cores`), and the
answer does not change with them."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import llama_cpp
import pytest

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.events import Step
from specchat.llama import cores
from specchat.llama.model import Model


@pytest.mark.parametrize(("n_cores", "others", "most", "threads"), [
    (2, 0.0, 2, 2),  # a quiet machine: every core
    (2, 0.4, 2, 2),  # a program on less than half a core leaves it to llama.cpp
    (2, 0.67, 2, 1),  # one busy loop sharing two cores with llama.cpp's two threads
    (2, 1.9, 2, 1),  # never none
    (16, 3.2, 8, 8),  # never more than it was given
    (4, 1.0, 4, 3),
])
def test_threads_are_the_cores_left(n_cores, others, most, threads):
    assert cores.threads_for(n_cores, others, most) == threads


class Context:
    def __init__(self, n_threads: int) -> None:
        self.n_threads = self.threads = n_threads

    def use_threads(self, n: int) -> None:
        self.threads = n


def test_the_fitter_measures_each_window_and_starts_again_after_a_pause(tmp_path, monkeypatch):
    """Other programs' share of the CPU is the machine's busy time less this process's own, over a window:
    one core taken of two leaves one thread; quiet again, every thread. A core is given up after a
    half-second window and taken back after a tenth of a second: a window is short while a thread is
    given up, just after a change, and at a start. A reading older than a pause is not used, and the
    contexts go back to every thread until a new window is measured."""
    stat, tick = tmp_path / "stat", os.sysconf("SC_CLK_TCK")
    clock, own = [100.0], [10.0]
    monkeypatch.setattr(cores, "PROC_STAT", str(stat))
    monkeypatch.setattr(cores, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(cores, "own_s", lambda: own[0])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    fitter, two, one = cores._Fitter(), Context(2), Context(1)
    fitter.contexts.update((two, one))

    def at(t: float, busy_s: float, own_s: float) -> None:
        clock[0], own[0] = t, own_s
        stat.write_text(f"cpu  {round(busy_s * tick)} 0 0 999999 0 0 0 0 0 0\n")
        fitter.refit()

    # (Times in eighths of a second: sums a float gives exactly.)
    at(100.0, 1000.0, 10.0)  # the first window opens: a short one
    at(100.125, 1000.25, 10.25)  # all of it ours: every thread, and the next window a long one
    assert (two.threads, one.threads, fitter.others, fitter.windows) == (2, 1, pytest.approx(0.0, abs=1e-9), 1)
    at(100.375, 1000.75, 10.375)  # within the long window: not read, however busy
    assert (two.threads, fitter.windows) == (2, 1)
    at(100.625, 1001.25, 10.75)  # 1 s busy in half a second, half of it ours: one core taken
    assert (two.threads, one.threads, fitter.others) == (1, 1, pytest.approx(1.0))
    at(100.75, 1001.5, 10.875)  # an eighth of a second later, read: still taken
    assert (two.threads, fitter.others, fitter.windows) == (1, pytest.approx(1.0), 3)
    at(100.8125, 1009.0, 10.875)  # within the short window: not read (130 s of others in 0.06 s would be nonsense)
    assert (two.threads, fitter.windows) == (1, 3)
    at(100.875, 1001.75, 11.125)  # all of it ours: the core back, and a short window to see that it stays free
    assert (two.threads, fitter.others) == (2, pytest.approx(0.0, abs=1e-9))
    at(101.0, 1002.0, 11.25)  # it did not
    assert (two.threads, fitter.others) == (1, pytest.approx(1.0))
    at(101.125, 1002.25, 11.5)  # free again, and it stays so: a long window again
    at(101.25, 1002.5, 11.75)
    assert (two.threads, fitter.windows) == (2, 7)
    at(120.0, 1100.0, 14.0)  # after a pause: a new window, every thread meanwhile, and a short one
    assert (two.threads, one.threads) == (2, 1)
    at(120.125, 1100.25, 14.125)
    assert (two.threads, fitter.others) == (1, pytest.approx(1.0))
    stat.write_text("not the kernel's counters\n")
    clock[0] = 121.0
    fitter.refit()  # unreadable: nothing changes
    assert (two.threads, fitter.others) == (1, pytest.approx(1.0))


def _burner() -> subprocess.Popen:
    """A busy loop in another process, bounded to a minute whatever happens to this one."""
    return subprocess.Popen([sys.executable, "-c",
                             "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass"])


def _until(engine: Engine, prompt: list[int], reference: tuple[int, ...], done, answers: int = 30) -> list[int]:
    """Answer until `done(threads each step ran with)` holds (at most `answers` answers), each the same as
    the reference: threads that change, even within an answer, change no token."""
    for _ in range(answers):
        threads = []
        events = engine.generate(prompt, GenerationConfig(max_tokens=len(reference)))
        for event in events:
            if isinstance(event, Step):  # as llama.cpp has it, not as the model says
                threads.append(llama_cpp.llama_n_threads(engine.target._ctx.ctx))
            else:
                last = event
        assert last.token_ids == reference, "the answer changed with the thread count"
        if done(threads):
            return threads
    raise AssertionError(f"not within {answers} answers; the last ran on {sorted(set(threads))} threads, "
                         f"others took {cores.FITTER.others:.2f} cores")


def test_a_busy_core_takes_a_thread_and_gives_it_back(smol_path):
    """While a busy loop runs beside it, SmolLM2 decodes with a thread fewer, and with all of them again
    once it stops, each answer token for token the one a model with a fixed thread count gives. Its own
    busy loop: not to be run beside a model (the suite runs one test at a time)."""
    n = os.cpu_count() or 1
    if n < 2:
        pytest.skip("one core: there is no thread to give up")
    fixed, fitted = Model(smol_path, n_ctx=512, n_threads=n), Model(smol_path, n_ctx=512)
    try:
        prompt = fixed.tokenize("Once upon a time, in a small village by the sea, there lived", add_bos=True)
        reference = final(Engine(fixed).generate(prompt, GenerationConfig(max_tokens=200))).token_ids
        engine = Engine(fitted)
        start = cores.FITTER.windows
        before = _until(engine, prompt, reference, lambda threads: cores.FITTER.windows >= start + 2)[-1]
        if before < 2:
            pytest.skip(f"other programs already take all but one core ({cores.FITTER.others:.1f} cores)")
        burner = _burner()
        try:
            _until(engine, prompt, reference, lambda threads: min(threads) < before)
        finally:
            burner.kill()
            burner.wait()
        _until(engine, prompt, reference, lambda threads: threads[-1] == before)
    finally:
        fitted.close()
        fixed.close()
