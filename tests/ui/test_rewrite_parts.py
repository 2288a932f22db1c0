"""A document longer than the context, rewritten in parts by the rewrite screen: the parts come back together
with the text that lay between them in the original, whatever it was, so that a rewrite that changed nothing
saves the original byte for byte."""

from __future__ import annotations

import threading
from typing import Iterator, Sequence

import pytest
from fakes import FakeBackend
from pilot import make_app, reviewed, rewriting, until

from specchat.errors import SpecchatError
from specchat.ui.widgets import StatsPanel

SENTENCE = "The quick brown fox jumps over the lazy dog by the quiet river at dawn, {}."
SENTENCES = [SENTENCE.format(n) for n in range(12)]  # 16 words each: 192 in all, more than one part's 128
PARAGRAPHS = [" ".join(SENTENCES[i:i + 3]) for i in range(0, 12, 3)]

DOCUMENTS = {  # how the parts are separated: the document's bytes
    "a blank line": ("\n\n".join(PARAGRAPHS) + "\n").encode(),
    "three blank lines": ("\n\n".join(PARAGRAPHS[:2]) + "\n\n\n\n" + "\n\n".join(PARAGRAPHS[2:]) + "\n").encode(),
    "a single newline": ("\n".join(SENTENCES) + "\n").encode(),
    "a single CRLF": ("\r\n".join(SENTENCES) + "\r\n").encode(),
    "a space, and nothing at either end": " ".join(SENTENCES).encode(),
}


class Echo(FakeBackend):
    """Answers each part with the part itself, as a rewrite that changes nothing; a context small enough that
    the document takes more than one part."""

    n_ctx = 300  # a part is then at most 128 words (rewrite_requests' floor)

    def chat(self, messages, config, guesser, cancel, think=None) -> Iterator:
        self.answer = messages[-1].content.split("\n\n", 1)[1]  # after the instruction
        return super().chat(messages, config, guesser, cancel, think)


def opened(tmp_path, backend: Echo, raw: bytes = DOCUMENTS["a blank line"]):
    """The app in rewrite mode on notes.md, which holds `raw`."""
    doc = tmp_path / "notes.md"
    doc.write_bytes(raw)
    return make_app(tmp_path, backend, rewrite_file=doc)


def parts_sent(backend: Echo) -> Sequence[str]:
    return [messages[-1].content.split("\n\n", 1)[1] for messages, _ in backend.calls]


@pytest.mark.parametrize("gap", list(DOCUMENTS))
async def test_a_rewrite_in_parts_that_changes_nothing_saves_the_original_byte_for_byte(tmp_path, gap):
    original = DOCUMENTS[gap]
    backend = Echo()
    app = opened(tmp_path, backend, original)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        assert len(backend.calls) >= 2 and screen.review.changes == []
        # The first token came after the first part was read (the fake's prefill, 0.05 s), as in the chat.
        panel = screen.query_one(StatsPanel)
        assert panel.prefill_s == pytest.approx(0.05) and panel.ttft > 0.05
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save")
    parts = parts_sent(backend)
    assert all(part == part.strip() for part in parts)  # the gaps stay behind: the model is sent none
    assert (tmp_path / "notes.rewritten.md").read_bytes() == original


class StopsShort(Echo):
    """Answers the first part with its first sentence alone, as a model that ends its answer early, and the
    others with themselves."""

    asked = 0

    def chat(self, messages, config, guesser, cancel, think=None) -> Iterator:
        stream = super().chat(messages, config, guesser, cancel, think)
        self.asked += 1
        if self.asked == 1:
            self.answer = self.answer.split(". ", 1)[0] + "."
        return stream


async def test_a_part_whose_answer_stops_short_keeps_its_rest_when_the_rewrite_is_saved_as_written(tmp_path):
    original = DOCUMENTS["a blank line"]
    backend = StopsShort()
    app = opened(tmp_path, backend, original)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await reviewed(pilot, app)
        assert len(backend.calls) >= 2 and screen.review.accepted == [False]
        assert screen.review.changes[0].removed.endswith("dawn, 5.")  # the first part's rest, not the document's
        assert "stopped before the end of the document or of a part" in str(screen.query_one("#rewrite-status").render())
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save")
    assert (tmp_path / "notes.rewritten.md").read_bytes() == original


class SlowTokenizer(Echo):
    """Tokenizes as a long document does on a slow machine: each count waits until the test lets it go (or 5 s)."""

    def __init__(self) -> None:
        super().__init__()
        self.counting, self.go = threading.Event(), threading.Event()

    def count_tokens(self, text: str) -> int:
        self.counting.set()
        self.go.wait(5.0)
        return super().count_tokens(text)


async def test_the_screen_answers_while_a_long_document_is_read(tmp_path):
    """The document is cut into parts on the rewrite's own thread: while its tokens are counted the screen says so
    and takes keys (Esc stops the rewrite: no part is rewritten). Cut on the screen's thread, Ctrl+R froze the app
    until the counting was done (4.1 s for a 350 KB document on the default pair)."""
    backend = SlowTokenizer()
    app = opened(tmp_path, backend)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await rewriting(pilot, app)
        status = screen.query_one("#rewrite-status")
        await until(pilot, lambda: backend.counting.is_set() and "reading the document" in str(status.render()),
                    "the status while counting")
        await pilot.press("escape")  # handled now, while the counting goes on
        assert screen.cancel.is_set()
        backend.go.set()
        await until(pilot, lambda: not screen.running, "the rewrite to stop")
        assert len(backend.calls) <= 1  # at most the first part asked, and stopped at once
        assert screen.review is None and "stopped" in str(status.render())


class Shouts(Echo):
    """Rewrites each part by shouting its first word; the second part pauses after its first step (for an Esc) or
    fails there, as a model whose context the part overflows would."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail, self.asked = fail, 0

    def chat(self, messages, config, guesser, cancel, think=None) -> Iterator:
        stream = super().chat(messages, config, guesser, cancel, think)
        first, rest = self.answer.split(" ", 1)
        self.answer = first.upper() + " " + rest
        self.asked += 1
        self.pause_after = 1 if self.asked == 2 else None
        if self.asked == 2 and self.fail:
            return self._fails()
        return stream

    def _fails(self) -> Iterator:
        raise SpecchatError("the prompt is too long for the context")
        yield  # a generator, as the backend's chat is: it fails once read


@pytest.mark.parametrize("fail", [False, True], ids=["esc", "an error"])
async def test_a_rewrite_stopped_in_a_later_part_keeps_the_parts_before_it_for_review(tmp_path, fail):
    """Esc, or a failure, in the second part: the first part's rewrite is reviewed as usual, the rest of the document
    kept as it was (every part's work was thrown away: minutes on a CPU for a long document)."""
    original = DOCUMENTS["a blank line"]
    backend = Shouts(fail)
    app = opened(tmp_path, backend, original)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await rewriting(pilot, app)
        if not fail:
            await until(pilot, lambda: backend.paused.is_set(), "the second part's pause")
            await pilot.press("escape")
        await until(pilot, lambda: screen.review is not None and not screen.running, "the review")
        assert backend.asked == 2
        assert [(c.removed, c.added) for c in screen.review.changes] == [("The", "THE")]  # the first part's alone
        status = str(screen.query_one("#rewrite-status").render())
        lead = "error: the prompt is too long for the context in part 2" if fail else "stopped in part 2"
        assert status.startswith(f"{lead} of 2; the part before it rewritten, the rest as it was (Ctrl+R goes on "
                                 "from part 2): ")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: (tmp_path / "notes.rewritten.md").exists(), "the save")
    assert (tmp_path / "notes.rewritten.md").read_bytes() == b"THE" + original[3:]


async def test_a_document_that_cannot_be_split_is_refused_before_any_part_is_rewritten(tmp_path):
    backend = TokensOfFour()
    app = opened(tmp_path, backend, ("\n\n".join(PARAGRAPHS) + "\n\n" + "=" * 2000 + "\n").encode())  # 2,000 = and no space
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await rewriting(pilot, app)
        await until(pilot, lambda: not screen.running, "the refusal")
        assert backend.calls == [] and screen.review is None
        assert str(screen.query_one("#rewrite-status").render()).startswith(
            "error: line 9 has 501 tokens with no space to split them at")


class TokensOfFour(Echo):
    """A word and a token for every four of its characters."""

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + sum(len(word) // 4 for word in text.split())


async def test_ctrl_r_goes_on_from_the_part_a_rewrite_stopped_in_and_keeps_the_decisions_made(tmp_path):
    backend = Shouts()
    app = opened(tmp_path, backend)
    async with app.run_test(size=(140, 40)) as pilot:
        screen = await rewriting(pilot, app)
        await until(pilot, lambda: backend.paused.is_set(), "the second part's pause")
        await pilot.press("escape")
        await until(pilot, lambda: screen.review is not None and not screen.running, "the review of the first part")
        await pilot.press("ctrl+n")  # its one change rejected
        await pilot.press("ctrl+r")
        await until(pilot, lambda: screen.review is not None and not screen.running, "the rest of the rewrite")
        assert backend.asked == 3 and parts_sent(backend)[2] == parts_sent(backend)[1]  # the second part, again
        assert [(c.removed, c.added) for c in screen.review.changes] == [("The", "THE")] * 2
        assert screen.review.accepted == [False, True]  # the decision made before going on stays
        status = str(screen.query_one("#rewrite-status").render())
        assert status.startswith("done: ") and "2 changes, all accepted but one: what you decided on the parts before " \
            "Ctrl+R went on is kept" in status
        await pilot.press("ctrl+r")  # a finished rewrite starts again from its first part
        await until(pilot, lambda: backend.asked == 5 and not screen.running, "the rewrite again")
        assert screen.review.accepted == [True, True]
