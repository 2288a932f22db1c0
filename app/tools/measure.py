"""`specchat measure`: the reference's acceptance measurement (speculative-decoding-derived.txt), on any pair.

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
from typing import Any

import numpy as np

from specchat.decoding.engine import GenerationConfig, final
from specchat.decoding.policy import MATCH_BUCKETS, match_bucket
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.local import open_local
from specchat.tools.promptsets import load_prompts
from specchat.tools.reading import position_probs
from specchat.tools.replay import lookup_2gram_hits, lookup_hits_by_match, replay_greedy, replay_lookup, tokens_per_step_formula


def _answer(service: ChatService, text: str, max_tokens: int, sampling: SamplingConfig) -> tuple[list[int], list[int]]:
    """The target's own answer to the prompt, plainly decoded: (prompt tokens, answer tokens, no end token)."""
    ids = list(final(service.chat([Message("user", text)], GenerationConfig(sampling, max_tokens), "none")).token_ids)
    return service.last_prompt, ids[:-1] if ids and service.target.is_eog(ids[-1]) else ids


def run_measure(args: argparse.Namespace, choice: ModelChoice) -> int:
    service = open_local(choice)
    target, draft = service.target, service.pair.draft
    if draft is None:
        raise SpecchatError("measure needs a draft model: use a --pair or pass --draft")
    sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    per_prompt: dict[str, list[float]] = defaultdict(list)  # greedy agreement of each prompt
    for n, (task, text) in enumerate([item for path in args.prompts for item in load_prompts(path)]):
        s = sums[task]
        for kind, sampling in (("greedy", SamplingConfig()), ("sampled", SamplingConfig(1.0, seed=args.seed + n))):
            prompt, answer = _answer(service, text, args.max_tokens, sampling)
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
    report = _report(sums, per_prompt)
    _print_measure(report, target.name, draft.name)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _report(sums: dict[str, dict[str, float]], per_prompt: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    """Per task, the sums over its answers as rates: agreement, the acceptance bound, and tokens per step
    replayed beside the formula's."""
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
    return report


_MATCH_LABELS = [f"{lo}-{hi}" if hi > lo else f"{lo}" for lo, hi in
                 zip((1, *(b + 1 for b in MATCH_BUCKETS)), (*MATCH_BUCKETS, 32))]


def _match_bucket(m: int) -> str:
    """The label of the bucket (as AutoGuesser's estimates use them) that m falls in."""
    return _MATCH_LABELS[match_bucket(m)]


def _print_measure(report: dict[str, dict[str, Any]], target: str, draft: str) -> None:
    print(f"target {target}, draft {draft}")
    cols = ["n_tokens", "greedy_agree", "greedy_agree_min", "greedy_agree_max", "smin_greedy", "smin_sampled",
            "lookup_2gram", "tokens_per_step_k4", "formula_k4", "tokens_per_step_k8", "formula_k8", "lookup_tokens_per_step"]
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
