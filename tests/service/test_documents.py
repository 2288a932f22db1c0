from pathlib import Path

import pytest

from specchat.errors import SpecchatError
from specchat.service.documents import Document, Review, open_document, output_path, save, split_paragraphs, word_diff


def words(text: str) -> int:
    return len(text.split())


def test_chunks_keep_paragraphs_whole_and_fit():
    paras = [" ".join(f"w{p}_{i}" for i in range(n)) for p, n in enumerate([30, 30, 50, 10, 80])]
    chunks = split_paragraphs("\n\n".join(paras), 70, words).texts
    assert all(words(c) <= 70 for c in chunks)  # the longest, with no sentence end, between words
    assert "\n\n".join(chunks).split() == "\n\n".join(paras).split()  # nothing lost, order kept
    assert chunks[0] == "\n\n".join(paras[:2])


def test_a_passage_with_no_sentence_end_splits_at_line_ends_then_between_words():
    """A list, a table or code has no sentence ends: it stood alone, however long, and a rewrite failed on it only once
    every part before it had been rewritten. Now its lines are split apart, and a line longer than a part between
    its words."""
    rows = [f"| row {i} | value {i} | note {i} |" for i in range(40)]  # 9 words a line, 360 in all
    parts = split_paragraphs("Intro.\n\n" + "\n".join(rows), 50, words)
    assert all(words(c) <= 50 for c in parts.texts) and len(parts.texts) > 7
    assert all(c.startswith("| row") and c.endswith("|") for c in parts.texts[1:])  # whole lines
    assert parts.join(parts.texts) == "Intro.\n\n" + "\n".join(rows)
    line = " ".join(f"w{i}" for i in range(200))
    parts = split_paragraphs(line, 50, words)
    assert [words(c) for c in parts.texts] == [50, 50, 50, 50] and parts.join(parts.texts) == line


def test_a_run_with_no_space_longer_than_a_part_is_refused_naming_its_line():
    text = "A short line.\n\nAnother.\n" + "x" * 400 + "\n\nThe end."
    with pytest.raises(SpecchatError, match=r"^line 4 has 100 tokens with no space to split them at .*xxxx.* \(50\); "
                                            r"break it up, or raise --ctx$"):
        split_paragraphs(text, 50, lambda piece: len(piece) // 4)


def test_a_paragraph_longer_than_the_budget_splits_at_sentences():
    para = " ".join(f"Sentence number {i} is here." for i in range(20))
    chunks = split_paragraphs(para, 30, words).texts
    assert len(chunks) > 1 and all(c.endswith(".") for c in chunks)
    assert " ".join(chunks).split() == para.split()


def test_a_long_document_is_counted_once():
    """Each paragraph and each gap between them is tokenized once: counting each part anew as it grew tokenized
    a 350 KB document over and over (4.1 s on the default pair, the app's screen frozen meanwhile)."""
    text = "\n\n".join(" ".join(f"w{p}_{i}" for i in range(20)) for p in range(300))
    counted: list[int] = []

    def count(piece: str) -> int:
        counted.append(len(piece))
        return words(piece)

    chunks = split_paragraphs(text, 200, count).texts
    assert len(chunks) == 30 and all(words(c) == 200 for c in chunks)  # ten paragraphs a part, as before
    assert sum(counted) == len(text)  # every character once (counting the growing parts: 7.4 times)


def test_output_path_never_reuses_an_existing_file(tmp_path: Path):
    doc = tmp_path / "notes.md"
    doc.write_text("x")
    first = output_path(doc)
    assert first.name == "notes.rewritten.md"
    save("y", first)
    assert output_path(doc).name == "notes.rewritten-2.md"
    assert doc.read_text() == "x"


def test_word_diff_marks_the_changed_words_inside_a_paragraph():
    original = "The cat sat on teh mat.\n\nIt was hapy."
    rewritten = "The cat sat on the mat.\n\nIt was happy."
    runs = word_diff(original, rewritten)
    assert [(text, kind) for text, kind in runs if kind != "same"] == \
        [("teh", "removed"), ("the", "added"), ("hapy", "removed"), ("happy", "added")]
    # Read without the removals it is the rewrite; without the additions, the original.
    assert "".join(text for text, kind in runs if kind != "removed") == rewritten
    assert "".join(text for text, kind in runs if kind != "added") == original


def test_a_rewrite_is_requests_that_fit_the_context_and_answer_in_full():
    from specchat.decoding.engine import GenerationConfig
    from specchat.service.documents import rewrite_requests

    paras = [" ".join(f"w{i}" for i in range(n, n + 150)) for n in range(0, 1500, 150)]  # 10 paragraphs of 150 words
    parts, requests = rewrite_requests("Fix it.", "\n\n".join(paras), 1024, words,
                                       GenerationConfig(max_tokens=512, stop=("x",)))
    budget = (1024 - 200) // 2  # half of what the instruction leaves: the answer is about as long as its chunk
    assert len(requests) == 5  # two paragraphs of 150 words a request
    for messages, config in requests:
        assert words(messages[-1].content.removeprefix("Fix it.\n\n")) <= budget
        assert config.max_tokens == budget + 64 and config.stop == ()
    assert parts.join([m[-1].content.removeprefix("Fix it.\n\n") for m, _ in requests]) == "\n\n".join(paras)


# --- a rewrite reviewed change by change ------------------------------------------------------------------

ORIGINAL = "The cat sat on teh mat. It was happy.\n\nThe dog barked loudly at night.\n"
REWRITE = "The cat sat on the mat. It was very happy indeed.\n\nThe dog barked at night."


def test_a_review_starts_with_the_rewrite_and_gives_back_exactly_what_was_accepted():
    from specchat.service.documents import Change, Review

    review = Review(ORIGINAL, REWRITE)
    # A phrase rewritten around a kept word is one passage; the model's stripped ending is no change.
    assert review.changes == [Change("teh", "the"), Change("happy", "very happy indeed"), Change("loudly ", "")]
    assert review.text == REWRITE + "\n"  # every change starts accepted: the rewrite as written
    review.decide(1, False)
    assert review.text == "The cat sat on the mat. It was happy.\n\nThe dog barked at night.\n"
    assert review.summary() == "2 of 3 changes accepted, 1 rejected"
    kinds = [(text, kind) for text, kind, n in review.runs() if n == 1]
    assert kinds == [("happy", "kept"), ("very happy indeed", "declined")]
    review.decide_all(False)
    assert review.text == ORIGINAL  # nothing accepted: the original, byte for byte
    review.decide_all(True)
    assert review.text == REWRITE + "\n"


def test_a_rewrite_that_stops_before_the_document_ends_keeps_the_rest_until_the_user_drops_it():
    """Seen with the default target on a two-paragraph file: "Fix grammar" answered the first paragraph and
    ended. Accepting the rewrite as written must not delete the second."""
    from specchat.service.documents import Change, Review

    original = "Teh quick brown fox.\n\nThis sentance has a speling mistake.\n\nA third one.\n"
    review = Review(original, "The quick brown fox.")
    assert review.cut_short == 1 and review.accepted == [True, False]
    assert review.changes[-1] == Change("\n\nThis sentance has a speling mistake.\n\nA third one.", "")
    assert review.text == "The quick brown fox.\n\nThis sentance has a speling mistake.\n\nA third one.\n"
    review.decide(1, True)  # the user's to drop
    assert review.text == "The quick brown fox.\n"
    # Stopped mid-paragraph, with the next one lost too: the same, and the fix just before stays its own change.
    review = Review(original, "The quick brown fox.\n\nThis sentence has")
    assert review.cut_short == 1 and review.accepted == [True, True, False]
    assert review.text == "The quick brown fox.\n\nThis sentence has a speling mistake.\n\nA third one.\n"
    # Not cut short: the whole document rewritten, a middle paragraph dropped, the last words dropped.
    for rewrite in ("The quick brown fox.\n\nThis sentence has a spelling mistake.\n\nA third one.",
                    "Teh quick brown fox.\n\nA third one.",
                    "Teh quick brown fox.\n\nThis sentance has a speling mistake.\n\nA third"):
        review = Review(original, rewrite)
        assert not review.cut_short and all(review.accepted), rewrite
    assert not Review(original, original).cut_short  # no change at all


def test_a_part_whose_rewrite_stops_short_keeps_its_rest_and_no_other_change_is_held_back():
    """A document rewritten in parts, each part diffed against its own answer: the first part's answer left out
    its last paragraph. That removal starts rejected, apart from the next part's first fix."""
    from specchat.service.documents import Change, Parts, Review

    first, second = "A one. A two.\n\nA three.", "Bee one.\n\nB two."
    original = f"{first}\n\n{second}\n"
    parts = Parts.cut(original, [(0, len(first)), (len(first) + 2, len(first) + 2 + len(second))])
    answers = ["A one. A two.", "B one.\n\nB two."]
    review = Review.of_parts(parts, answers)
    assert review.cut_short == 1
    assert review.changes == [Change("\n\nA three.", ""), Change("Bee", "B")]
    assert review.accepted == [False, True]
    assert review.text == "A one. A two.\n\nA three.\n\nB one.\n\nB two.\n"
    review.decide_all(True)
    assert review.text == parts.join(answers)
    # Diffed whole, the removal and the next part's fix run together: one change, neither left out nor kept.
    assert Review(original, parts.join(answers)).cut_short == 0


def test_the_review_knows_when_the_file_changed_on_disk(tmp_path: Path):
    from specchat.service.documents import open_document, unchanged_since

    doc = tmp_path / "notes.md"
    doc.write_bytes(ORIGINAL.replace("\n", "\r\n").encode())
    opened = open_document(doc)
    assert unchanged_since(doc, opened)
    doc.write_bytes(ORIGINAL.encode())  # another editor saved it with other line ends: the same text
    assert not unchanged_since(doc, opened)
    doc.write_bytes((ORIGINAL + "A line another editor added.\n").replace("\n", "\r\n").encode())
    assert not unchanged_since(doc, opened)
    doc.unlink()
    assert not unchanged_since(doc, opened)


# --- a document written back as it was on disk, but for the accepted changes -------------------------------

LINES = ["The cat sat on teh mat.", "It was happy.", "", "The dog barked loudly at night."]
BOM8, BOM16LE, BOM16BE = b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"
FILES = {
    "CRLF": "\r\n".join(LINES).encode() + b"\r\n",
    "mixed ends": b"The cat sat on teh mat.\r\nIt was happy.\n\r\nThe dog barked loudly at night.\n",
    "lone CR": "\r".join(LINES).encode() + b"\r",
    "no final newline": "\n".join(LINES).encode(),
    "CRLF, no final newline": "\r\n".join(LINES).encode(),
    "trailing blank lines": "\n".join(LINES).encode() + b"\n\n\n",
    "UTF-8 BOM": BOM8 + "\r\n".join(LINES).encode() + b"\r\n",
    "UTF-16 LE BOM": BOM16LE + ("\r\n".join(LINES) + "\r\n").encode("utf-16-le"),
    "UTF-16 BE BOM": BOM16BE + "\n".join(LINES).encode("utf-16-be"),
    # A form feed and a line separator are a line's own characters in a text file, not line ends.
    "form feed and U+2028": "Page one\x0cpage two ends teh line.\r\nOne\u2028line.\r\n".encode(),
}


@pytest.mark.parametrize("raw", FILES.values(), ids=FILES.keys())
def test_rejecting_every_change_writes_the_file_back_byte_for_byte(tmp_path: Path, raw: bytes):
    doc = tmp_path / "notes.md"
    doc.write_bytes(raw)
    document = open_document(doc)
    assert "\r" not in document.text  # the model and the review see "\n" line ends
    rewrite = document.text.replace("teh", "the").replace("loudly ", "").replace("\n\n", "\n").strip()
    review = Review(document.text, rewrite)
    assert review.changes
    review.decide_all(False)
    save(review.text, doc, document)
    assert doc.read_bytes() == raw
    out = save(review.text, output_path(doc), document)  # a new file beside it is written the same way
    assert out.read_bytes() == raw


def test_the_text_is_the_file_with_newline_line_ends_and_without_its_bom():
    assert Document.decode(FILES["UTF-16 LE BOM"]).text == "\n".join(LINES) + "\n"
    assert Document.decode(FILES["lone CR"]).text == "\n".join(LINES) + "\n"
    assert Document.decode(FILES["form feed and U+2028"]).text == "Page one\x0cpage two ends teh line.\nOne\u2028line.\n"


def test_accepting_one_change_in_a_crlf_file_changes_only_that_line(tmp_path: Path):
    doc = tmp_path / "notes.md"
    doc.write_bytes(FILES["CRLF"])
    document = open_document(doc)
    review = Review(document.text, "The cat sat on the mat.\nIt was very happy.\n\nThe dog barked at night.")
    assert (review.changes[0].removed, review.changes[0].added) == ("teh", "the") and len(review.changes) == 3
    review.decide_all(False)
    review.decide(0, True)
    save(review.text, doc, document)
    assert doc.read_bytes() == FILES["CRLF"].replace(b"teh", b"the")


def test_a_changed_line_keeps_the_end_of_the_line_it_replaces_and_a_new_line_gets_the_usual_one():
    document = Document.decode(b"one\r\ntwo\nthree\r\nfour\r\n")
    assert document.encode("one\nTWO\nthree\nfour\n") == b"one\r\nTWO\nthree\r\nfour\r\n"
    assert document.encode("one\nTWO\nTHREE\nfour\n") == b"one\r\nTWO\nTHREE\r\nfour\r\n"  # one for one
    assert document.encode("one\ntwo\nadded\nthree\nfour\n") == b"one\r\ntwo\nadded\r\nthree\r\nfour\r\n"
    assert document.encode("one\ntwo\nthree\nfour") == b"one\r\ntwo\nthree\r\nfour"  # the end, as the text has it
    # Lines that replace others which all ended alike end so too: here a line split in two, then two joined.
    assert document.encode("one\ntwo, part one\npart two\nthree\nfour\n") == \
        b"one\r\ntwo, part one\npart two\nthree\r\nfour\r\n"
    assert document.encode("one\ntwo and three\nfour\n") == b"one\r\ntwo and three\r\nfour\r\n"
    lone = Document.decode(b"a\rb\rc")
    assert lone.encode("a\nb\nc\nd") == b"a\rb\rc\rd"


def test_the_end_of_the_file_is_no_change_to_review():
    for original in ["No final newline.", "One newline.\n", "Blank lines after.\n\n\n"]:
        review = Review(original, "Rewritten.\n")  # a model's answer, with an end of its own
        assert review.changes and not any("\n" in c.removed + c.added for c in review.changes)
        assert review.text == "Rewritten." + original[len(original.rstrip("\n")):]
        review.decide_all(False)
        assert review.text == original


def test_a_file_in_no_encoding_it_names_is_one_clear_line(tmp_path: Path):
    doc = tmp_path / "latin1.txt"
    doc.write_bytes("café\n".encode("latin-1"))
    with pytest.raises(SpecchatError, match="is not UTF-8 text; convert it first"):
        open_document(doc)
    doc.write_bytes(BOM16LE + b"\x00\xd8")  # a lone surrogate
    with pytest.raises(SpecchatError, match="is not UTF-16-LE text"):
        open_document(doc)


SPACED = "\n\n  Leading blank lines, and an indent.\n\n\n\nThree blank lines before this.\nA wrapped line.\n \t\n" \
         "A long paragraph. Its sentences\nare cut where they end.  Two spaces before this one.\n\n\n"


def test_a_document_in_parts_joins_back_with_its_own_spacing():
    parts = split_paragraphs(SPACED, 8, words)
    assert len(parts.texts) > 3 and "Its sentences\nare cut where they end." in parts.texts
    assert all(part == part.strip() for part in parts.texts)  # the model is sent no spacing of the document's
    assert parts.join(parts.texts) == SPACED
    review = Review(SPACED, parts.join([part.upper() for part in parts.texts]))
    assert all(c.removed.strip() and c.added.strip() for c in review.changes)  # the spacing is no change
    review.decide_all(False)
    assert review.text == SPACED
