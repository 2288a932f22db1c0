from specchat.decoding.guessers import lookup
from specchat.decoding.textstream import TextStream


def test_lookup_prefers_longest_ngram_and_most_recent_occurrence():
    #        0  1  2  3  4  5  6  7  8  9
    ctx = [1, 2, 3, 9, 1, 2, 3, 8, 7, 2, 3]
    # The 3-gram (7, 2, 3) never occurred; the 2-gram (2, 3) did, most recently at 5.
    assert lookup(ctx, 3) == [8, 7, 2]


def test_lookup_limits_proposal_to_k_and_to_known_tokens():
    ctx = [5, 6, 7, 5, 6]
    assert lookup(ctx, 10) == [7, 5, 6]
    assert lookup(ctx, 1) == [7]
    assert lookup(ctx, 0) == []


def test_lookup_finds_nothing_in_fresh_text():
    assert lookup([1, 2, 3, 4], 5) == []
    assert lookup([1], 5) == []


def test_utf8_split_across_tokens_is_released_whole():
    stream = TextStream()
    euro = "€".encode()
    assert stream.decode(euro[:1]) == ""
    assert stream.decode(euro[1:]) + stream.decode(b"!") == "€!"


def test_stop_string_split_across_pushes_is_never_shown():
    stream = TextStream(stop=["</end>"])
    shown = stream.push("hello </e") + stream.push("nd> world")
    assert shown == "hello "
    assert stream.stopped


def test_held_text_that_is_not_a_stop_string_is_released():
    stream = TextStream(stop=["STOP"])
    assert stream.push("a ST") == "a "
    assert stream.push("ART") == "START"
    assert stream.push(" and ST") == " and "
    assert stream.flush() == "ST"
