from pathlib import Path

from specchat.service.documents import output_path, save, split_paragraphs, word_diff


def words(text: str) -> int:
    return len(text.split())


def test_chunks_keep_paragraphs_whole_and_fit():
    paras = [" ".join(f"w{p}_{i}" for i in range(n)) for p, n in enumerate([30, 30, 50, 10, 80])]
    chunks = split_paragraphs("\n\n".join(paras), 70, words)
    assert all(words(c) <= 70 for c in chunks if "w4_" not in c)
    assert [c for c in chunks if "w4_" in c] == [paras[4]]  # no sentence ends: it stands alone
    assert "\n\n".join(chunks).split() == "\n\n".join(paras).split()  # nothing lost, order kept
    assert chunks[0] == "\n\n".join(paras[:2])


def test_a_paragraph_longer_than_the_budget_splits_at_sentences():
    para = " ".join(f"Sentence number {i} is here." for i in range(20))
    chunks = split_paragraphs(para, 30, words)
    assert len(chunks) > 1 and all(c.endswith(".") for c in chunks)
    assert " ".join(chunks).split() == para.split()


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
    requests = rewrite_requests("Fix it.", "\n\n".join(paras), 1024, words, GenerationConfig(max_tokens=512, stop=("x",)))
    budget = (1024 - 200) // 2  # half of what the instruction leaves: the answer is about as long as its chunk
    assert len(requests) == 5  # two paragraphs of 150 words a request
    for messages, config in requests:
        assert words(messages[-1].content.removeprefix("Fix it.\n\n")) <= budget
        assert config.max_tokens == budget + 64 and config.stop == ()
    assert "\n\n".join(m[-1].content.removeprefix("Fix it.\n\n") for m, _ in requests) == "\n\n".join(paras)


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


def test_the_review_knows_when_the_file_changed_on_disk(tmp_path: Path):
    from specchat.service.documents import unchanged_since

    doc = tmp_path / "notes.md"
    doc.write_text(ORIGINAL)
    assert unchanged_since(doc, ORIGINAL)
    doc.write_text(ORIGINAL + "A line another editor added.\n")
    assert not unchanged_since(doc, ORIGINAL)
    doc.unlink()
    assert not unchanged_since(doc, ORIGINAL)
