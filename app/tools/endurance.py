"""A long scripted session through the real app: `specchat endurance --minutes 20`.

It chats, switches guessers, stops answers midway, regenerates and rewrites a document, as a
person keeping the app open all day would, and checks after every answer that the numbers
the engine, the stats panel and the database report agree. Memory is sampled after each
answer. It ends with a greedy answer that a fresh process must reproduce token for token,
which shows the KV caches stayed consistent through everything before it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from specchat.service.choices import ModelChoice
from specchat.store.conversations import Store

PROMPTS = [
    "Explain in two sentences what a hash table is.",
    "Write a haiku about autumn rain.",
    "List four uses of a paperclip.",
    "What is the capital of France, and why is it famous?",
    "Rewrite this more formally: hey, the meeting got moved to friday, can u come?",
    "Give me a short Python function that reverses a string.",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "What are the three states of matter?",
]
DOCUMENT = ("Our team met on tuesday to discus the new release. Every body agreed that the tests "
            "needs more coverage before we ship.\n\nThe next meeting is on friday at 10am.\n")
LONG_PROMPT = "Tell me a long story about a lighthouse keeper and a storm."  # for the turns that stop early
HOLD_S = 60.0  # the longest a held answer waits for its stop
FINAL_PROMPT = "Describe the water cycle in four sentences."


@dataclass
class Report:
    answers: int = 0
    stops: int = 0
    regenerations: int = 0
    rewrites: int = 0
    switches: int = 0
    problems: list[str] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)  # resident memory after each answer
    peak_mb: list[float] = field(default_factory=list)  # the process's peak so far, after each answer
    final: str = ""
    fresh: str = ""
    # The final answer's prompt and token ids, in the session and in the fresh process.
    prompt_ids: list[int] = field(default_factory=list)
    final_ids: list[int] = field(default_factory=list)
    fresh_ids: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # explained differences, e.g. a floating-point near-tie

    def memory_flat(self) -> bool:
        """The last third of the session peaks no higher than the first third, within 5% + 32 MB
        (allocator noise); the first answers are where caches and buffers legitimately grow."""
        third = max(1, len(self.rss_mb) // 3)
        return max(self.rss_mb[-third:]) <= max(self.rss_mb[:third]) * 1.05 + 32

    def lines(self) -> list[str]:
        third = max(1, len(self.rss_mb) // 3)
        return [
            f"answers {self.answers} (stopped {self.stops}, regenerated {self.regenerations}), "
            f"rewrites {self.rewrites}, guesser switches {self.switches}",
            f"resident memory after each answer: first third max {max(self.rss_mb[:third]):.0f} MB, "
            f"last third max {max(self.rss_mb[-third:]):.0f} MB, process peak {self.peak_mb[-1]:.0f} MB "
            f"-> {'flat' if self.memory_flat() else 'GROWING'}",
            f"final greedy answer equals a fresh process's: {self.final == self.fresh} ({len(self.final)} chars)",
            *(f"  {note}" for note in self.notes),
            f"problems: {len(self.problems)}", *(f"  {p}" for p in self.problems),
        ]


def _rss_mb() -> tuple[float, float]:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux
    return pages * resource.getpagesize() / 2**20, peak_kb / 1024


def check_answer(app, report: Report) -> None:
    """The panel's running totals, the per-step figures and the stored answer must agree."""
    from specchat.ui.widgets import StatsPanel

    panel = app.query_one(StatsPanel)
    steps, t = panel.steps, panel.totals
    stored = app.store.messages(app.conversation_id)[-1]
    rejected = sum(s.drafted - s.accepted for s in steps)
    checks = {
        "every step accepts at most what it drafted": all(0 <= s.accepted <= s.drafted for s in steps),
        "drafted == accepted + rejected": t.drafted == t.accepted + rejected == sum(s.drafted for s in steps),
        "rejecting steps counted once each": t.rejections == sum(s.accepted < s.drafted for s in steps),
        "tokens add up over steps": t.n_tokens == sum(len(s.tokens) for s in steps),
        "guessed tokens shown <= accepted": sum(tok.source.value == "draft" for s in steps for tok in s.tokens)
        <= t.accepted,
        "stored answer finished": stored.role == "assistant" and stored.status in ("complete", "stopped"),
        "stored token count == panel's": (stored.stats or {}).get("tokens") == t.n_tokens,
        "stored text == shown text": stored.content == app.query("MessageView").last().content,
    }
    report.problems += [f"answer {report.answers}: {name}" for name, ok in checks.items() if not ok]
    rss, peak = _rss_mb()
    report.rss_mb.append(rss)
    report.peak_mb.append(peak)
    report.answers += 1


async def _until(pilot, condition, what: str, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"endurance: timed out waiting for {what}")
        await pilot.pause(0.02)


async def _ask(pilot, app, prompt: str, stop: StopPoint | None = None) -> None:
    before = len(app.store.messages(app.conversation_id))
    if stop is not None:
        stop.arm()
    app.query_one("#input").text = prompt
    await pilot.press("enter")

    def answered() -> bool:  # its answer is stored, and no longer streaming
        messages = app.store.messages(app.conversation_id)
        return len(messages) >= before + 2 and not app.generating and messages[-1].status != "partial"

    if stop is not None:
        await _until(pilot, lambda: answered() or stop.holding.is_set(), "the answer's first step")
        await pilot.press("escape")
    await _until(pilot, answered, "the answer")


class StopPoint:
    """Holds an answer after its first step until the user stops it (Esc), so that a stop lands midway
    whatever the machine's speed: pressed when tokens showed, it came after the whole answer on a faster
    CPU. The app's own stream, wrapped where the backend hands it over (as `_record_ids` does)."""

    def __init__(self, backend) -> None:
        from specchat.decoding.events import Step

        self.armed, self.holding = False, threading.Event()
        chat = backend.chat

        def held(messages, config, guesser, cancel, *more):  # more: thinking, and tools, as the app passes them
            armed, self.armed = self.armed, False
            self.holding.clear()
            for event in chat(messages, config, guesser, cancel, *more):
                yield event
                if armed and isinstance(event, Step) and event.tokens:
                    armed = False
                    self.holding.set()
                    cancel.wait(HOLD_S)  # the Esc; the engine sees it at its next step
        backend.chat = held

    def arm(self) -> None:
        """The next answer is held after its first step that shows tokens."""
        self.armed = True


async def _rewrite(pilot, app, doc: Path, report: Report) -> None:
    from specchat.ui.rewrite import RewriteScreen

    await pilot.press("ctrl+o")
    await _until(pilot, lambda: len(app.screen_stack) > 1, "the path prompt")
    app.screen.query_one("#prompt-input").value = str(doc)
    await pilot.press("enter")
    await _until(pilot, lambda: isinstance(app.screen, RewriteScreen), "the rewrite screen")
    screen = app.screen
    await pilot.press("ctrl+r")  # starts the rewrite worker: `running` is set before the key returns
    await _until(pilot, lambda: not screen.running, "the rewrite")
    if screen.result is None:
        report.problems.append(f"rewrite of {doc.name} gave no result")
    await pilot.press("ctrl+s")
    await pilot.press("escape")
    await _until(pilot, lambda: not isinstance(app.screen, RewriteScreen), "the chat screen")


async def drive(choice: ModelChoice, workdir: Path, minutes: float, seed: int = 0,
                final_only: bool = False, min_turns: int = 0) -> Report:
    from specchat.service.settings import Settings, save_settings
    from specchat.ui.app import SpecchatApp

    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.toml"
    save_settings(Settings(max_tokens=96), config)
    rng, report = random.Random(seed), Report()
    app = SpecchatApp(choice, store=Store(workdir / "chat.db"), settings_path=config)
    app.notify = lambda message, **kw: report.problems.append(f"notification: {message}") \
        if kw.get("severity") == "error" else None
    async with app.run_test(headless=True, size=(140, 40)) as pilot:
        await _until(pilot, lambda: app.ready, "the models to load")
        stops = StopPoint(app.backend)
        end = time.monotonic() + minutes * 60
        turn = 0
        # For `minutes`, and at least `min_turns` turns: on a slow machine a short session still
        # stops, regenerates and rewrites (every 3rd, 4th and 7th turn).
        while not final_only and (time.monotonic() < end or turn < min_turns):
            turn += 1
            await _turn(pilot, app, turn, rng, stops, workdir, report)
        # The check: greedy, no guesser, a new conversation, against a process that did nothing else.
        app.apply_settings(replace(app.settings, guesser="none", temperature=0.0))
        await pilot.press("ctrl+n")
        _record_ids(app.backend, report)
        await _ask(pilot, app, FINAL_PROMPT)
        check_answer(app, report)
        report.final = app.store.messages(app.conversation_id)[-1].content
    return report


async def _turn(pilot, app, turn: int, rng: random.Random, stops: StopPoint, workdir: Path, report: Report) -> None:
    """One turn of the session: switch the guesser, and now and then start a new chat, rewrite a document,
    stop an answer midway or regenerate one."""
    from specchat.ui.widgets import StatsPanel

    await pilot.press("ctrl+g")
    report.switches += 1
    if turn % 6 == 0:
        await pilot.press("ctrl+n")
    if turn % 7 == 0:
        doc = workdir / f"doc-{turn}.md"
        doc.write_text(DOCUMENT)
        await _rewrite(pilot, app, doc, report)
        report.rewrites += 1
        if doc.read_text() != DOCUMENT:
            report.problems.append(f"turn {turn}: the rewrite changed the original document")
        return
    stop = stops if turn % 3 == 0 else None
    await _ask(pilot, app, LONG_PROMPT if stop else rng.choice(PROMPTS), stop)
    check_answer(app, report)
    report.stops += stop is not None and app.store.messages(app.conversation_id)[-1].status == "stopped"
    if turn % 4 == 0:
        # The new answer is a branch beside the old one, last on screen once it is stored: that
        # it started shows as the stats panel's fresh list of steps.
        panel = app.query_one(StatsPanel)
        old = panel.steps
        await pilot.press("ctrl+r")
        await _until(pilot, lambda: panel.steps is not old and not app.generating
                     and app.store.messages(app.conversation_id)[-1].status != "partial", "the regeneration")
        check_answer(app, report)
        report.regenerations += 1


def _record_ids(backend, report: Report) -> None:
    """Keep the next answer's prompt and token ids: a difference from the fresh process's answer is
    then explained (or not) token by token."""
    from specchat.decoding.events import Done

    chat = backend.chat

    def recording(messages, config, guesser, cancel, *more):
        for event in chat(messages, config, guesser, cancel, *more):
            if isinstance(event, Done):
                report.prompt_ids, report.final_ids = list(backend.service.last_prompt), list(event.token_ids)
            yield event
    backend.chat = recording


def explain_divergence(choice: ModelChoice, prompt: list[int], ours: list[int], fresh: list[int]) -> tuple[bool, str]:
    """Whether the first token where two greedy answers differ is a near-tie that evaluation order
    decides (the session reused a cached prefix; the fresh process did not), judged as the
    greedy-equivalence test judges it (`specchat.tools.ties`)."""
    from specchat.service.loader import DEFAULT_CONTEXT, model_paths
    from specchat.tools.ties import parting

    # The session's answer reused a cache its earlier, longer prompts wrote; the fresh process's did not.
    found = parting(model_paths(choice)[0], prompt, ours, fresh, choice.n_ctx or DEFAULT_CONTEXT, choice.threads,
                    reused=True)
    if found is None:
        return True, "the answers are the same"
    return found.tie, found.report()


def fresh_answer(choice: ModelChoice, workdir: Path) -> tuple[str, list[int]]:
    cmd = [sys.executable, "-m", "specchat.tools.endurance", "--workdir", str(workdir)]
    cmd += ["--ctx", str(choice.n_ctx)] if choice.n_ctx else []
    cmd += ["--pair", choice.pair] if choice.pair else []
    cmd += ["--threads", str(choice.threads)] if choice.threads else []
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout
    fresh = json.loads(out.strip().splitlines()[-1])
    return fresh["final"], fresh["ids"]


def run(choice: ModelChoice, workdir: Path, minutes: float, seed: int = 0, min_turns: int = 0) -> Report:
    report = asyncio.run(drive(choice, workdir / "session", minutes, seed, min_turns=min_turns))
    report.fresh, report.fresh_ids = fresh_answer(choice, workdir / "fresh")
    if report.final != report.fresh:
        tie, why = explain_divergence(choice, report.prompt_ids, report.final_ids, report.fresh_ids)
        if tie:
            report.notes.append(f"a floating-point near-tie, not a defect: {why}")
        else:
            report.problems.append(f"the final greedy answer differs from a fresh process's: {why}")
    if not report.memory_flat():
        report.problems.append("resident memory grew over the session")
    return report


def main(argv: list[str] | None = None) -> int:
    """The fresh process of the final check: only the final greedy answer, printed as JSON."""
    p = argparse.ArgumentParser(prog="python -m specchat.tools.endurance")
    p.add_argument("--pair", default=None)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    choice = ModelChoice(pair=args.pair, n_ctx=args.ctx, threads=args.threads)
    report = asyncio.run(drive(choice, args.workdir, 0, final_only=True))
    print(json.dumps({"final": report.final, "ids": report.final_ids}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
