"""The greedy-equivalence check that the real-model tests share: speculative output against plain
decoding, token for token, where a divergence must be a near-tie (`specchat.tools.ties`): each run's
token the top of the logits it chose from (recorded as the run computed them), leading the other by
less than the noise measured on a fresh model, and less than the ceiling; or the check fails."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from specchat.llama.model import Model
from specchat.spec.engine import Engine, GenerationConfig, Stats, final
from specchat.spec.guessers import Guesser, NoGuesser
from specchat.tools.ties import Parting, parting


class RecordingEngine(Engine):
    """Keeps the target's logits for every generated position, as this run computed them."""

    rows: dict[int, np.ndarray]
    n_prompt: int
    stats: Stats  # the last run's
    trees: int = 0  # steps that verified a tree
    elsewhere: int = 0  # ... and kept a path that is not the first branch's (seq 0's)

    def _verify(self, pending, draft, draft_probs, sampling, rng):
        first = len(self.target.session.tokens) + 1 - self.n_prompt  # generated position of row 0
        verdict = super()._verify(pending, draft, draft_probs, sampling, rng)
        logits = self.target.session.last_logits(len(draft) + 1)
        for j in range(verdict.n_accepted + 1):
            self.rows[first + j] = np.array(logits[j])
        return verdict

    def _verify_tree(self, pending, tree, sampling, rng):
        first = len(self.target.session.tokens) + 1 - self.n_prompt
        path, token = super()._verify_tree(pending, tree, sampling, rng)
        logits = self.target.session.last_logits(len(tree.tokens) + 1)
        for j, row in enumerate([0, *(n + 1 for n in path)]):  # the root's row, then each kept node's
            self.rows[first + j] = np.array(logits[row])
        self.trees += 1
        self.elsewhere += bool(path) and path[0] != tree.children(-1)[0]
        return path, token

    def run(self, prompt: list[int], config: GenerationConfig) -> tuple[int, ...]:
        self.n_prompt, self.rows, self.trees, self.elsewhere = len(prompt), {}, 0, 0
        done = final(self.generate(prompt, config))
        self.stats = done.stats
        return done.token_ids


# Plain decoding's answers (and the rows they chose from) for one model file, per prompt so far: every
# guesser, and a context built for trees, is held to the same ones, so each is decoded once, not once
# per guesser. Only the latest file's are kept (a 64-token answer's rows are 39 MB on the default pair).
_plain: dict[tuple, tuple[tuple[int, ...], dict[int, np.ndarray]]] = {}


def plain_run(engine: RecordingEngine, path: Path, prompt: list[int],
              config: GenerationConfig) -> tuple[tuple[int, ...], dict[int, np.ndarray]]:
    model = (str(path), engine.target.n_ctx)
    if any(key[:2] != model for key in _plain):
        _plain.clear()
    key = (*model, tuple(prompt), config.max_tokens)
    if key not in _plain:
        _plain[key] = engine.run(prompt, config), engine.rows
    return _plain[key]


def compare(target: Model, path: Path, prompt: list[int], guesser: Callable[[], Guesser], n: int,
            trees: list[tuple[int, int]] | None = None, draft_length: int | None = None,
            runs: list[Stats] | None = None) -> list[Parting]:
    """Every one of n tokens, equal or a near-tie. After a near-tie both runs go on from the speculative
    choice, so that one flip does not end the comparison. Returns the near-ties, for the report;
    `trees` hears, per speculative run, how many steps verified a tree and how many of those kept a
    path other than the first branch's; `runs`, each speculative run's stats."""
    answer: list[int] = []  # agreed so far (through the near-ties, the speculative choice)
    ties: list[Parting] = []
    plain, spec = RecordingEngine(target, NoGuesser()), RecordingEngine(target)
    while len(answer) < n:
        config = GenerationConfig(max_tokens=n - len(answer), draft_length=draft_length)
        spec.guesser = guesser()
        (plain_ids, plain_rows), spec_ids = plain_run(plain, path, prompt + answer, config), spec.run(prompt + answer, config)
        i = next((i for i, (a, b) in enumerate(zip(spec_ids, plain_ids)) if a != b), None)
        rows = (spec.rows[i], plain_rows[i]) if i is not None else None
        # Judged against the prompt alone, so that the fresh model evaluates the whole answer both ways.
        found = parting(path, prompt, answer + list(spec_ids), answer + list(plain_ids), target.n_ctx,
                        target.n_threads, rows)
        if trees is not None:
            trees.append((spec.trees, spec.elsewhere))
        if runs is not None:
            runs.append(spec.stats)
        if found is None:
            break
        assert found.tie, "the engine is wrong: " + found.report()
        ties.append(found)
        answer = list((answer + list(spec_ids))[:found.position + 1])
    return ties
