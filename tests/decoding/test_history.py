"""The history guesser: an index over the user's past conversations, kept in step with the store, and
auto copying from it on a real model when an answer is asked for again."""

from __future__ import annotations

import numpy as np
import pytest

from specchat.decoding.engine import GenerationConfig
from specchat.decoding.events import Done, Step
from specchat.decoding.history import HistoryIndex
from specchat.decoding.policy import CostCurve
from specchat.decoding.sampling import SamplingConfig
from specchat.llama.template import Message
from specchat.service.chat import ChatService
from specchat.service.choices import ModelChoice
from specchat.service.history import History, text_key
from specchat.service.loader import load_pair
from specchat.store.conversations import Store


class Words:
    """A tokenizer for tests: one id per distinct word, counting its calls."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.calls = 0

    def __call__(self, text: str) -> list[int]:
        self.calls += 1
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]


def test_the_longest_match_decides_and_the_guess_stops_where_the_matches_part():
    words = Words()
    index = HistoryIndex()
    index.add("a", words("the cat sat on the mat and slept"))
    index.add("b", words("a dog sat on the rug and barked"))
    # "sat on the" is in both; "cat sat on the" only in the first: the longer match wins outright.
    tokens, length = index.propose(words("my cat sat on the"), 3)
    assert (tokens, length) == (words("mat and slept"), 4)
    # Two equally long matches that go on differently: nothing past the point they share.
    tokens, length = index.propose(words("sat on the"), 4)
    assert length == 3 and tokens == []
    index.add("c", words("we sat on the mat today"))
    tokens, _ = index.propose(words("sat on the"), 4)
    assert tokens == words("mat")  # two of three places agree on "mat", then they part
    assert index.propose(words("nothing like it"), 4) == ([], 0)


def test_no_match_runs_across_two_texts_and_the_oldest_go_over_budget():
    words = Words()
    index = HistoryIndex(max_tokens=8)
    index.add("a", words("one two three"))
    index.add("b", words("four five six"))
    assert index.propose(words("two three"), 2) == ([], 2)  # "three" ended its text: "four" is another's
    index.add("c", words("seven eight nine"))
    assert "a" not in index and {"b", "c"} <= set(index.keys())
    index.remove(["b"])
    assert index.propose(words("four five"), 1) == ([], 0)


def store_with(tmp_path, *conversations: list[str]) -> Store:
    store = Store(tmp_path / "chat.db")
    for texts in conversations:
        c = store.new_conversation()
        for i, text in enumerate(texts):
            store.add_message(c.id, "user" if i % 2 == 0 else "assistant", text)
    return store


def test_the_index_is_kept_beside_the_store_and_read_back_without_tokenizing_again(tmp_path):
    store = store_with(tmp_path, ["write a haiku", "old pond frog jumps in"])
    words = Words()
    history = History(store, "words", words)
    assert words.calls == 2 and history.path.parent == store.path.parent
    history.learn(["write a haiku", "old pond frog jumps in", "a splash of water"])
    assert words.calls == 3  # only the new text
    again = Words()
    again.ids = words.ids
    reopened = History(store, "words", again)
    assert again.calls == 0
    assert reopened.index.propose(words("old pond"), 3) == (words("frog jumps in"), 2)


def test_a_damaged_file_is_built_again_from_the_store(tmp_path):
    store = store_with(tmp_path, ["write a haiku", "old pond frog jumps in"])
    words = Words()
    History(store, "words", words).path.write_bytes(b"not an npz file")
    rebuilt = History(store, "words", words)
    assert rebuilt.index.propose(words("old pond"), 3) == (words("frog jumps in"), 2)
    rebuilt.path.write_bytes(rebuilt.path.read_bytes()[:40])  # cut short, as by a crash mid-write elsewhere
    assert History(store, "words", words).index.propose(words("old pond"), 1) == (words("frog"), 2)


def test_a_deleted_conversation_is_not_copied_from_and_leaves_the_file(tmp_path):
    store = store_with(tmp_path, ["my address is 12 elm street"], ["the weather is fine today"])
    words = Words()
    history = History(store, "words", words)
    assert history.index.propose(words("is 12"), 2) == (words("elm street"), 2)
    store.delete(store.conversations()[-1].id)  # the oldest: the one with the address
    history.sync()
    assert history.index.propose(words("is 12"), 2) == ([], 0)
    assert History(store, "words", Words()).index.tokens == 5  # nor is it in the file
    assert b"elm" not in history.path.read_bytes()


def test_a_disk_that_cannot_take_the_file_leaves_the_index_working(tmp_path, monkeypatch):
    store = store_with(tmp_path, ["old pond frog jumps in"])
    words = Words()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", full)
    history = History(store, "words", words)
    assert not history.path.exists() and not list(tmp_path.glob(".*.tmp"))
    assert history.index.propose(words("old pond"), 1) == (words("frog"), 2)


FLAT = CostCurve([0.010 + 0.0002 * n for n in range(32)], draft_s=0.001, mtp_s=0.001)


@pytest.mark.real
def test_auto_copies_an_answer_asked_for_again_from_history_and_not_once_it_is_deleted(smol_path, tmp_path):
    """A question asked again in a new conversation (greedy): auto drafts the earlier answer from the
    history index, and the target takes most of it; once those conversations are deleted, it is not."""
    pair = load_pair(ModelChoice(target=smol_path, n_ctx=1024, threads=2))
    pair.costs.assume(FLAT)  # a known machine's curve, so the decision rests on acceptance alone
    store = Store(tmp_path / "chat.db")
    service = ChatService(pair, History.of(store, pair.target))
    # Seeded, so that auto's account goes by that curve too, not by this machine's clock (greedy: the same text).
    config = GenerationConfig(SamplingConfig(seed=0), max_tokens=48)
    question = [Message("user", "List the planets of the solar system, one per line.")]

    def ask(guesser: str) -> tuple[Done, list[Step]]:
        c = store.new_conversation()
        store.add_message(c.id, "user", question[0].content)
        events = list(service.chat(question, config, guesser))
        done = events[-1]
        store.add_message(c.id, "assistant", done.text)
        return done, [e for e in events if isinstance(e, Step)]

    try:
        first, _ = ask("none")
        assert first.stats.n_tokens >= 24
        again, steps = ask("auto")
        copied = [s for s in steps if s.guesser == "history"]
        drafted, accepted = sum(s.drafted for s in copied), sum(s.accepted for s in copied)
        assert drafted >= 16 and accepted / drafted >= 0.8, (drafted, accepted)
        assert len(steps) < again.stats.n_tokens / 2  # it came in few steps
        for c in store.conversations():
            store.delete(c.id)
        service.history.sync()  # as the next answer does first
        assert text_key(first.text) not in service.history.index
        _, steps = ask("auto")
        # The question is in the store again (the app stores it before answering), so a few words of
        # it may still be copied; the answers that were deleted are not.
        assert sum(s.accepted for s in steps if s.guesser == "history") <= accepted / 4, (accepted, steps)
    finally:
        pair.close()


def test_what_copies_from_history_earned_carries_into_the_next_chat_apart_for_sampled_answers():
    """A new conversation builds a new auto; what the earlier ones showed of copies from history (here:
    the target never takes them, under sampling) is where its estimate starts, not the priors."""
    from specchat.decoding.guessers import AutoGuesser
    from specchat.decoding.sampling import SamplingConfig

    words = Words()
    index = HistoryIndex()
    index.add("a", words("please rewrite this paragraph in a formal style and keep every fact"))
    context = words("now please rewrite this paragraph")
    sampled, greedy, rng = SamplingConfig(temperature=0.7), SamplingConfig(), np.random.default_rng(0)

    def offered(sampling: SamplingConfig) -> int:
        auto = AutoGuesser(FLAT, history=index)
        proposal = auto.propose(context, 8, sampling, rng)
        return len(proposal.tokens) if proposal.guesser == "history" else 0

    before = offered(greedy)
    assert offered(sampled) == before >= 4
    for _ in range(30):  # earlier chats: every sampled copy from history rejected at once
        auto = AutoGuesser(FLAT, history=index)
        drafted = len(auto.propose(context, 8, sampled, rng).tokens)
        auto.observe(drafted, 0)
    # On this nearly flat curve one more position costs 2% of a step: a 1-token guess still pays.
    assert offered(sampled) <= 1
    assert offered(greedy) == before  # greedy copies keep their own record
