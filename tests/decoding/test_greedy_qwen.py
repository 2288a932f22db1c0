"""At temperature 0, speculative output equals plain decoding token for token, on the real default
pair and with every guesser. A divergence is excused only as a near-tie judged on a fresh model, under
an absolute ceiling (`specchat.tools.ties`); tests/decoding/test_greedy_check.py shows the check failing on an
engine with planted bugs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from greedy import RecordingEngine, compare, plain_run

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.guessers import AutoGuesser, DraftGuesser, HistoryGuesser, LookupGuesser, NoGuesser
from specchat.decoding.history import HistoryIndex
from specchat.decoding.policy import CostCurve
from specchat.llama.model import Model
from specchat.llama.template import ChatPrompter, Message
from specchat.llama.vocab import check_compatible

pytestmark = pytest.mark.real

PROMPTS = [json.loads(line)["prompt"] for line in
           (Path(__file__).parents[2] / "bench" / "prompts.jsonl").read_text().splitlines()]
CASES = [PROMPTS[0], PROMPTS[1], PROMPTS[6], PROMPTS[10]]  # two rewrites, two open questions


@pytest.fixture(scope="module")
def pair(qwen_paths):
    target, draft = Model(qwen_paths[0], n_ctx=2048), Model(qwen_paths[1], n_ctx=2048)
    check_compatible(target, draft)
    yield target, draft
    draft.close()
    target.close()


# Each guesser on a rewrite and on an open question; auto, which drafts and looks up in one answer, on
# a third; history on a rewrite (each case costs 30 to 90 s on 2 cores).
CHECKS = [(case, guesser) for case in (0, 2) for guesser in ("draft", "lookup", "auto")] + [(1, "auto"), (0, "history")]


def past_answer(target: Model, path: Path, prompt: list[int], n: int) -> HistoryIndex:
    """The user's history holding this prompt's plain answer with every eighth token changed: copies from
    it hold for a while, then miss (the answer is computed once and shared with the comparison)."""
    answer, _ = plain_run(RecordingEngine(target, NoGuesser()), path, prompt, GenerationConfig(max_tokens=n))
    past = [t + 1 if i % 8 == 7 else t for i, t in enumerate(answer)]
    index = HistoryIndex()
    index.add("an earlier conversation", prompt + past)
    return index


@pytest.mark.parametrize(("case", "guesser"), CHECKS)
def test_speculative_greedy_equals_plain(pair, qwen_paths, case, guesser):
    """Every one of 64 tokens is checked: equal, or a reported near-tie where plain decoding had one."""
    target, draft = pair
    prompt = ChatPrompter(target).tokens([Message("user", CASES[case])])
    guessers = {"draft": lambda: DraftGuesser(draft), "lookup": LookupGuesser,
                # A GPU-like cost curve, so that the controller drafts (with early stops) and looks up.
                "auto": lambda: AutoGuesser(CostCurve([0.01 + 0.0002 * n for n in range(16)], 0.001),
                                            {"draft": DraftGuesser(draft)}),
                "history": lambda: HistoryGuesser(index)}
    index = past_answer(target, qwen_paths[0], prompt, 64) if guesser == "history" else None
    found = compare(target, qwen_paths[0], prompt, guessers[guesser], 64, check_rows=False)
    for tie in found.ties:
        warnings.warn(f"{guesser}: {tie.report()}")
    if guesser in ("draft", "history"):  # they guess at every step: kept, rejected and kept in part
        found.exercised()


class Watched(AutoGuesser):
    """auto, counting the trees it sends with a branch copied from the history."""

    history_trees = 0

    def propose(self, context, k, sampling, rng):
        proposal = super().propose(context, k, sampling, rng)
        if proposal.tree is not None and any(source[0] == "history" for source, _, _ in self._tree[1]):
            Watched.history_trees += 1
        return proposal


def test_trees_of_copies_greedy_equal_plain(qwen_paths):
    """auto on a flat curve (verifying more positions costs nothing more, as on a GPU) sends the places
    the text can be copied from that disagree, the history among them, as one tree: the answer is still
    plain decoding's, also where the path kept is not the first branch's (its cells are then another
    sequence's)."""
    target = Model(qwen_paths[0], n_ctx=2048, tree_branches=4)  # by default only where a GPU takes it
    flat = CostCurve([0.01] * 16)
    try:
        # A rewrite, whose text offers more than one place to copy from: of its first 48 tokens 12 steps
        # verified a tree and 3 kept another branch (the other rewrite kept none, 2026-12-03).
        prompt = ChatPrompter(target).tokens([Message("user", CASES[1])])
        index = past_answer(target, qwen_paths[0], prompt, 64)
        Watched.history_trees = 0
        found = compare(target, qwen_paths[0], prompt,
                        lambda: Watched(flat, history=index, tree_branches=target.tree_branches), 64, check_rows=False)
        for tie in found.ties:
            warnings.warn(f"tree: {tie.report()}")
    finally:
        target.close()
    assert found.trees > 0, "no step verified a tree"
    assert found.elsewhere > 0, "every tree kept its first branch: the other sequences went untried"
    assert Watched.history_trees > 0, "no tree had a branch from the history"
