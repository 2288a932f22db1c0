"""The engine on a real model (SmolLM2 135M): exactness, rewind, prefix reuse, limits."""

from __future__ import annotations

import ctypes
import re
import threading

import numpy as np
import pytest
from commands import with_costs
from scipy.stats import chisquare
from tempered import Tempered

from specchat.decoding.engine import Engine, GenerationConfig
from specchat.decoding.events import Done, Prefill, Source, Step
from specchat.decoding.guessers import AutoGuesser, DraftGuesser, LookupGuesser
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig, logits_to_probs
from specchat.errors import ContextFull, SpecchatError
from specchat.llama.model import Model
from specchat.llama.template import ChatPrompter, Message

pytestmark = pytest.mark.real


def run(engine: Engine, prompt: list[int], config: GenerationConfig, cancel=None) -> Done:
    events = list(engine.generate(prompt, config, cancel))
    assert isinstance(events[0], Prefill) and isinstance(events[-1], Done)
    return events[-1]


def chat_prompt(model: Model, text: str) -> list[int]:
    return ChatPrompter(model).tokens([Message("user", text)])


def test_self_draft_accepts_everything_at_temperature_zero(smol, smol_draft):
    prompt = chat_prompt(smol, "List three colours of the rainbow.")
    config = GenerationConfig(SamplingConfig(), max_tokens=40, draft_length=4)
    plain = run(Engine(smol), prompt, config)
    spec = run(Engine(smol, DraftGuesser(smol_draft)), prompt, config)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.drafted > 0
    assert spec.stats.accepted == spec.stats.drafted
    assert spec.stats.steps < plain.stats.steps


def _exact_distribution(model: Model, prompt: list[int], sampling: SamplingConfig, depth: int = 3) -> dict:
    """P(t1, ..., t_depth) under the target alone, enumerated from its logits (an answer that ends with
    an end-of-generation token ends its key there)."""
    session = model.session
    joint: dict[tuple[int, ...], float] = {}

    def walk(context: list[int], key: tuple[int, ...], p: float) -> None:
        session.prefill(context)  # what the cache holds of it is reused
        probs = logits_to_probs(np.array(session.decode(context[-1:], "last")[0]), sampling)
        for t in np.flatnonzero(probs):
            if len(key) + 1 == depth or model.is_eog(int(t)):
                joint[key + (int(t),)] = p * probs[t]
            else:
                walk(context + [int(t)], key + (int(t),), p * probs[t])

    session.clear()
    walk(list(prompt), (), 1.0)
    session.clear()
    return joint


def flat_curve() -> CostCurve:
    """A GPU-like cost curve, so that the auto guesser guesses (and drafts) freely."""
    return CostCurve([0.010 + 0.0002 * n for n in range(16)], draft_s=0.001)


def make(guesser: str, draft: Model):
    # Sharper than the target (its logits doubled): the correction after a rejection then must come from
    # the residual, away from the draft's favourite, and drawing it from p instead moves the joint far
    # enough to be seen in 500 answers (a planted residual-from-p gave a chi-square of 125, p = 2e-21;
    # in 1,000, 262, p = 2e-48; with a flatter draft, logits / 1.8, it passed).
    tempered = DraftGuesser(Tempered(draft, 0.5))
    return tempered if guesser == "tempered draft" else AutoGuesser(flat_curve(), {"draft": tempered})


# Lookup at T=1 is shown exactly on scripted models (tests/decoding/test_exact.py) and here inside auto's steps.
@pytest.mark.parametrize("guesser", ["tempered draft", "auto"])
def test_first_three_tokens_follow_the_targets_distribution(smol, smol_draft, guesser):
    """At T=1 (top-k 3, so the joint of three tokens has 27 cells to enumerate), with up to 4 guesses a
    step, so that chains of drafted tokens are judged: the first three tokens of 500 answers against
    the target's exact distribution. The rejection branch has to be taken often, or nothing is shown.
    500 answers see an error of about 0.15 (total variation; `pooled.detectable`), a trained model's
    gross one; tests/decoding/test_exact_powered.py has the count that sees 0.03, on generated models."""
    # Repetitive text, so that prompt lookup proposes continuations the target often but not
    # always accepts: both the acceptance and the residual path are exercised.
    prompt = smol.tokenize("one two three four five, one two three four five, one two three", add_bos=False)
    sampling = SamplingConfig(temperature=1.0, top_k=3)
    exact = _exact_distribution(smol, prompt, sampling)
    engine = Engine(smol, make(guesser, smol_draft))
    n, counts, accepted, rejections = 500, {}, 0, 0
    for seed in range(n):
        done = run(engine, prompt, GenerationConfig(SamplingConfig(1.0, top_k=3, seed=seed), max_tokens=5,
                                                    draft_length=4))
        key = done.token_ids[:3]
        counts[key] = counts.get(key, 0) + 1
        accepted += done.stats.accepted
        rejections += done.stats.rejections
    assert accepted > n / 4 and rejections > n / 10, (accepted, rejections)
    assert set(counts) <= set(exact)
    # Chi-square over keys with enough expected mass; the rest pooled in one bin.
    big = [k for k, p in exact.items() if p * n >= 5]
    observed = [counts.get(k, 0) for k in big] + [n - sum(counts.get(k, 0) for k in big)]
    expected = [exact[k] * n for k in big] + [n * (1 - sum(exact[k] for k in big))]
    if expected[-1] < 5:
        observed[-2] += observed.pop()
        expected[-2] += expected.pop()
    result = chisquare(observed, expected)
    assert result.pvalue > 0.001, result


def test_cancel_leaves_caches_consistent(smol, smol_draft):
    prompt = chat_prompt(smol, "Write a short poem about the sea.")
    config = GenerationConfig(SamplingConfig(), max_tokens=48, draft_length=3)
    reference = run(Engine(smol), prompt, config)
    engine = Engine(smol, DraftGuesser(smol_draft))
    cancel = threading.Event()
    steps = 0
    for event in engine.generate(prompt, config, cancel):
        if isinstance(event, Step):
            steps += 1
            if steps == 3:
                cancel.set()
        if isinstance(event, Done):
            assert event.reason == "cancelled"
    # A generator abandoned mid-stream must be harmless too.
    stream = engine.generate(chat_prompt(smol, "Something else entirely."), config)
    next(stream), next(stream)
    stream.close()
    again = run(engine, prompt, config)
    assert again.token_ids == reference.token_ids


def test_follow_up_turn_reuses_the_whole_history(smol):
    prompter, engine = ChatPrompter(smol), Engine(smol)
    config = GenerationConfig(SamplingConfig(), max_tokens=30)
    history = [Message("user", "Name a fruit.")]
    first = prompter.tokens(history)
    done = run(engine, first, config)
    prompter.remember(done.token_ids)
    history += [Message("assistant", done.text), Message("user", "And a vegetable?")]
    second = prompter.tokens(history)
    prefill = next(iter(engine.generate(second, config)))
    assert prefill.cached == len(first) + len(done.token_ids) - 1
    assert second[:prefill.cached] == (first + list(done.token_ids))[:prefill.cached]


def test_provenance_and_counts_add_up(smol):
    prompt = smol.tokenize("a b c d e f a b c d e f a b c", add_bos=False)
    done_events = list(Engine(smol, LookupGuesser()).generate(prompt, GenerationConfig(max_tokens=20)))
    steps = [e for e in done_events if isinstance(e, Step)]
    done = done_events[-1]
    assert sum(len(s.tokens) for s in steps) == done.stats.n_tokens
    assert sum(s.accepted for s in steps) == done.stats.accepted
    assert {t.source for s in steps for t in s.tokens} & {Source.DRAFT, Source.BONUS}
    for s in steps:
        assert [t.source for t in s.tokens[:s.accepted]] == [Source.DRAFT] * s.accepted
        assert s.span_s >= s.draft_s + s.verify_s  # a step's span holds its guess and its check
    # The spans tile the decoding: together they are the wall time tok/s as shown divides by, but for what
    # follows the last step (releasing held-back text).
    assert done.stats.decode_s <= sum(s.span_s for s in steps) <= done.stats.wall_s


def test_stop_string_ends_generation_and_is_not_shown(smol):
    prompt = smol.tokenize("1, 2, 3, 4, 5, 6,", add_bos=False)
    done = run(Engine(smol), prompt, GenerationConfig(max_tokens=40, stop=(" 9",)))
    assert done.reason == "stop"
    assert " 9" not in done.text and done.text.strip().startswith("7")


def test_stop_string_and_end_token_inside_one_accepted_run_end_as_plain_decoding(smol, smol_draft):
    """Self-drafting at temperature 0 accepts whole runs of 8: the stop string and the end-of-generation
    token both land inside one run, and the answer must still end where one token at a time ends it."""
    prompt = chat_prompt(smol, "Name two primary colours, in one short sentence.")
    free = run(Engine(smol), prompt, GenerationConfig(max_tokens=60))
    assert free.reason == "eog" and len(free.token_ids) > 6, free
    pieces = [smol.piece(t).decode("utf-8", "replace") for t in free.token_ids[:-1]]
    # A stop string completed three tokens before the end token, and one completed by the last token.
    for stop in (pieces[-4].strip() or pieces[-4], pieces[-1]):
        config = GenerationConfig(max_tokens=60, draft_length=8, stop=(stop,))
        plain = run(Engine(smol), prompt, config)
        spec = run(Engine(smol, DraftGuesser(smol_draft)), prompt, config)
        assert spec.stats.accepted == spec.stats.drafted > 0  # the runs really were accepted whole
        assert (spec.reason, spec.text, spec.token_ids, spec.stats.n_tokens) == \
            (plain.reason, plain.text, plain.token_ids, plain.stats.n_tokens)
        assert plain.reason == "stop" and stop not in plain.text
    # And the end token inside a run, with no stop string: the same as plain decoding too.
    spec = run(Engine(smol, DraftGuesser(smol_draft)), prompt, GenerationConfig(max_tokens=60, draft_length=8))
    assert (spec.reason, spec.text, spec.token_ids, spec.stats.n_tokens) == \
        (free.reason, free.text, free.token_ids, free.stats.n_tokens)


def test_prompt_longer_than_context_is_a_clear_error(smol_path):
    model = Model(smol_path, n_ctx=256)
    with pytest.raises(ContextFull, match=f"context holds {model.n_ctx}"):
        next(Engine(model).generate(list(range(1, 400)), GenerationConfig()))
    done = run(Engine(model), model.tokenize("Count: 1, 2, 3,"), GenerationConfig(max_tokens=400))
    assert done.reason in ("context_full", "eog")
    model.close()


def _pair(smol_path) -> tuple[str, ...]:  # the pair _backend loads, as the command line names it
    return "--target", str(smol_path), "--draft", str(smol_path)


def _backend(smol_path, n_ctx: int):
    from specchat.service.choices import ModelChoice
    from specchat.service.local import LocalBackend

    backend = LocalBackend(ModelChoice(target=smol_path, draft=smol_path, n_ctx=n_ctx))
    backend.load(lambda what, done, total: None)
    return backend


def test_overflowing_conversation_drops_the_oldest_turns_and_says_so(smol_path, tmp_path, monkeypatch):
    from specchat.service.events import Notice

    monkeypatch.setenv("XDG_CACHE_HOME", str(with_costs(tmp_path, *_pair(smol_path))))
    backend = _backend(smol_path, n_ctx=512)
    long_turn = "Tell me about the sea. " * 20  # about 120 tokens a turn
    history = [Message("system", "Be brief.")]
    for n in range(6):
        history += [Message("user", f"{n}: {long_turn}"), Message("assistant", f"Answer {n}: {long_turn}")]
    history.append(Message("user", "And now, the last question: what colour is the sea?"))
    events = list(backend.chat(history, GenerationConfig(max_tokens=32), "none", threading.Event()))
    notices = [e for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and "oldest" in notices[0].text and "512-token context" in notices[0].text
    done = events[-1]
    assert isinstance(done, Done) and done.reason in ("eog", "max_tokens") and done.stats.n_tokens > 0
    # What was kept: the system prompt and the newest messages, with room left for the answer.
    dropped = int(re.search(r"oldest (\d+) message", notices[0].text)[1])
    kept = history[:1] + history[1 + dropped:]
    assert 0 < dropped < len(history) - 2
    assert len(ChatPrompter(backend.service.target).tokens(kept)) == done.stats.n_prompt <= 512 - 32


def test_one_message_longer_than_the_context_is_a_clear_error(smol_path, tmp_path, monkeypatch):
    from specchat.errors import SpecchatError

    monkeypatch.setenv("XDG_CACHE_HOME", str(with_costs(tmp_path, *_pair(smol_path))))
    backend = _backend(smol_path, n_ctx=256)
    with pytest.raises(SpecchatError, match="context holds 256"):
        list(backend.chat([Message("user", "word " * 400)], GenerationConfig(max_tokens=8), "none",
                          threading.Event()))


def test_a_draft_length_past_the_batch_is_one_clear_error(smol):
    prompt = smol.tokenize("Hello", add_bos=True)
    with pytest.raises(SpecchatError, match=f"does not fit llama.cpp's batch of {smol.n_batch} tokens"):
        list(Engine(smol, LookupGuesser()).generate(prompt, GenerationConfig(max_tokens=4, draft_length=smol.n_batch)))


def test_pieces_longer_than_the_buffer_come_back_whole(smol):
    """A vocabulary entry is usually a few bytes, but nothing stops a GGUF from holding longer ones
    than the buffer: the piece is then read through a buffer of the size llama.cpp asks for."""
    longest = max(range(smol.n_vocab), key=lambda t: len(smol.piece(t, special=True)))
    expected = smol.piece(longest, special=True)
    buffer, smol._piece_buf = smol._piece_buf, ctypes.create_string_buffer(2)  # shorter than that piece
    try:
        assert len(expected) > 2 and smol.piece(longest, special=True) == expected
    finally:
        smol._piece_buf = buffer


def test_a_closed_backend_answers_nothing_and_says_so(smol_path, tmp_path, monkeypatch):
    from specchat.service.choices import ModelChoice
    from specchat.service.local import LocalBackend

    with pytest.raises(SpecchatError, match="the models are not loaded yet"):
        list(LocalBackend(ModelChoice()).chat([Message("user", "hi")], GenerationConfig(), "none", threading.Event()))
    monkeypatch.setenv("XDG_CACHE_HOME", str(with_costs(tmp_path, *_pair(smol_path))))
    backend = _backend(smol_path, n_ctx=256)
    assert backend.count_tokens("hello there") > 0
    backend.close()
    with pytest.raises(SpecchatError, match="the models are closed"):
        list(backend.chat([Message("user", "hi")], GenerationConfig(max_tokens=4), "none", threading.Event()))
    with pytest.raises(SpecchatError, match="the models are closed"):
        backend.count_tokens("hello")
    backend.close()  # twice is harmless
