"""Every way a recurrent or hybrid cache steps back, checked at the logits against a fresh decode.

A Qwen3.5-style hybrid (llama.cpp keeps a few snapshots of its recurrent state, `Memory.ROLLBACK`) and a
Mamba-2 (none: `Memory.CHECKPOINT`, saved states only), written small by tests/tiny_gguf.py. After each
rewind the cache decodes one probe token, and its logits must be those of a fresh model that decoded the
same tokens and nothing else: to the bit where batched and split evaluation of those tokens agree to the
bit on this machine (they do here), else within the largest difference between them, measured apart on
fresh models. Each plant below is a one-line bug that keeps every token list and counter plausible; the
check must catch it.

These models decode in milliseconds; none of this may run beside another process spinning llama.cpp's
threads (it would only be slower).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import plants
import pytest
import tiny_gguf

from specchat.decoding.engine import GenerationConfig, final
from specchat.decoding.events import Prefill
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.model import Model
from specchat.llama.session import Memory, Session
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.loader import load_pair

VOCAB = 40
PROBE = 7
FLAT = CostCurve([0.010 + 0.0002 * n for n in range(32)], draft_s=0.001, mtp_s=0.001)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("rollback")
    return {arch: tiny_gguf.write(arch, out / f"{arch}.gguf", vocab=VOCAB, seed=2) for arch in ("qwen35", "mamba2")}


@pytest.fixture(scope="module")
def models(files) -> Iterator[dict[str, tuple[Model, Model]]]:
    """Per arch, the model under test and a fresh one for the references."""
    loaded = {arch: (Model(path, n_ctx=512, n_threads=1), Model(path, n_ctx=512, n_threads=1))
              for arch, path in files.items()}
    yield loaded
    for pair in loaded.values():
        for m in pair:
            m.close()


def probe(session: Session) -> np.ndarray:
    return np.array(session.decode([PROBE], "last")[0])


def fresh_logits(fresh: Model, *batches: list[int]) -> np.ndarray:
    """The probe's logits on a cache that decoded exactly these batches, from empty."""
    fresh.session.clear()
    for batch in batches:
        if batch:
            fresh.session.decode(batch, "none")
    return probe(fresh.session)


def split_noise(fresh: Model, tokens: list[int], cut: int) -> float:
    """How far the probe's logits move when the same tokens are decoded in other batches: (cut, rest)
    against one batch and against one token at a time. Measured apart from the runs judged."""
    reference = fresh_logits(fresh, tokens[:cut], tokens[cut:])
    return max(float(np.abs(fresh_logits(fresh, tokens) - reference).max()),
               float(np.abs(fresh_logits(fresh, *([t] for t in tokens)) - reference).max()))


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


def judge(model: Model, fresh: Model, seed: int = 0) -> list[str]:
    """Run every case on `model`; what went wrong, one line each (empty: all as a fresh decode)."""
    rng, wrong = np.random.default_rng(seed), []
    for case in cases(model):
        try:
            wrong += judge_one(model, fresh, case, *case.tokens(rng))
        except SpecchatError as e:  # llama.cpp may refuse what a wrong rewind leaves
            wrong.append(f"{case}: {e}")
    model.session.clear()
    return wrong


def judge_one(model: Model, fresh: Model, case: Rewind, a1: list[int], a2: list[int], guess: list[int]) -> list[str]:
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
    noise = split_noise(fresh, a1 + a2 + kept, len(a1) + len(a2))
    diff = float(np.abs(got - fresh_logits(fresh, a1 + a2, kept)).max())
    if session.tokens != a1 + a2 + kept + [PROBE] or diff > noise:
        wrong.append(f"{case}: logits {diff:.3g} from a fresh decode's (batch noise {noise:.3g})")
    return wrong


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_every_rewind_leaves_the_logits_of_a_fresh_decode(models, arch):
    model, fresh = models[arch]
    assert (model.memory, model.rollback_depth >= 4) == \
        ((Memory.ROLLBACK, True) if arch == "qwen35" else (Memory.CHECKPOINT, False))
    assert judge(model, fresh) == []


# --- the plants: each must be caught -----------------------------------------------------------------


@pytest.mark.parametrize("arch, plant", [
    ("qwen35", plants.one_past_the_last_decode),
    ("qwen35", plants.another_checkpoints_state),
    ("mamba2", plants.another_checkpoints_state),
])
def test_a_planted_rewind_bug_is_caught(models, monkeypatch, arch, plant):
    name = "_nearest_saved" if plant is plants.another_checkpoints_state else "_snapshots_hold"
    monkeypatch.setattr(Session, name, plant)
    model, fresh = models[arch]
    assert judge(model, fresh) != [], f"{plant.__name__} passed on {arch}"


# --- a conversation: regenerate and edit-last come back without decoding again -------------------------


def turn(service: ChatService, messages: list[Message]) -> tuple[object, tuple[int, int]]:
    """An answer (greedy, seeded, 16 tokens), and (restores, replayed) done by the time its prompt is in."""
    session = service.pair.target.session
    restores, replayed = session.stats.restores, session.stats.replayed
    events, at_prefill = [], None
    for event in service.chat(messages, GenerationConfig(SamplingConfig(seed=0), max_tokens=16), "auto"):
        if isinstance(event, Prefill):
            at_prefill = (session.stats.restores - restores, session.stats.replayed - replayed)
        events.append(event)
    assert at_prefill is not None
    return final(events), at_prefill


def assert_fresh(session: Session, fresh: Model) -> None:
    """The cache decodes the probe as a fresh model that decoded its tokens does (within the batch noise)."""
    tokens = list(session.tokens)
    noise = split_noise(fresh, tokens, len(tokens) // 2)
    diff = float(np.abs(probe(session) - fresh_logits(fresh, tokens)).max())
    assert diff <= noise, f"logits {diff:.3g} from a fresh decode's (batch noise {noise:.3g})"
    session.rewind(len(tokens))


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_regenerate_and_edit_last_restore_the_prompts_state(files, models, arch):
    fresh = models[arch][1]
    pair = load_pair(ModelChoice(target=files[arch], n_ctx=1024, threads=1))
    pair.costs.assume(FLAT)  # auto guesses, so that rewinds happen inside the answers too
    service = ChatService(pair)
    session = pair.target.session
    try:
        first = [Message("system", "be brief"), Message("user", "tell me of the sea and the tides")]
        one, _ = turn(service, first)
        second = first + [Message("assistant", one.text), Message("user", "say it again, shorter")]
        two, _ = turn(service, second)
        assert_fresh(session, fresh)
        prompt = service.last_prompt
        again, (restores, replayed) = turn(service, second)  # regenerate
        assert service.last_prompt == prompt and again.token_ids == two.token_ids
        assert (restores, replayed) == (1, 0), "regenerate decoded its prompt again"
        assert_fresh(session, fresh)
        edited = second[:-1] + [Message("user", "say it in other words")]
        _, (restores, replayed) = turn(service, edited)
        # Back to the state saved where the second turn began, and only the new message's shared start again.
        shared = next(i for i, (a, b) in enumerate(zip(prompt, service.last_prompt)) if a != b)
        assert (restores, replayed) == (1, shared - two.stats.cached)
        assert_fresh(session, fresh)
    finally:
        service.close()
