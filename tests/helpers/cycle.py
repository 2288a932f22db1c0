"""Drafting shown to work, not only to run: the constructed cycle models of tests/helpers/tiny_gguf.py, and
bugs planted in the MTP head and the draft path, each of which must make acceptance collapse.

A cycle model's next token is its last token's successor round a fixed cycle, and the MTP head of the
qwen35 one answers the token after next only when its two inputs (the pending token and the trunk's
hidden state before it) line up. A head that lines them up wrongly drafts the sink, which the target
never keeps; so greedy acceptance is about 1 with the code as it is and about 0 under each plant.
llama.cpp itself refuses a follower whose cache is one position out (it checks that positions run on).

    python tests/helpers/cycle.py      # prints the table the README quotes
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_gguf  # noqa: E402

from specchat.decoding.engine import Engine, GenerationConfig, final  # noqa: E402
from specchat.decoding.guessers import build, drafting  # noqa: E402
from specchat.decoding.sampling import SamplingConfig  # noqa: E402
from specchat.errors import SpecchatError  # noqa: E402
from specchat.llama import mtp  # noqa: E402
from specchat.service.choices import ModelChoice  # noqa: E402
from specchat.service.loader import load_pair  # noqa: E402
from specchat.service.pair import LoadedPair  # noqa: E402

VOCAB = 16
SHARP = 20.0  # the successor's logit lead: greedy, and sampling at T=1 all but greedy
PROMPT = "etaoin"  # on the cycle, so that the head's very first draft lines up too


def write_pair(out: Path, cycle: float = SHARP, vocab: int = VOCAB,
               spread: float | None = None) -> tuple[Path, Path]:
    """A qwen35 cycle target (with its MTP head) and a llama cycle draft, same tokenizer; with `spread`,
    the other tokens' logits fall along the cycle instead of tying at 0 (tiny_gguf.cycle_logits)."""
    name = f"{vocab}-{cycle:g}" + ("" if spread is None else f"-{spread:g}")
    return (tiny_gguf.write("qwen35", out / f"cycle-qwen35-{name}.gguf", vocab=vocab, cycle=cycle, spread=spread),
            tiny_gguf.write("llama", out / f"cycle-llama-{name}.gguf", vocab=vocab, cycle=cycle, spread=spread))


# --- the plants: each a context manager that patches one line's worth of the real code -------------


def _h_of_the_position_before(self: mtp.MtpHead) -> None:
    """begin() pairs the pending token with h_{p-2} instead of h_{p-1}."""
    _begin(self)
    self._h_next = self._h[self.n - 2]


def _h_stored_one_late(self: mtp.MtpHead, tokens: list[int], pos: int) -> None:
    """decoded() stores the target's hidden states one position later than they belong."""
    n = len(tokens)
    rows = np.ctypeslib.as_array(mtp.ext.llama_get_embeddings_nextn(self.target._ctx.ctx), shape=(n, self.n_embd))
    self._h[pos + 1:pos + n + 1] = rows
    if not self.shared:
        self._decode(tokens, pos, logits=False)
    self.n = pos + n


def _the_token_before(self: drafting.MtpGuesser, context, k, sampling, rng):
    """The head's first step is fed the last committed token but one."""
    return _propose(self, list(context[:-1]) or list(context), k, sampling, rng)


def _one_position_short(self: mtp.MtpHead, n: int) -> None:
    """rewound() keeps one row of the head's cache too many."""
    if not self.shared:
        mtp.llama_cpp.llama_memory_seq_rm(self._memory, 0, n + 1, -1)
    self.n = min(self.n, n)


def _cache_rows_from_h_one_before(self: mtp.MtpHead, tokens, pos: int, logits: bool) -> None:
    """The head's catch-up rows (its cache) pair x_p with h_{p-2} instead of h_{p-1}; its drafting steps,
    which begin() feeds, are untouched, so acceptance does not show it."""
    if logits:
        return _decode(self, tokens, pos, logits)
    kept = self._h.copy()
    self._h[1:] = kept[:-1]
    try:
        _decode(self, tokens, pos, logits)
    finally:
        self._h[:] = kept


def _draft_from_the_token_before(self: drafting.DraftGuesser, context, k, sampling, rng):
    """The draft model is brought to the context less its last token."""
    return _draft_propose(self, list(context[:-1]) or list(context), k, sampling, rng)


_begin, _decode = mtp.MtpHead.begin, mtp.MtpHead._decode
_propose, _draft_propose = drafting.MtpGuesser.propose, drafting.DraftGuesser.propose

PLANTS: dict[str, tuple[str, Callable[[], contextlib.AbstractContextManager]]] = {
    "h of the position before": ("mtp", lambda: mock.patch.object(mtp.MtpHead, "begin", _h_of_the_position_before)),
    "h stored one position late": ("mtp", lambda: mock.patch.object(mtp.MtpHead, "decoded", _h_stored_one_late)),
    "the token before first": ("mtp", lambda: mock.patch.object(drafting.MtpGuesser, "propose", _the_token_before)),
    "a follower one position short": ("mtp", lambda: mock.patch.object(mtp.MtpHead, "rewound", _one_position_short)),
    "draft from the token before": ("draft", lambda: mock.patch.object(drafting.DraftGuesser, "propose",
                                                                        _draft_from_the_token_before)),
}
# A bug acceptance cannot show (the constructed head's attention adds nothing): the head's cache is
# compared with the one a plain decode leaves instead (tests/llama/test_hybrid.py).
CACHE_PLANT = lambda: mock.patch.object(mtp.MtpHead, "_decode", _cache_rows_from_h_one_before)  # noqa: E731


def acceptance(pair: LoadedPair, guesser: str, max_tokens: int = 40) -> tuple[int, int]:
    """(drafted, kept) over one greedy answer to PROMPT, three tokens a guess."""
    target = pair.target
    target.session.clear()
    config = GenerationConfig(SamplingConfig(seed=0), max_tokens=max_tokens, draft_length=3)
    guessing = build(guesser, pair.inputs())
    done = final(Engine(target, guessing).generate(target.tokenize(PROMPT, add_bos=False), config))
    assert len(done.token_ids) == max_tokens
    return done.stats.drafted, done.stats.accepted


@contextlib.contextmanager
def loaded(target: Path, draft: Path) -> Iterator[LoadedPair]:
    pair = load_pair(ModelChoice(target=target, draft=draft, n_ctx=512, threads=1))
    try:
        yield pair
    finally:
        pair.close()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, loaded(*write_pair(Path(tmp))) as pair:
        print(f"{'guesser':8} {'plant':32} {'drafted':>8} {'kept':>6} {'acceptance':>11}")
        rows = [(name, "none", None) for name in ("mtp", "draft")]
        rows += [(guesser, plant, patch) for plant, (guesser, patch) in PLANTS.items()]
        for guesser, plant, patch in rows:
            with patch() if patch else contextlib.nullcontext():
                try:
                    drafted, kept = acceptance(pair, guesser)
                    print(f"{guesser:8} {plant:32} {drafted:8d} {kept:6d} {kept / max(drafted, 1):11.2f}")
                except SpecchatError as e:
                    print(f"{guesser:8} {plant:32} {'':8} {'':6} {'refused':>11}  ({e})")


if __name__ == "__main__":
    main()
