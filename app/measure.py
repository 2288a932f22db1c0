"""The reference's acceptance measurement (speculative-decoding-derived.txt), on any pair.

For each prompt the target writes a greedy answer; then every answer position is scored:
does the draft's argmax match, how much do the two distributions overlap (sum min(p, q)),
would a 2-gram lookup have guessed it; and greedy speculation and prompt lookup are replayed
on the same text to count tokens per step.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from typing import Any, Sequence

import numpy as np

from app.chat import ChatPrompter, Message
from app.controller import MATCH_BUCKETS, CostCurve, expected_tokens, match_bucket
from app.engine import Engine, GenerationConfig, final
from app.guessers import Guesser, lookup, lookup_match
from app.llm import Model, check_compatible
from app.runtime import ModelChoice, load_target, model_paths
from app.sampling import SamplingConfig
from app.workload import load_prompts
from app.errors import SpecchatError


def tokens_per_step_formula(alpha: float, k: int) -> float:
    """Expected tokens per target step with k drafts accepted i.i.d. with probability alpha."""
    return float(expected_tokens(alpha, k))


def replay_greedy(match: Sequence[bool], k: int) -> tuple[int, int]:
    """(tokens, steps) of greedy speculation with k drafts, given per-position draft matches."""
    i, steps, n = 0, 0, len(match)
    while i < n:
        r = 0
        while r < k and i + r < n and match[i + r]:
            r += 1
        i += r + 1
        steps += 1
    return n, steps


def _accepted(guesses: Sequence[int], seq: Sequence[int], i: int) -> int:
    """How many of the guesses for seq[i:] greedy verification accepts: the answer is fixed, so
    their fate can be read off the text."""
    r = 0
    while r < len(guesses) and i + r < len(seq) and guesses[r] == seq[i + r]:
        r += 1
    return r


def replay_lookup(seq: Sequence[int], start: int, max_ngram: int = 3, num: int = 10) -> tuple[int, int]:
    """(tokens, steps) of prompt lookup as deployed, replayed over seq[start:]."""
    i, steps = start, 0
    while i < len(seq):
        i += _accepted(lookup(seq[:i], num, max_ngram), seq, i) + 1
        steps += 1
    return len(seq) - start, steps


def oracle_lookup_seconds(seq: Sequence[int], start: int, curve: CostCurve, max_ngram: int = 3) -> float:
    """Decode time of seq[start:] for a controller that knows, at every step, how many of prompt
    lookup's guesses the target will accept, and drafts exactly those (none if none)."""
    i, seconds = start, 0.0
    while i < len(seq):
        r = _accepted(lookup(seq[:i], 64, max_ngram), seq, i)
        seconds += float(curve.verify(r + 1))
        i += r + 1
    return seconds


def modelled_seconds(seq: Sequence[int], start: int, guesser: Guesser, curve: CostCurve) -> float:
    """Decode time of seq[start:] under the guesser's own choices (greedy), if every step cost
    what the curve says: the controller's decisions judged without timing noise, on the same
    text and curve as the oracle bound. The guesser learns as it would live."""
    rng, greedy = np.random.default_rng(0), SamplingConfig()
    guesser.prepare(seq[:start])
    i, seconds = start, 0.0
    while i < len(seq):
        guess = guesser.propose(seq[:i], min(guesser.default_k, len(seq) - i - 1), greedy, rng)
        r = _accepted(guess.tokens, seq, i)
        step = float(curve.verify(len(guess.tokens) + 1))
        guesser.observe(len(guess.tokens), r, 0.0, step)
        seconds += step
        i += r + 1
    return seconds


def lookup_2gram_hits(seq: Sequence[int], start: int) -> int:
    """Positions whose token a 2-gram lookup (most recent earlier occurrence) predicts."""
    hits = 0
    for i in range(start, len(seq)):
        a, b = seq[i - 2], seq[i - 1]
        guess = next((seq[j + 2] for j in range(i - 3, -1, -1) if seq[j] == a and seq[j + 1] == b), None)
        hits += guess == seq[i]
    return hits


def lookup_hits_by_match(seq: Sequence[int], start: int, cap: int = 32) -> list[tuple[int, bool]]:
    """For each position of seq[start:]: the length of the longest earlier match of the text before
    it, and whether its latest occurrence guesses the token (positions without a match are left out)."""
    out = []
    for i in range(start, len(seq)):
        guess, m = lookup_match(seq[:i], 1, cap)
        if m:
            out.append((m, guess[0] == seq[i]))
    return out


def position_probs(model: Model, prompt: Sequence[int], answer: Sequence[int]) -> np.ndarray:
    """The model's T=1 distribution at each answer position, (len(answer), V)."""
    session = model.session
    session.prefill(prompt)
    logits = np.array(session.decode([prompt[-1], *answer[:-1]], "all"), dtype=np.float64)
    session.rewind(len(prompt) - 1)
    e = np.exp(logits - logits.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _answer(engine: Engine, prompt: list[int], max_tokens: int, sampling: SamplingConfig) -> list[int]:
    ids = list(final(engine.generate(prompt, GenerationConfig(sampling, max_tokens))).token_ids)
    return ids[:-1] if ids and engine.target.is_eog(ids[-1]) else ids


def run_measure(args: argparse.Namespace, choice: ModelChoice) -> int:
    target_path, draft_path = model_paths(choice)
    if draft_path is None:
        raise SpecchatError("measure needs a draft model: use a --pair or pass --draft")
    target = load_target(target_path, choice)
    draft = Model(draft_path, n_ctx=choice.n_ctx, n_threads=choice.threads)
    check_compatible(target, draft)
    engine, prompter = Engine(target), ChatPrompter(target)
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_prompt: dict[str, list[float]] = defaultdict(list)  # greedy agreement of each prompt
    for n, (task, text) in enumerate([item for path in args.prompts for item in load_prompts(path)]):
        prompt = prompter.tokens([Message("user", text)])
        s = sums[task]
        for kind, sampling in (("greedy", SamplingConfig()), ("sampled", SamplingConfig(1.0, seed=args.seed + n))):
            answer = _answer(engine, prompt, args.max_tokens, sampling)
            if not answer:
                continue
            p, q = position_probs(target, prompt, answer), position_probs(draft, prompt, answer)
            s[f"smin_{kind}"] += float(np.minimum(p, q).sum())
            s[f"n_{kind}"] += len(answer)
            if kind != "greedy":
                continue
            match = (q.argmax(-1) == np.asarray(answer)).tolist()
            s["greedy_agree"] += sum(match)
            per_prompt[task].append(sum(match) / len(match))
            seq = prompt + answer
            s["lookup_2gram"] += lookup_2gram_hits(seq, len(prompt))
            for m, hit in lookup_hits_by_match(seq, len(prompt)):
                bucket = _match_bucket(m)
                s[f"hit_{bucket}"] += hit
                s[f"tried_{bucket}"] += 1
            for k in (4, 8):
                toks, steps = replay_greedy(match, k)
                s[f"steps_k{k}"] += steps
            toks, steps = replay_lookup(seq, len(prompt))
            s["lookup_steps"] += steps
        print(f"  {task}: prompt {n + 1} done ({int(s['n_greedy'])} greedy tokens so far)", file=sys.stderr)
    report: dict[str, dict[str, Any]] = {}
    for task, s in sums.items():
        n = s["n_greedy"]
        agree = s["greedy_agree"] / n
        report[task] = {
            "n_tokens": int(n),
            "greedy_agree": agree,
            "greedy_agree_min": min(per_prompt[task]),
            "greedy_agree_max": max(per_prompt[task]),
            "smin_greedy": s["smin_greedy"] / n,
            "smin_sampled": s["smin_sampled"] / max(s["n_sampled"], 1),
            "lookup_2gram": s["lookup_2gram"] / n,
            "tokens_per_step_k4": n / s["steps_k4"],
            "formula_k4": tokens_per_step_formula(agree, 4),
            "tokens_per_step_k8": n / s["steps_k8"],
            "formula_k8": tokens_per_step_formula(agree, 8),
            "lookup_tokens_per_step": n / s["lookup_steps"],
            "lookup_hit_by_match": {label: s[f"hit_{label}"] / s[f"tried_{label}"]
                                    for label in _MATCH_LABELS if s[f"tried_{label}"]},
        }
    _print_measure(report, target.name, draft.name)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


_MATCH_LABELS = [f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in
                 zip((1, *(b + 1 for b in MATCH_BUCKETS)), (*MATCH_BUCKETS, 32))]


def _match_bucket(m: int) -> str:
    """The label of the bucket (as AutoGuesser's estimates use them) that m falls in."""
    return _MATCH_LABELS[match_bucket(m)]


def _print_measure(report: dict[str, dict[str, Any]], target: str, draft: str) -> None:
    print(f"target {target}, draft {draft}")
    cols = ["n_tokens", "greedy_agree", "greedy_agree_min", "greedy_agree_max", "smin_greedy", "smin_sampled", "lookup_2gram", "tokens_per_step_k4",
            "formula_k4", "tokens_per_step_k8", "formula_k8", "lookup_tokens_per_step"]
    widths = [len(c) + 2 for c in cols]
    print(f"{'task':10}" + "".join(f"{c:>{w}}" for c, w in zip(cols, widths)))
    for task, row in report.items():
        print(f"{task:10}" + "".join(f"{row[c]:>{w}.3f}" if isinstance(row[c], float) else f"{row[c]:>{w}}"
                                     for c, w in zip(cols, widths)))
    print("lookup hit rate by match length (the longest earlier match, cap 32, its latest occurrence)")
    print(f"{'task':10}" + "".join(f"{label:>8}" for label in _MATCH_LABELS))
    for task, row in report.items():
        hits = row["lookup_hit_by_match"]
        print(f"{task:10}" + "".join(f"{hits[label]:>8.2f}" if label in hits else f"{'-':>8}" for label in _MATCH_LABELS))
