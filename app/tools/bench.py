"""Plain against speculative decoding, side by side in one process, on a prompt set.

For each prompt and repeat, plain decoding and every chosen guesser run back to back, so
that machine noise hits them alike; speedups are ratios within the same repeat, and the
reported figures are medians over repeats. Plain decoding runs again after the guessers: each
guesser is measured against plain timed on both sides of it, and plain again's ratio to the first
plain run is what the machine's own noise does to a ratio in this run, the yardstick for every
other (a guesser 3% behind plain means nothing where plain is 5% behind itself).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

from specchat.decoding.engine import GenerationConfig, final
from specchat.decoding.events import Stats, Step
from specchat.decoding.guessers import build
from specchat.decoding.policy import CostCurve
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.choices import ModelChoice
from specchat.service.local import open_local
from specchat.tools.judging import Judged, by_clock, clock_curve, judge
from specchat.tools.promptsets import load_prompts
from specchat.tools.reading import recorded
from specchat.tools.recorded import Answer
from specchat.tools.replay import tokens_per_step_formula


def run_bench(args: argparse.Namespace, choice: ModelChoice, config: GenerationConfig) -> int:
    if args.repeat < 1:
        raise SpecchatError(f"--repeat must be at least 1, got {args.repeat}")
    prompts = [item for path in args.prompts for item in load_prompts(path)]
    # Today's costs, measured now: a machine's speed drifts (a cached curve here once put 2
    # positions at 1.55 single steps; the same machine later took 1.9), and both auto and the
    # oracle bound judge by it. The bound keeps this measurement; auto starts from its own copy.
    service = open_local(choice, fresh_costs=True)
    target = service.target
    curve = service.pair.curve().copy()  # as measured: the live one learns from the runs below
    guessers = {"plain": "none", **{name: name for name in args.guesser}, AGAIN: "none"}
    answers: dict[str, list[Answer]] = defaultdict(list)  # task -> plain's answers, for the modelled figures
    own: dict[str, list[Answer]] = defaultdict(list)  # task -> auto's answers: its text parts from plain's in places
    steps: dict[str, dict[str, list[Step]]] = defaultdict(lambda: defaultdict(list))  # task -> plain's, auto's
    # runs[task][guesser][repeat] -> list of Stats over that task's prompts
    runs: dict[str, dict[str, list[list[Stats]]]] = defaultdict(
        lambda: {g: [[] for _ in range(args.repeat)] for g in guessers})
    for n, (task, text) in enumerate(prompts, 1):
        # Each prompt is a new conversation, so every guesser starts afresh, as in the app and `generate`.
        messages = [Message("user", text)]
        for rep in range(args.repeat):
            for label, name in guessers.items():
                events = list(service.chat(messages, config, name))
                done = final(events)
                runs[task][label][rep].append(done.stats)
                if label in ("plain", "auto"):
                    steps[task][label] += [event for event in events if isinstance(event, Step)]
                    if rep == 0:
                        (answers if label == "plain" else own)[task].append(
                            recorded(task, text, config.sampling.temperature, service.last_prompt, done.token_ids,
                                     service.pair.draft))
        print(f"  prompt {n}/{len(prompts)} ({task}) done", file=sys.stderr)

    draft_lengths = {label: config.draft_length if config.draft_length is not None else
                     build(name, service.inputs(costs=True)).default_draft_length for label, name in guessers.items()}
    # Live auto decides by the live curve, which the answers above corrected as they ran: its choices are
    # modelled, as `bench/corpus` judges recorded answers, on the measurement it started from and on the curve it
    # ended on, which brackets them. A batch rounds differently from a single step, so live auto's greedy text
    # can part from plain's at a near-tie: replayed on its own text as well, the model is held to what ran.
    learned = service.pair.curve().copy()
    modelled = {task: judge(plains, curve, piece=target.piece) for task, plains in answers.items()}
    relearned = {task: judge(plains, learned, bound=False, piece=target.piece) for task, plains in answers.items()}
    on_own = {task: judge(owns, learned, bound=False, piece=target.piece) for task, owns in own.items()}
    # And as the engine ran it: every step charged what steps of its size cost by the clock in this run, proposing
    # included, against plain's steps timed alike. What is left between this and the measurement is auto's choices.
    clocked = {task: by_clock(owns, learned, clock_curve(steps[task]["auto"], learned),
                              clock_curve(steps[task]["plain"], learned).verify_s[0], target.piece)
               for task, owns in own.items()}
    report = _report(runs, modelled, relearned, on_own, clocked, draft_lengths)
    _print_bench(report, target.name, args.repeat)
    print(f"cost curve, in plain steps at {', '.join(map(str, CURVE_AT))} positions: measured at the start "
          f"{_shape(curve)} (the bound's and the modelled auto's), learned by the end {_shape(learned)}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


CURVE_AT = (2, 4, 8, 16)
AGAIN = "plain again"


def _shape(curve: CostCurve) -> str:
    return ", ".join(f"{float(curve.verify(n) / curve.verify(1)):.2f}" for n in CURVE_AT)


def _report(runs: dict[str, dict[str, list[list[Stats]]]], modelled: dict[str, Judged], relearned: dict[str, Judged],
            on_own: dict[str, Judged], clocked: dict[str, float],
            draft_lengths: dict[str, int]) -> dict[str, dict[str, dict[str, float]]]:
    """Per task and guesser: acceptance, tokens per step against the formula, and medians of tok/s and of the
    speedup within each repeat (against plain before and after it); then the oracle bound and the modelled auto
    on plain's text, on the curve measured at the start (and the auto on the one the answers taught by the end, on
    plain's text and on live auto's own, priced by that curve and by this run's clock)."""
    report: dict[str, dict[str, dict[str, float]]] = {}
    for task, by_guesser in runs.items():
        plain_tps = [_tps(r) for r in by_guesser["plain"]]
        again_tps = [_tps(r) for r in by_guesser[AGAIN]]
        report[task] = {}
        for i, (name, reps) in enumerate(by_guesser.items()):
            # Each guesser against plain decoding timed on both sides of it, weighed by where it ran between them:
            # a machine that slows or speeds up during a repeat moves the reference with it, and two plain runs
            # halve what one run's noise does to it. Plain again stays against plain alone: this run's noise.
            weight = 0.0 if name == AGAIN else i / (len(by_guesser) - 1)
            reference = [(1 - weight) * p + weight * a for p, a in zip(plain_tps, again_tps)]
            pooled = [s for rep in reps for s in rep]
            total = Stats.total(pooled)
            k = draft_lengths[name]
            tps = [_tps(r) for r in reps]
            report[task][name] = {
                "acceptance": total.acceptance,
                "alpha": total.alpha,
                "tokens_per_step": total.tokens_per_step,
                "formula_tokens_per_step": tokens_per_step_formula(total.alpha, k),
                "k": k,
                "tokens_per_s": statistics.median(tps),
                "speedup_vs_plain": statistics.median(ratios := [t / p for t, p in zip(tps, reference)]),
                "speedup_low": min(ratios),
                "speedup_high": max(ratios),
            }
    for task, judged in modelled.items():
        report[task]["oracle"] = {"speedup_vs_plain": judged.bound}
        report[task]["modelled"] = {"speedup_vs_plain": judged.auto, "share_of_oracle_gain": judged.share}
        report[task]["modelled_learned"] = {"speedup_vs_plain": relearned[task].auto}
        if task in on_own:
            report[task]["modelled_own"] = {"speedup_vs_plain": on_own[task].auto}
            report[task]["modelled_clock"] = {"speedup_vs_plain": clocked[task]}
    return report


def _tps(stats: list[Stats]) -> float:
    seconds = sum(s.decode_s for s in stats)
    return sum(s.n_tokens for s in stats) / seconds if seconds else 0.0


def _print_bench(report: dict[str, dict[str, dict[str, float]]], target: str, repeat: int) -> None:
    print(f"target {target}; medians of {repeat} side-by-side runs, and the lowest and highest of them; "
          f"'{AGAIN}' is plain against itself, this run's noise")
    columns = f"{'guesser':12}{'k':>4}{'acceptance':>12}{'alpha':>7}{'tok/step':>10}{'formula':>9}{'tok/s':>8}"
    print(f"{'task':10}{columns}{'speedup':>9}{'runs':>12}")
    for task, rows in report.items():
        for name, r in rows.items():
            label = {"oracle": "oracle bound (any copy or the draft, by the cost curve)",
                     "modelled_learned": "auto modelled on the curve the answers taught by the end",
                     "modelled_own": "... and on live auto's own text",
                     "modelled_clock": "... each step at what its size cost in this run"}.get(name)
            if name == "modelled":
                share = r["share_of_oracle_gain"]
                label = "auto modelled (same text and curve" + (f": {share:.0%} of the bound's gain)"
                                                                if share is not None else ")")
            if label is None:
                label = (f"{name:12}{r['k']:>4}{r['acceptance']:>12.3f}{r['alpha']:>7.3f}{r['tokens_per_step']:>10.2f}"
                         f"{r['formula_tokens_per_step']:>9.2f}{r['tokens_per_s']:>8.1f}")
                spread = f"{r['speedup_low']:.2f}-{r['speedup_high']:.2f}"
            else:
                spread = ""
            print(f"{task:10}{label:{len(columns)}}{r['speedup_vs_plain']:>8.2f}x{spread:>12}".rstrip())
