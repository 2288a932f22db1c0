"""The greedy-equivalence check that the real-model tests share: speculative output against plain
decoding, token for token, where a divergence must be a near-tie (`specchat.tools.ties`): each run's
token the top of the logits it chose from (recorded as the run computed them), leading the other by
less than the noise measured on a fresh model, and less than the ceiling; or the check fails. Both
runs prefill the prompt alike, so the noise varies the batching of the answer and the prompt's last
`specchat.tools.ties.TAIL` tokens only (`alike`), in a third to a half of the time batching the whole
prompt every way took; on the default pair that noise is 0.49 to 0.71 logits at every parting of
tests/decoding/test_greedy_qwen.py, whose leads are 0.17 at most (2026-12-05), so the ceiling decides.

More than the tokens: every logits row the speculative run chose from must equal plain decoding's row
for that position within the batch noise measured apart, on a fresh model (`row_noise`): where that
noise is 0 (SmolLM2 and the generated models on this project's CPUs), to the bit. A comparison excuses
no more partings than plain decoding's answer has near-ties (positions whose top two logits lie within
the tie tolerance): none where the noise is 0, and on the default pair, whose rows move by up to 0.6
logits here, the one to five of its 64-token answers. The answer must reach its full length without a
short loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.events import Stats
from specchat.decoding.guessers import Guesser, NoGuesser
from specchat.decoding.sampling import masked
from specchat.llama.model import Model
from specchat.llama.session import is_chain
from specchat.tools.ties import CEILING, Parting, batchings, decode_as, fresh_model, parting

if TYPE_CHECKING:
    from specchat.decoding.constraint import Constraint


class RecordingEngine(Engine):
    """Keeps the target's logits for every generated position, as this run computed them."""

    rows: dict[int, np.ndarray]
    n_prompt: int
    stats: Stats  # the last run's
    trees: int = 0  # steps that verified a tree
    elsewhere: int = 0  # ... and kept a path that is not the first branch's (seq 0's)
    partial: int = 0  # steps that kept some of their guesses, not all

    def _verify(self, pending, tree, sampling, rng, matcher=None):
        first = len(self.target.session.tokens) + 1 - self.n_prompt  # generated position of row 0
        path, token = super()._verify(pending, tree, sampling, rng, matcher)
        logits = self.target.session.last_logits(len(tree.tokens) + 1)
        if matcher is not None:  # what the run chose from: the rows as the grammar masked them (finite, to compare)
            logits = np.where(masked(logits, matcher.masks(tree)) > -np.inf, logits, -1e30)
        for j, row in enumerate([0, *(n + 1 for n in path)]):  # the root's row, then each kept node's
            self.rows[first + j] = np.array(logits[row])
        if not is_chain(tree.parents):  # branches: verified as a tree
            self.trees += 1
            self.elsewhere += bool(path) and path[0] != tree.children(-1)[0]
        self.partial += 0 < len(path) < max((len(tree.path(leaf)) for leaf in range(len(tree.tokens))), default=0)
        return path, token

    def run(self, prompt: list[int], config: GenerationConfig) -> tuple[int, ...]:
        self.n_prompt, self.rows, self.trees, self.elsewhere, self.partial = len(prompt), {}, 0, 0, 0
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
    key = (*model, tuple(prompt), config.max_tokens, id(config.constraint))
    if key not in _plain:
        _plain[key] = engine.run(prompt, config), engine.rows
    return _plain[key]


@dataclass
class Comparison:
    """What one comparison found and exercised, summed over its speculative runs."""

    ties: list[Parting] = field(default_factory=list)  # the near-ties excused (no more than `near_ties`)
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    partial: int = 0  # steps that kept some guesses, not all
    trees: int = 0  # steps that verified a tree
    elsewhere: int = 0  # ... and kept a path other than the first branch's
    rows: int = 0  # logits rows held equal to plain decoding's
    noise: float = 0.0  # the largest batch noise measured apart (the rows' tolerance; 0 where not checked)
    near_ties: int = 0  # positions of plain decoding's answer whose top two logits lie within tie tolerance

    def exercised(self) -> None:
        """Assert the run kept guesses, rejected some, and kept part of a guess at least once."""
        assert self.accepted > 0 and self.rejections > 0 and self.partial > 0, self


@lru_cache(maxsize=8)
def row_noise(path: Path, prompt: tuple[int, ...], answer: tuple[int, ...], n_ctx: int, threads: int | None) -> float:
    """The most any logits row of the answer moves between evaluating its positions one token at a time
    and in every other batching (`specchat.tools.ties.batchings`: all in one, and random batches of 1 to 16 as
    verifications come; both runs prefill the prompt alike, and reuse no cache), on a fresh model: a row
    depends on the batch it is in and on the batches its cache was written in. The tolerance for comparing
    a speculative run's rows with plain decoding's."""
    session = fresh_model(path, n_ctx, threads).session
    tokens = [prompt[-1], *answer[:-1]]

    def rows(sizes: list[int], pad: int = 0) -> np.ndarray:
        session.clear()
        session.decode(list(prompt[:-1]), "none")
        return decode_as(session, tokens, sizes, pad, "all")

    single = rows([1] * len(tokens))
    return max(float(np.abs(rows(sizes, pad) - single).max())
               for sizes, pad in batchings(len(tokens), len(answer), reused=False))


def compare(target: Model, path: Path, prompt: list[int], guesser: Callable[[], Guesser], n: int,
            draft_length: int | None = None, check_rows: bool = True, constraint: Constraint | None = None) -> Comparison:
    """Every one of n tokens, equal or a near-tie, and (`check_rows`) every row the speculative run chose from
    equal to plain decoding's within the batch noise. After a near-tie both runs go on from the
    speculative choice, so that one flip does not end the comparison; no more flips than plain
    decoding's answer has near-ties.

    `check_rows=False` where a fresh measurement cannot bound the noise: the default pair's rows move by 0.5
    to 0.7 logits between batched and single evaluation here, and its speculative runs' rows moved up
    to a tenth more than any of five batch schedules on a fresh model (0.56-0.73 against 0.53-0.68,
    2026-12-03), since each row also carries the rounding of the batches its cache was written in.

    Under a `constraint` both runs follow the grammar, and the rows are as it masked them. A near-tie ends the
    comparison there: the grammar starts at the answer's start, so the runs cannot go on from the speculative
    choice as a new prompt (and n need not be reached)."""
    answer: list[int] = []  # agreed so far (through the near-ties, the speculative choice)
    c = Comparison()
    plain, spec = RecordingEngine(target, NoGuesser()), RecordingEngine(target)
    threads = None if target.fitted else target.n_threads  # fresh models fitted as the target is (same logits)
    while len(answer) < n:
        config = GenerationConfig(max_tokens=n - len(answer), draft_length=draft_length, constraint=constraint)
        spec.guesser = guesser()
        (plain_ids, plain_rows), spec_ids = plain_run(plain, path, prompt + answer, config), spec.run(prompt + answer, config)
        i = next((i for i, (a, b) in enumerate(zip(spec_ids, plain_ids)) if a != b), None)
        rows = (spec.rows[i], plain_rows[i]) if i is not None else None
        # Judged against the prompt alone, so that the fresh model batches the whole answer in every way; only
        # the prompt's last tokens besides, as both runs prefilled it alike (the speculative one reuses plain
        # decoding's cache of it, or both an earlier test's of its head).
        found = parting(path, prompt, answer + list(spec_ids), answer + list(plain_ids), target.n_ctx,
                        threads, rows, alike=True)
        s = spec.stats
        c.drafted, c.accepted, c.rejections = c.drafted + s.drafted, c.accepted + s.accepted, c.rejections + s.rejections
        c.partial, c.trees, c.elsewhere = c.partial + spec.partial, c.trees + spec.trees, c.elsewhere + spec.elsewhere
        tolerance = CEILING  # a lead a parting may have (specchat.tools.ties)
        if check_rows:
            noise = row_noise(path, tuple(prompt + answer), tuple(plain_ids), target.n_ctx, threads)
            c.noise, tolerance = max(c.noise, noise), min(2 * noise, CEILING)
            for j in range(len(spec_ids) if i is None else i):  # the positions whose context both share
                moved = float(np.abs(spec.rows[j] - plain_rows[j]).max())
                assert moved <= noise, (f"the engine is wrong: at token {len(answer) + j} the speculative run's "
                                        f"logits differ from plain decoding's by up to {moved:.3g}, and batches move "
                                        f"them by up to {noise:.3g} on a fresh model")
                c.rows += 1
        c.near_ties += sum(float(np.diff(np.sort(plain_rows[j])[-2:])[0]) <= tolerance
                           for j in range(len(plain_ids) if i is None else i + 1))
        if found is None:
            answer += spec_ids
            break
        assert found.tie, "the engine is wrong: " + found.report()
        assert len(c.ties) < c.near_ties, (f"the engine is wrong: parting {len(c.ties) + 1}, where plain decoding's "
                                           f"answer had {c.near_ties} near-ties so far: " + found.report())
        c.ties.append(found)
        answer = list((answer + list(spec_ids))[:found.position + 1])
        if constraint is not None:
            return c
    if constraint is not None:  # the grammar's end may come before n
        assert len(spec_ids) == len(plain_ids), "the engine is wrong: one run ended where the other went on"
        return c
    assert len(answer) == n and len(set(answer)) >= n // 4, \
        f"a degenerate answer: {len(answer)} tokens, {len(set(answer))} distinct"
    return c
