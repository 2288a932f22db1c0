"""Every way a recurrent or hybrid cache steps back, judged at the logits against a fresh decode: the cases,
the judge and the batch noise it allows, for tests/llama/test_rollback.py. Run on its own, it prints the
figures the README quotes: per model, how far the logits after each rewind were from a fresh decode's, and
the batch noise measured apart.

    python tests/helpers/rollback.py
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_gguf  # noqa: E402

from specchat.errors import SpecchatError  # noqa: E402
from specchat.llama.model import Model  # noqa: E402
from specchat.llama.session import Memory, Session  # noqa: E402
from specchat.tools.ties import batchings  # noqa: E402

VOCAB = 40
PROBE = 7
ARCHS = ("qwen35", "mamba2")  # llama.cpp keeps snapshots of the hybrid's recurrent state; of Mamba-2's, none


def write(arch: str, folder: Path) -> Path:
    """The small model of this architecture the rewinds are judged on."""
    return tiny_gguf.write(arch, folder / f"{arch}.gguf", vocab=VOCAB, seed=2)


def open_twice(path: Path) -> tuple[Model, Model]:
    """The model under test, and a fresh one for the references."""
    return Model(path, n_ctx=512, n_threads=1), Model(path, n_ctx=512, n_threads=1)


def probe(session: Session) -> np.ndarray:
    return np.array(session.decode([PROBE], "last")[0])


def fresh_logits(fresh: Model, *batches: list[int]) -> np.ndarray:
    """The probe's logits on a cache that decoded exactly these batches, from empty."""
    fresh.session.clear()
    for batch in batches:
        if batch:
            fresh.session.decode(batch, "none")
    return probe(fresh.session)


def batch_noise(fresh: Model, *batches: list[int]) -> float:
    """How far the probe's logits move when the tokens of `batches` are decoded in other batches
    (`specchat.tools.ties.batchings`: all in one, one at a time, and random batches of 1 to 16, as prefills
    and verifications come), each against these batches. Measured apart from the runs judged, on a fresh
    model; seeded by the tokens, so that the same tokens are always measured the same way. Not as the head
    of a longer batch taken back: on these memories that is a rewind, which is what is judged."""
    tokens = [t for batch in batches for t in batch]
    reference = fresh_logits(fresh, *batches)

    def cut(sizes: list[int]) -> list[list[int]]:
        ends = np.cumsum(sizes).tolist()
        return [tokens[a:b] for a, b in zip([0, *ends], ends)]

    return max(float(np.abs(fresh_logits(fresh, *cut(sizes)) - reference).max())
               for sizes, _ in batchings(len(tokens), tokens, reused=False))


@dataclass(frozen=True)
class Rewind:
    """Decode a prompt in two parts (each a lasting checkpoint after it, as a prefill leaves them), take the
    step checkpoint a verification of `length` takes, decode `length` guessed tokens in one batch, and
    keep all but `drop` of them."""

    length: int
    drop: int

    def tokens(self, rng: np.random.Generator) -> tuple[list[int], list[int], list[int]]:
        return tuple(rng.integers(3, VOCAB, n).tolist() for n in (12, 8, self.length))  # type: ignore[return-value]


def cases(model: Model) -> list[Rewind]:
    """Each depth from 1 to two past llama.cpp's snapshots, each from a verification one longer (the
    engine's case: the pending token is always kept), from one exactly as long (the whole last decode
    undone), and from a long one (a partial acceptance restored from the step checkpoint)."""
    deepest = max(model.rollback_depth, 1) + 2
    return sorted({Rewind(length, drop) for drop in range(1, deepest + 1) for length in (drop, drop + 1, 8)
                   if drop <= length}, key=lambda r: (r.drop, r.length))


def judge(model: Model, fresh: Model, seed: int = 0, figures: list[tuple[Rewind, float, float]] | None = None
          ) -> list[str]:
    """Run every case on `model`; what went wrong, one line each (empty: all as a fresh decode). `figures`,
    where given, gets each case's (case, difference from the fresh decode, batch noise measured apart)."""
    rng, wrong = np.random.default_rng(seed), []
    for case in cases(model):
        try:
            wrong += judge_one(model, fresh, case, *case.tokens(rng), figures=figures)
        except SpecchatError as e:  # llama.cpp may refuse what a wrong rewind leaves
            wrong.append(f"{case}: {e}")
    model.session.clear()
    return wrong


def judge_one(model: Model, fresh: Model, case: Rewind, a1: list[int], a2: list[int], guess: list[int],
              figures: list[tuple[Rewind, float, float]] | None = None) -> list[str]:
    session, wrong = model.session, []
    session.clear()
    for part in (a1, a2):
        session.decode(part, "none")
        session.checkpoint(lasting=True)
    session.checkpoint(reach=case.length)
    session.decode(guess, "none")
    restores, replayed = session.stats.restores, session.stats.replayed
    session.rewind(len(a1) + len(a2) + case.length - case.drop)
    native = model.memory is Memory.ROLLBACK and case.drop <= min(model.rollback_depth, case.length - 1)
    way = (session.stats.restores - restores, session.stats.replayed - replayed)
    if way != ((0, 0) if native else (1, case.length - case.drop)):
        wrong.append(f"{case}: (restores, replayed) {way}, expected {'none' if native else 'one restore'}")
    kept = guess[:case.length - case.drop]
    got = probe(session)
    noise = batch_noise(fresh, a1 + a2, kept)
    diff = float(np.abs(got - fresh_logits(fresh, a1 + a2, kept)).max())
    if figures is not None:
        figures.append((case, diff, noise))
    if session.tokens != a1 + a2 + kept + [PROBE] or diff > noise:
        wrong.append(f"{case}: logits {diff:.3g} from a fresh decode's (batch noise {noise:.3g})")
    return wrong


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        for arch in ARCHS:
            model, fresh = open_twice(write(arch, Path(out)))
            figures: list[tuple[Rewind, float, float]] = []
            wrong = judge(model, fresh, figures=figures)
            exact = sum(diff == 0 for _, diff, _ in figures)
            print(f"{arch}: {len(figures)} rewinds ({model.memory.name}, {model.rollback_depth} snapshots); "
                  f"{exact} bit-equal to a fresh decode; largest difference {max(d for _, d, _ in figures):.2g}, "
                  f"largest batch noise {max(n for _, _, n in figures):.2g}; "
                  + (f"WRONG: {wrong}" if wrong else "none beyond its noise"))
            model.close()
            fresh.close()


if __name__ == "__main__":
    main()
