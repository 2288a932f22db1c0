"""Speculation on the models laptops run now, on tiny random-weight ones that tests/helpers/tiny_gguf.py
writes: a hybrid Qwen3.5 (gated-delta-net and attention layers, with an MTP head) and a pure
recurrent Mamba-2, whose caches cannot simply drop positions. Rewinds restore saved states (or use
llama.cpp's snapshots); the output must not change for it.

Each model is a few MB and decodes in milliseconds, so these tests run in seconds; none may run while
another process spins llama.cpp's threads on these cores (they would only be slower, not wrong).
"""

from __future__ import annotations

import contextlib
import ctypes
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Callable

import cycle
import llama_cpp
import numpy as np
import plants
import pytest
import tiny_gguf
from commands import REPO
from greedy import compare
from pooled import exact_joint, sample_answers, sampled_against

from specchat.decoding.engine import Engine, GenerationConfig, final
from specchat.decoding.guessers import AutoGuesser, DraftGuesser, Guesser, MtpGuesser, NoGuesser, build
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig
from specchat.errors import SpecchatError
from specchat.llama.model import Model
from specchat.llama.mtp import MtpHead
from specchat.llama.session import Memory, Session
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.loader import load_pair
from specchat.tools.ties import batchings, parting

pytestmark = pytest.mark.real  # the default tokenizer is copied from SmolLM2's GGUF, fetched from the registry
SMALL_VOCAB = 40
# Verifying costs about one step whatever its length, and a drafted token a tenth of one: a GPU's
# shape, on which auto guesses whenever it can, which is what these tests need it to do.
FLAT = CostCurve([0.010 + 0.0002 * n for n in range(32)], draft_s=0.001, mtp_s=0.001)
TEXT = ("The lighthouse keeper climbed the stairs. The lighthouse keeper lit the lamp. "
        "The lighthouse keeper watched the sea, and the sea watched the lighthouse keeper.")


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """One file per architecture and tokenizer, written once for the module."""
    out = tmp_path_factory.mktemp("tiny")
    made = {}
    for arch in ("qwen35", "mamba2", "gemma4", "gemma4-assistant"):
        made[arch] = tiny_gguf.write(arch, out / f"{arch}.gguf")
        made[f"{arch}-small"] = tiny_gguf.write(arch, out / f"{arch}-small.gguf", vocab=SMALL_VOCAB, seed=1)
    return made


def model(path: Path, n_ctx: int = 1024) -> Model:
    return Model(path, n_ctx=n_ctx, n_threads=1)


@pytest.fixture(scope="module")
def targets(files) -> dict[str, Model]:
    """The targets, loaded once: the tests leave each session as they found it or clear it."""
    loaded = {name: model(path) for name, path in files.items() if "assistant" not in name}
    yield loaded
    for m in loaded.values():
        m.close()


def plain_ids(target: Model, prompt: list[int], n: int) -> tuple[int, ...]:
    target.session.clear()
    return final(Engine(target, NoGuesser()).generate(prompt, GenerationConfig(max_tokens=n))).token_ids


# --- the memory kinds, and the rewind itself ------------------------------------------------------------


def test_each_memory_is_known_for_what_it_is(targets, smol):
    assert targets["qwen35"].memory is Memory.ROLLBACK and targets["qwen35"].rollback_depth >= 4
    assert targets["mamba2"].memory is Memory.CHECKPOINT and targets["mamba2"].rollback_depth == 0
    assert smol.memory is Memory.TRIM
    assert targets["qwen35"].n_nextn == 1 and targets["mamba2"].n_nextn == 0


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_a_rewind_brings_back_exactly_the_state_it_left(targets, files, arch):
    """Decode A, B (and more), rewind to the end of B: the logits after the next token are the same,
    to the bit, as a model that decoded only A and B the same way (one batch each)."""
    rng = np.random.default_rng(0)
    a, b, junk = (rng.integers(3, 1000, n).tolist() for n in (24, 6, 9))
    fresh = model(files[arch])
    try:
        fresh.session.decode(a, "none")
        fresh.session.decode(b, "none")
        expected = np.array(fresh.session.decode([7], "last")[0])
    finally:
        fresh.close()
    session = targets[arch].session
    session.clear()
    session.decode(a, "none")
    session.checkpoint(lasting=True)
    session.decode(b, "none")
    session.decode(junk, "none")
    session.decode(junk[:1], "none")  # beyond any snapshot: only the saved state brings A + B back
    before = session.stats.restores
    session.rewind(len(a) + len(b))
    assert session.tokens == a + b and session.stats.restores == before + 1
    assert np.array_equal(np.array(session.decode([7], "last")[0]), expected)
    session.clear()


# --- the output does not change -------------------------------------------------------------------------


OTHER = {"qwen35": "mamba2", "mamba2": "qwen35", "qwen35-small": "mamba2-small", "mamba2-small": "qwen35-small"}


def test_a_gemma4_assistant_given_as_the_draft_becomes_the_targets_mtp_head(files):
    """Gemma 4's drafter reads the target's own cache (one memory for both); greedy output is unchanged."""
    pair = load_pair(ModelChoice(target=files["gemma4"], draft=files["gemma4-assistant"], n_ctx=1024, threads=1))
    try:
        assert pair.draft is None and pair.mtp is not None and pair.mtp.shared and pair.warnings == []
        target = pair.target
        assert target.n_swa > 0 and target.memory is Memory.TRIM
        prompt = target.tokenize(TEXT * 2, add_bos=True)
        for name in ("mtp", "lookup"):
            greedy_as_plain(target, files["gemma4"], prompt, lambda: build(name, pair.inputs()), draft_length=3)
    finally:
        pair.close()


@pytest.mark.parametrize("drafting", ["itself", "the other model"])
@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_greedy_speculative_output_equals_plain_decoding(files, arch, drafting):
    """Lookup, a draft model (the model itself, which agrees on everything, or the other architecture,
    same tokenizer, which does not), the MTP head where the model has one, and auto on a curve that
    makes it guess: token for token what plain decoding gives."""
    draft = files[arch] if drafting == "itself" else files[OTHER[arch]]
    pair = load_pair(ModelChoice(target=files[arch], draft=draft, n_ctx=1024, threads=1))
    try:
        target = pair.target
        prompt = target.tokenize(TEXT * 2, add_bos=True)
        names = ["lookup", "draft"] + (["mtp"] if pair.mtp is not None else [])
        for name in names:
            greedy_as_plain(target, files[arch], prompt, lambda: build(name, pair.inputs()), draft_length=3)
        greedy_as_plain(target, files[arch], prompt, lambda: AutoGuesser(
            FLAT.copy(), {"draft": DraftGuesser(pair.draft), **({"mtp": MtpGuesser(pair.mtp)} if pair.mtp is not None else {})},
            piece=target.piece))
    finally:
        pair.close()


def greedy_as_plain(target: Model, path: Path, prompt: list[int], guesser: Callable[[], Guesser],
                    draft_length: int | None = None) -> None:
    """48 tokens as plain decoding gives them, each equal or a near-tie (tests/helpers/greedy.py), and some of them
    guessed. A random-weight model's logits lie close together, and batched and single-token evaluation
    of a layer round differently on some CPUs (gated delta nets on the CI machine): such a flip is
    excused only under the noise measured on a fresh model and the fixed ceiling."""
    found = compare(target, path, prompt, guesser, 48, draft_length=draft_length)
    for tie in found.ties:
        warnings.warn(f"{path.stem}: {tie.report()}")
    assert found.drafted > 0, f"nothing was guessed on {path.stem}"


def test_the_greedy_check_catches_a_restore_from_another_checkpoints_state(targets, files, monkeypatch):
    """Six-token drafts from the other architecture (rejected early, 65 restores in 48 tokens) reach past
    the hybrid's four snapshots, so rejections restore the step checkpoint; planted in the target's
    session, a restore loads the oldest saved state under the nearest one's position."""
    target, nearest = targets["qwen35"], Session._nearest_saved
    monkeypatch.setattr(Session, "_nearest_saved", lambda self, n: plants.another_checkpoints_state(self, n)
                        if self is target.session else nearest(self, n))
    target.session.clear()
    with pytest.raises(AssertionError, match="the engine is wrong"):
        compare(target, files["qwen35"], target.tokenize(TEXT * 2, add_bos=True),
                lambda: DraftGuesser(targets["mamba2"]), 48, draft_length=6)
    target.session.clear()


# --- sampling at T=1 is exactly the target's ------------------------------------------------------------


@pytest.mark.parametrize("arch", ["qwen35-small", "mamba2-small", "gemma4-small"])
def test_sampled_first_tokens_follow_the_targets_distribution(files, arch):
    """The first two tokens of 2,000 answers at T=1, per guesser, against the exact joint distribution:
    lookup (a point-mass proposal), the model drafting for itself and the MTP head (sampled from q).
    Each guesser has to have taken the rejection branch often, or the test shows nothing."""
    # The draft is the other architecture, with the same tokenizer: its q differs from p, as a draft's does.
    # Gemma 4's is its assistant: the MTP head, and no draft model.
    draft = files["gemma4-assistant-small"] if arch == "gemma4-small" else files[OTHER[arch]]
    pair = load_pair(ModelChoice(target=files[arch], draft=draft, n_ctx=256, threads=1))
    try:
        target = pair.target
        # A repeated phrase, so that lookup proposes on the first step.
        prompt = [1] + target.tokenize("the sea and the sea and the sea and the", add_bos=False)
        joint = exact_joint(files[arch], prompt, 2)
        names = ["lookup"] + (["draft"] if pair.draft is not None else []) + (["mtp"] if pair.mtp is not None else [])
        for name in names:
            got = sample_answers(target, build(name, pair.inputs()), prompt, 2000, SamplingConfig(1.0),
                                 max_tokens=2, draft_length=2)
            assert got.rejected > 200, f"{name}: the residual was seldom sampled ({got.rejected})"
            assert sampled_against(joint, got.answers) > 1e-3, f"{name} on {arch}"
    finally:
        pair.close()


# --- the MTP head drafts what the target keeps, on a model constructed so that it must -------------------


@pytest.fixture(scope="module")
def cycle_pair(tmp_path_factory):
    with cycle.loaded(*cycle.write_pair(tmp_path_factory.mktemp("cycle"))) as pair:
        yield pair


def test_a_head_that_agrees_with_its_trunk_is_kept_and_each_planted_misalignment_collapses_it(cycle_pair):
    """The constructed cycle model (tests/helpers/cycle.py): greedy, the MTP head's drafts and the draft model's
    are all kept on a hybrid target; the head fed the wrong position's hidden state, or the wrong token,
    or the draft fed the wrong context keeps none, and llama.cpp refuses a follower one position out."""
    for guesser in ("mtp", "draft"):
        drafted, kept = cycle.acceptance(cycle_pair, guesser)
        assert drafted >= 27 and kept == drafted, (guesser, drafted, kept)
    for plant, (guesser, patch) in cycle.PLANTS.items():
        with patch():
            try:
                drafted, kept = cycle.acceptance(cycle_pair, guesser)
            except SpecchatError as e:
                assert "MTP head" in str(e), plant
                continue
        assert drafted > 50 and kept <= 0.05 * drafted, (plant, drafted, kept)


def head_cache(pair) -> bytes:
    """The MTP head's own attention cache, as llama.cpp saves it."""
    ctx = pair.mtp._ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buffer = (ctypes.c_uint8 * size)()
    return bytes(buffer[:llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0)])


def cache_gap(a: bytes, b: bytes) -> float:
    """How far two saved head caches are apart: the largest difference of their 16-bit floats (the cache
    is f16; the header's fields are 4 and 8 bytes wide, so the data stays aligned), inf where they differ
    in size."""
    if len(a) != len(b):
        return float("inf")
    x, y = (np.frombuffer(v[:len(v) // 2 * 2], dtype=np.float16).astype(np.float64) for v in (a, b))
    return float(np.nan_to_num(np.abs(x - y), nan=np.inf).max(initial=0.0))


def test_the_heads_cache_after_rejections_is_what_a_plain_decode_leaves(tmp_path):
    """The constructed head's attention adds nothing, so no drafting check sees its cache: it is compared
    directly. After a sampled MTP run with rejections (every rewind of the target rewinds the head), the
    head's cache holds what a plain decode of the same tokens, one at a time, leaves in it, up to the
    noise of batching measured apart over the ways prefills and verifications cut tokens (on the CPUs
    tried so far none: the bytes are equal, and then nothing less than equality is excused). Planted:
    catch-up rows paired with the hidden state one position too early. The run then drafts and keeps the
    same tokens, and only this comparison sees it."""
    target, draft = cycle.write_pair(tmp_path, cycle=SOFT, vocab=8)
    with cycle.loaded(target, draft) as pair:
        session = pair.target.session

        def run(plant: bool) -> tuple[tuple[int, int, int], list[int], bytes]:
            session.clear()
            config = GenerationConfig(SamplingConfig(1.0, seed=3), max_tokens=40, draft_length=3)
            with cycle.CACHE_PLANT() if plant else contextlib.nullcontext():
                done = final(Engine(pair.target, build("mtp", pair.inputs())).generate(
                    pair.target.tokenize(" et\n et", add_bos=False), config))
            return (done.stats.drafted, done.stats.accepted, done.stats.rejections), list(session.tokens), \
                head_cache(pair)

        def plain(tokens: list[int], sizes: list[int]) -> bytes:
            session.clear()
            start = 0
            for size in sizes:
                session.decode(tokens[start:start + size], "last")
                start += size
            return head_cache(pair)

        stats, tokens, speculated = run(plant=False)
        assert stats[2] >= 5 and stats[1] >= 10, stats
        reference = plain(tokens, [1] * len(tokens))
        noise = max(cache_gap(plain(tokens, sizes), reference)
                    for sizes, _ in batchings(len(tokens), seed=len(tokens), reused=False))
        assert cache_gap(speculated, reference) <= noise
        planted_stats, planted_tokens, planted = run(plant=True)
        assert (planted_stats, planted_tokens) == (stats, tokens)
        assert cache_gap(planted, reference) > noise, (cache_gap(planted, reference), noise)


SOFT = 3.0  # the successor's logit lead in the sampled test: p(successor) about 0.7 of 8 tokens


@pytest.mark.parametrize("plant", [None, "residual from p"])
def test_mtp_drafts_of_two_tokens_leave_the_first_three_tokens_exactly_the_targets(tmp_path, monkeypatch, plant):
    """At T=1 with two drafted tokens a step, the first three tokens of 3,000 answers (the bonus token among
    them whenever both guesses hold) against the target's joint from fresh decodes, on a soft cycle model
    whose head is confident where the target is not. The control draws each correction from p instead of
    the residual max(p - q, 0): the same test then rejects."""
    import specchat.decoding.verify as verify_module

    if plant:
        monkeypatch.setattr(verify_module, "_residual", lambda p, q, x: p)
    target, draft = cycle.write_pair(tmp_path, cycle=SOFT, vocab=8)
    with cycle.loaded(target, draft) as pair:
        prompt = pair.target.tokenize(" et\n et", add_bos=False)
        joint = exact_joint(target, prompt, 3)
        got = sample_answers(pair.target, build("mtp", pair.inputs()), prompt, 3000, SamplingConfig(1.0),
                             max_tokens=3, draft_length=2)
    assert got.rejected > 500 and got.bonus > 500, (got.rejected, got.bonus)
    p = sampled_against(joint, got.answers)
    if plant:
        assert p < 1e-6, f"the planted residual-from-p passed (p = {p:.2g})"
    else:
        assert p > 1e-3, p


# --- conversations: a second turn, regenerate, an edit of the last message -----------------------------


def answer(service: ChatService, messages: list[Message], guesser: str = "auto"):
    # Greedy, with a seed: the steps then leave the assumed curve as it is (a seeded answer must repeat).
    return final(service.chat(messages, GenerationConfig(SamplingConfig(seed=0), max_tokens=24), guesser))


def fresh_answer(path: Path, prompt: list[int]) -> tuple[int, ...]:
    """What a new process gives for the same prompt tokens: the model loaded anew, nothing cached,
    plain decoding. (The tokens, not the text: a conversation that goes on keeps its answers' tokens
    as they were generated, which a tokenizer reading the text anew may split otherwise.)"""
    fresh = Model(path, n_ctx=1024, n_threads=1)
    try:
        return plain_ids(fresh, prompt, 24)
    finally:
        fresh.close()


def same_answer(path: Path, prompt: list[int], ours: tuple[int, ...], theirs: tuple[int, ...] | None = None) -> None:
    """`ours` is `theirs` (default: a fresh process's answer), or parts from it at a near-tie judged on a
    fresh model (`specchat.tools.ties`, as `greedy_as_plain` excuses one)."""
    found = parting(path, prompt, ours, fresh_answer(path, prompt) if theirs is None else theirs, 1024, 1)
    if found is not None:
        assert found.tie, found.report()
        warnings.warn(f"{path.stem}: {found.report()}")


@pytest.mark.parametrize("arch", ["qwen35", "mamba2"])
def test_a_second_turn_regenerate_and_edit_give_what_a_fresh_process_gives(files, arch):
    """Through the conversation service, as the app and `serve` use it, with auto guessing (a flat curve):
    the second turn reuses the cache, regenerate and an edit of the last message (each a branch in the app)
    come back to saved states, and each answer equals a fresh model's plain one."""
    pair = load_pair(ModelChoice(target=files[arch], n_ctx=1024, threads=1))
    pair.costs.assume(FLAT)  # this machine's curve would have auto guess seldom
    service = ChatService(pair)
    try:
        first = [Message("system", "Be brief."), Message("user", TEXT)]
        one = answer(service, first)
        assert one.stats.drafted > 0
        same_answer(files[arch], service.last_prompt, one.token_ids)
        second = first + [Message("assistant", one.text), Message("user", "Say that again, shorter.")]
        two = answer(service, second)
        assert two.stats.cached >= one.stats.n_prompt + len(one.token_ids) - 1  # the first turn's cache, reused
        same_answer(files[arch], service.last_prompt, two.token_ids)
        prompt = service.last_prompt
        again = answer(service, second)  # regenerate: the same history (its counters: tests/llama/test_rollback.py)
        assert service.last_prompt == prompt
        same_answer(files[arch], prompt, again.token_ids, two.token_ids)
        edited = second[:-1] + [Message("user", "Say it once more, in other words.")]
        three = answer(service, edited)
        same_answer(files[arch], service.last_prompt, three.token_ids)
    finally:
        service.close()


# --- bad cases: one line, and the target runs with what still works -------------------------------------


def test_a_state_that_can_be_neither_cut_nor_saved_decodes_plainly_and_says_so(files, monkeypatch):
    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_state_seq_get_data_ext", lambda *args: 0)
    pair = load_pair(ModelChoice(target=files["mamba2"], n_ctx=512, threads=1))
    try:
        warning, = pair.warnings
        assert "can neither cut nor save" in warning and "decodes plainly" in warning and "\n" not in warning
        assert ChatService(pair).guessers == ["auto", "none"]
        with pytest.raises(SpecchatError, match="the lookup guesser cannot run: .*can neither cut nor save"):
            build("lookup", pair.inputs())
        done = final(ChatService(pair).chat([Message("user", "Hello")], GenerationConfig(max_tokens=8), "auto"))
        assert done.stats.n_tokens > 0 and done.stats.drafted == 0
    finally:
        pair.close()


def test_an_assistant_made_for_another_target_is_left_out_in_one_line(files):
    pair = load_pair(ModelChoice(target=files["qwen35"], draft=files["gemma4-assistant"], n_ctx=512, threads=1))
    try:
        warning = next(w for w in pair.warnings if "gemma4-assistant" in w)
        assert warning == (f"no MTP drafting: {files['gemma4-assistant'].name} was not made for qwen35.gguf: it drafts "
                           "for gemma4 models and the target is qwen35; the target runs with its other guessers")
        assert pair.draft is None and "lookup" in ChatService(pair).guessers
        assert pair.mtp is not None and not pair.mtp.shared  # its own MTP layers draft instead
    finally:
        pair.close()


def test_an_mtp_head_that_cannot_be_made_leaves_the_target_running(files, monkeypatch):
    import llama_cpp

    real = llama_cpp.llama_init_from_model
    monkeypatch.setattr(llama_cpp, "llama_init_from_model",
                        lambda model, params: None if params.ctx_type == llama_cpp.LLAMA_CONTEXT_TYPE_MTP
                        else real(model, params))
    pair = load_pair(ModelChoice(target=files["qwen35"], n_ctx=512, threads=1))
    try:
        warning, = pair.warnings
        assert warning.startswith("no MTP drafting: llama.cpp could not make an MTP context") and "\n" not in warning
        assert pair.mtp is None and "mtp" not in ChatService(pair).guessers
        assert "lookup" in ChatService(pair).guessers
        with pytest.raises(SpecchatError, match="the mtp guesser cannot run: no MTP drafting"):
            build("mtp", pair.inputs())
    finally:
        pair.close()


def test_a_target_without_mtp_layers_has_no_head_and_says_so_in_one_line(targets):
    with pytest.raises(SpecchatError) as error:
        MtpHead(targets["mamba2"])
    assert str(error.value) == "the MTP layers of mamba2.gguf: no MTP (NextN) layers to draft with"
    assert targets["mamba2"].session.followers == []


def test_an_assistant_without_mtp_layers_is_refused_in_one_line_and_its_weights_freed(files, monkeypatch):
    """Gemma 4's own file given as its assistant: its shapes agree, but it has no MTP layers. Refused, and the
    weights loaded to find that out are closed, not left to the garbage collector."""
    target = model(files["gemma4"], n_ctx=256)
    closed: list[object] = []
    close = llama_cpp._internals.LlamaModel.close
    monkeypatch.setattr(llama_cpp._internals.LlamaModel, "close", lambda self: (closed.append(self), close(self))[1])
    try:
        with pytest.raises(SpecchatError) as error:
            MtpHead(target, files["gemma4"])
        assert str(error.value) == "gemma4.gguf: no MTP (NextN) layers to draft with"
        assert len(closed) == 1 and target.session.followers == []
    finally:
        target.close()


def test_an_assistant_of_another_hidden_size_is_refused_in_one_line(files, monkeypatch):
    """The shapes the metadata gives agree, the hidden state llama.cpp hands over does not: refused before a
    context is made, the target left as it was."""
    target = model(files["gemma4"], n_ctx=256)
    try:
        ours = ctypes.cast(target._model.model, ctypes.c_void_p).value
        real = llama_cpp.llama_model_n_embd_out
        monkeypatch.setattr(llama_cpp, "llama_model_n_embd_out",
                            lambda m: real(m) + (ctypes.cast(m, ctypes.c_void_p).value != ours))
        with pytest.raises(SpecchatError) as error:
            MtpHead(target, files["gemma4-assistant"])
        assert str(error.value) == ("gemma4-assistant.gguf was not made for gemma4.gguf: its hidden size or "
                                    "vocabulary differs")
        assert target.session.followers == []
    finally:
        target.close()


def test_a_context_llama_cpp_cannot_make_is_one_line_and_frees_the_weights(files, monkeypatch):
    def refuse(**_: object) -> None:
        raise ValueError("Failed to create llama_context")

    closed: list[object] = []
    close = llama_cpp._internals.LlamaModel.close
    monkeypatch.setattr(llama_cpp._internals.LlamaModel, "close", lambda self: (closed.append(self), close(self))[1])
    monkeypatch.setattr(llama_cpp._internals, "LlamaContext", refuse)
    with pytest.raises(SpecchatError) as error:
        model(files["qwen35"], n_ctx=1024)
    assert str(error.value) == (f"llama.cpp could not create a 1024-token context for {files['qwen35']} "
                                "(out of memory? try a smaller --ctx)")
    assert len(closed) == 1  # the weights loaded before it were freed, not left to the garbage collector


# --- the command line on a generated file ---------------------------------------------------------------


def specchat(*args: str, **env: str) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "specchat.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=300)


def test_the_generator_writes_what_generate_accepts(tmp_path):
    """`python tests/helpers/tiny_gguf.py ARCH OUT.gguf`, then `specchat generate` on it with the default guesser."""
    for arch in ("qwen35", "mamba2"):
        out = tmp_path / f"{arch}.gguf"
        subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "tiny_gguf.py"), arch, str(out)], check=True,
                       timeout=120)
        result = specchat("generate", "Tell me about the sea.", "--target", str(out), "--max-tokens", "12",
                          XDG_CACHE_HOME=str(tmp_path / "cache"))
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() and result.stderr.strip().splitlines()[-1].startswith("[auto] 12 tokens")


def test_drafts_lists_a_targets_own_mtp_layers_first(files):
    result = specchat("drafts", str(files["qwen35"]))
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[1]
    assert "its own MTP layers (1; the mtp guesser)" in first and first.rstrip().endswith("compatible")
    assert "own MTP" not in specchat("drafts", str(files["mamba2"])).stdout


def test_costs_shows_what_a_rollback_costs(files, tmp_path):
    for arch, memory in (("qwen35", "rollback"), ("mamba2", "checkpoint")):
        result = specchat("costs", "--target", str(files[arch]), XDG_CACHE_HOME=str(tmp_path))
        assert result.returncode == 0, result.stderr
        line = next(line for line in result.stdout.splitlines() if line.startswith("rollback"))
        assert line.startswith(f"rollback ({memory}): saving the state ") and "restoring it" in line
    assert "MTP layers:" in specchat("costs", "--target", str(files["qwen35"]), XDG_CACHE_HOME=str(tmp_path)).stdout


def test_an_assistant_file_on_its_own_is_one_clear_line(files):
    with pytest.raises(SpecchatError) as error:
        Model(files["gemma4-assistant"], n_ctx=256)
    assert str(error.value) == ("gemma4-assistant.gguf is a gemma4-assistant file: the MTP layers of another model, "
                                "not a model of its own; give it as --draft to the model it was made for")
