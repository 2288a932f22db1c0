"""Property-based tests (hypothesis): odd and bad input never crashes and does what is documented.

Prompt lookup and the verifier, stop strings and UTF-8 split across tokens, and the parsing of
models.toml and the config file, whose errors must name the file, the right line and the key.
Each example is counted for the README's reliability table.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence, TypeVar
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability import tally

from specchat.decoding.guessers import GUESSERS, LookupGuesser, lookup, lookup_match, matches
from specchat.decoding.sampling import SamplingConfig, logits_to_probs, sample
from specchat.decoding.textstream import TextStream
from specchat.decoding.verify import verify, verify_greedy
from specchat.errors import SpecchatError
from specchat.models.catalog import load_catalog
from specchat.models.fetch import models_dir
from specchat.service.settings import Settings, load_settings
from specchat.store.tomlpos import dotted_key, key_line

# No .hypothesis/ folder in the shared working tree; no deadline, as a busy machine is not a bug.
PROPS = settings(max_examples=250, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(PROPS, max_examples=150)

S = TypeVar("S", str, bytes)


def split(whole: S, cuts: Sequence[int]) -> list[S]:
    """`whole` cut at the given positions (clipped, any order): how tokens may split a text."""
    points = sorted({0, len(whole), *(min(c, len(whole)) for c in cuts)})
    return [whole[a:b] for a, b in zip(points, points[1:])]


# --- prompt lookup ---------------------------------------------------------------------------

contexts = st.lists(st.integers(0, 3), max_size=40) | st.lists(st.integers(-2**40, 2**40), max_size=8)


@PROPS
@given(context=contexts, k=st.integers(-2, 12), max_ngram=st.integers(-1, 6))
def test_lookup_proposes_what_followed_the_latest_longest_match(context, k, max_ngram):
    found, ngram = lookup_match(context, k, max_ngram)
    proposal = LookupGuesser(max_ngram).propose(context, k, SamplingConfig(), np.random.default_rng(0))
    assert (proposal.tokens, proposal.probs, proposal.guesser) == (found, None, "lookup")
    assert lookup(context, k, max_ngram) == found
    assert all(type(t) is int for t in found)
    n = len(context)

    def earlier(m: int) -> list[int]:
        """Starts of earlier occurrences of the last m tokens, latest first."""
        return [j for j in range(n - m - 1, -1, -1) if context[j:j + m] == context[n - m:]]

    if k <= 0:
        assert (found, ngram) == ([], 0)
    else:
        assert (ngram > 0) == bool(found) and len(found) <= k and ngram <= max(max_ngram, 0)
        # No longer n-gram (within max_ngram) occurred earlier: the match is the longest.
        assert not any(earlier(m) for m in range(ngram + 1, min(max_ngram, n - 1) + 1))
        if ngram:
            j = earlier(ngram)[0] + ngram  # the most recent occurrence, and what followed it
            assert found == context[j:j + k]
    tally("bad input: lookup + verifier", inputs=1)


@PROPS
@given(context=contexts, cap=st.integers(0, 6))
def test_matches_lists_every_earlier_occurrence_with_its_match_length(context, cap):
    ends, lengths = matches(context, cap)
    n = len(context)
    expected = [e for e in range(1, n) if cap >= 1 and context[e - 1] == context[-1]]
    assert ends.tolist() == expected
    for e, m in zip(ends.tolist(), lengths.tolist()):
        # The last m tokens equal the m before e, and one more (within cap) would not.
        assert 1 <= m <= cap and context[e - m:e] == context[n - m:]
        assert m == cap or m == e or context[e - m - 1] != context[n - m - 1]
    tally("bad input: lookup + verifier", inputs=1)


# --- the verifier and sampling ---------------------------------------------------------------

@st.composite
def distributions(draw, size: int) -> np.ndarray:
    """A probability vector, often with zeros and sometimes one-hot."""
    if draw(st.integers(0, 4)) == 0:
        return np.eye(size)[draw(st.integers(0, size - 1))]
    weights = np.array(draw(st.lists(st.sampled_from([0.0, 0.0, 1e-12, 0.5, 1.0]) | st.floats(0, 10),
                                     min_size=size, max_size=size)))
    if not weights.sum() > 0:
        weights[draw(st.integers(0, size - 1))] = 1.0
    return weights / weights.sum()


@st.composite
def speculations(draw) -> tuple[list[int], np.ndarray | None, np.ndarray, int]:
    """Drafted tokens (any, including ones of probability 0), draft rows or None, target rows, seed."""
    size, k = draw(st.integers(1, 6)), draw(st.integers(0, 4))
    target = np.stack([draw(distributions(size)) for _ in range(k + 1)])
    draft = None if draw(st.booleans()) else np.array([draw(distributions(size)) for _ in range(k)]).reshape(k, size)
    tokens = draw(st.lists(st.integers(0, size - 1), min_size=k, max_size=k))
    return tokens, draft, target, draw(st.integers(0, 2**32 - 1))


@PROPS
@given(speculations())
def test_verify_keeps_a_prefix_the_target_allows(case):
    tokens, draft, target, seed = case
    k = len(tokens)
    verdict = verify(tokens, draft, target, np.random.default_rng(seed))
    q = [1.0 if draft is None else draft[i, x] for i, x in enumerate(tokens)]
    # Guesses with p(x) >= q(x) > ... are accepted for sure; one the target gives 0 never is.
    sure = next((i for i, x in enumerate(tokens) if not (target[i, x] >= q[i] and target[i, x] > 0)), k)
    never = next((i for i, x in enumerate(tokens) if target[i, x] == 0), k)
    assert sure <= verdict.n_accepted <= never
    assert verdict.bonus(k) == (verdict.n_accepted == k)
    p = target[verdict.n_accepted]
    assert 0 <= verdict.token < target.shape[1] and p[verdict.token] > 0
    if verdict.n_accepted < k:  # a correction comes from the residual, never the rejected guess
        rejected = tokens[verdict.n_accepted]
        if draft is None:
            assert verdict.token != rejected
        else:
            residual = np.maximum(p - draft[verdict.n_accepted], 0.0)
            assert residual[verdict.token] > 0 or residual.sum() == 0
    tally("bad input: lookup + verifier", inputs=1)


@PROPS
@given(data=st.data(), size=st.integers(1, 5), k=st.integers(0, 6))
def test_greedy_verify_accepts_exactly_the_longest_argmax_prefix(data, size, k):
    argmax = data.draw(st.lists(st.integers(0, size - 1), min_size=k + 1, max_size=k + 1))
    # Mostly the target's own choices, so that long accepted runs occur.
    draft = [a if data.draw(st.integers(0, 3)) else data.draw(st.integers(0, size - 1)) for a in argmax[:k]]
    longest = next((i for i in range(k) if draft[i] != argmax[i]), k)
    verdict = verify_greedy(draft, argmax)
    assert (verdict.n_accepted, verdict.token) == (longest, argmax[longest])
    # One-hot rows (what greedy sampling configs produce) make the sampled rule agree.
    one_hot = np.eye(size)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    assert verify(draft, None, one_hot[argmax], rng) == verdict
    assert verify(draft, one_hot[draft].reshape(k, size), one_hot[argmax], rng) == verdict
    tally("bad input: lookup + verifier", inputs=1)


@PROPS
@given(logits=st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=12),
       temperature=st.just(0.0) | st.floats(0, 10, exclude_min=True) | st.sampled_from([5e-324, 1e-310, 1e-300]),
       top_k=st.integers(0, 15), top_p=st.floats(0, 1, exclude_min=True), min_p=st.floats(0, 1, exclude_max=True),
       seed=st.integers(0, 2**32 - 1))
# A probability tie (the two logits differ by 1e-38) let top-p drop the largest logit, and the
# tiny temperature then made every kept value -inf: NaN probabilities.
@example(logits=[-1.1754943508222875e-38, 0.0], temperature=5e-324, top_k=0, top_p=0.5, min_p=0.0, seed=0)
def test_sampling_gives_a_distribution_and_draws_inside_it(logits, temperature, top_k, top_p, min_p, seed):
    cfg = SamplingConfig(temperature, top_k, top_p, min_p)
    probs = logits_to_probs(np.array(logits), cfg)
    assert np.all(np.isfinite(probs)) and np.all(probs >= 0) and probs.sum() == pytest.approx(1.0)
    best = int(np.argmax(logits))
    base = np.exp(np.array(logits) - max(logits))
    assert base[probs > 0].max() == base.max()  # every filter keeps a most likely token (ties: any)
    if cfg.greedy:
        assert probs[best] == 1.0
    if top_k:
        assert (probs > 0).sum() <= sum(x >= sorted(logits)[-min(top_k, len(logits))] for x in logits)
    assert probs[sample(probs, np.random.default_rng(seed))] > 0
    tally("bad input: lookup + verifier", inputs=1)


# --- stop strings and UTF-8 --------------------------------------------------------------------

STOP_ALPHABET = "ab</> \né😀"


@st.composite
def stop_cases(draw) -> tuple[str, list[str]]:
    """A text and stop strings: random ones, and pieces of the text so that they do occur."""
    text = draw(st.text(STOP_ALPHABET, max_size=40) | st.text(max_size=20))
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, len(text)))
        stops.append(draw(st.text(STOP_ALPHABET, max_size=5) | st.just(text[start:start + draw(st.integers(0, 6))])))
    return text, stops


@PROPS
@given(case=stop_cases(), cuts=st.lists(st.integers(0, 40), max_size=12))
def test_stop_strings_cut_the_text_the_same_however_tokens_split_it(case, cuts):
    text, stops = case
    stream = TextStream(stops)
    shown = "".join(stream.push(piece) for piece in split(text, cuts)) + stream.flush()
    # The stop string completed first (at equal ends, the one starting first), as when the
    # text arrives one character at a time; nothing of it, and nothing after it, is shown.
    first = min(((text.find(s) + len(s), text.find(s)) for s in stops if s and s in text), default=None)
    assert shown == (text if first is None else text[:first[1]])
    assert stream.stopped == (first is not None)
    tally("bad input: stop strings", inputs=1)


characters = st.characters(codec="utf-8") | st.sampled_from(
    ["€", "😀", "👩", "\u200d", "🇫", "🇷", "中", "文", "한", "e", "\u0301", "\u0308", "\ufffd", "\x00"])


@PROPS
@given(text=st.text(characters, max_size=30), cuts=st.lists(st.integers(0, 120), max_size=20))
def test_utf8_split_at_any_byte_decodes_back_exactly(text, cuts):
    stream = TextStream()  # no stop strings: the output is the input
    pieces = split(text.encode(), cuts)
    shown = "".join(stream.push(stream.decode(piece)) for piece in pieces) + stream.flush()
    assert shown == text
    tally("bad input: UTF-8 splits", inputs=1)


@PROPS
@given(data=st.binary(max_size=40), cuts=st.lists(st.integers(0, 40), max_size=20))
def test_invalid_utf8_split_anywhere_reads_as_decoding_it_whole(data, cuts):
    stream = TextStream()
    shown = "".join(stream.push(stream.decode(piece)) for piece in split(data, cuts)) + stream.flush()
    assert shown == data.decode("utf-8", errors="replace")
    tally("bad input: UTF-8 splits", inputs=1)


# --- models.toml -------------------------------------------------------------------------------

Key = tuple[str, ...]
BARE = re.compile(r"[A-Za-z0-9_-]+")
DECOYS = ["", "# [models.decoy]", '# file = "../x.gguf"', "   # size = -1", "\t"]


def basic(s: str) -> str:
    """A TOML basic string for any text (control characters as \\uXXXX)."""
    return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else
                         "\\\\" if c == "\\" else '\\"' if c == '"' else c for c in s) + '"'


def toml_value(value: Any, multiline: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if not (isinstance(value, float) and math.isnan(value)) else "nan"
    if isinstance(value, str):
        return basic(value)
    if isinstance(value, list):  # multi-line arrays put elements (even "[models.x]") at line starts
        sep = ",\n" if multiline else ", "
        inner = sep.join(toml_value(v) for v in value)
        return f"[\n{inner}\n]" if multiline else f"[{inner}]"
    assert isinstance(value, dict)
    return "{" + ", ".join(f"{basic(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


@dataclass
class Doc:
    """A TOML file being written, with the line of every key and table header written in it."""

    draw: Any
    chunks: list[str] = field(default_factory=list)
    lines: dict[Key, int] = field(default_factory=dict)
    line_no: int = 1
    starts: list[int] = field(default_factory=list)  # the first line of each statement or comment

    def add(self, text: str, *keys: Key) -> None:
        if self.draw(st.integers(0, 5)) == 0:
            self.add_raw(self.draw(st.sampled_from(DECOYS)))
        for keys_at in keys:
            self.lines.setdefault(keys_at, self.line_no)
        self.add_raw(text)

    def add_raw(self, text: str) -> None:
        self.starts.append(self.line_no)
        self.chunks.append(text + "\n")
        self.line_no += text.count("\n") + 1

    def key(self, name: str) -> str:
        style = self.draw(st.integers(0, 2))
        if style == 0 and BARE.fullmatch(name):
            return name
        if style == 1 and "'" not in name and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
            return f"'{name}'"
        return basic(name)

    def header(self, keys: Key) -> None:
        pad = self.draw(st.sampled_from(["", " "]))
        self.add(f"[{pad}{'.'.join(self.key(k) for k in keys)}{pad}]", keys)

    def pair(self, keys: Key, value: Any) -> None:
        """`key = value`, the value sometimes spread over lines, or a string holding decoy lines."""
        if isinstance(value, str) and value and keys[-1] in ("title", "note") and self.draw(st.booleans()):
            self.add(f"{self.key(keys[-1])} = '''\n[models.decoy]\nfile = \"../x.gguf\"\n'''", keys)
            return
        text = toml_value(value, multiline=isinstance(value, list) and self.draw(st.booleans()))
        if isinstance(value, dict):  # an inline table: its keys are written on the same line
            self.add(f"{self.key(keys[-1])} = {text}", keys, *((*keys, k) for k in value))
        else:
            self.add(f"{self.key(keys[-1])} = {text}", keys)

    def table(self, keys: Key, body: dict[str, Any]) -> None:
        """A [table] with its keys; sub-tables inline, as dotted keys, or as [sub] tables after it."""
        self.header(keys)
        later = []
        for name, value in body.items():
            style = self.draw(st.sampled_from(["inline", "dotted", "table"])) if isinstance(value, dict) else ""
            if style == "table" or (style == "dotted" and not value):
                later.append((name, value))
            elif style == "dotted":
                for sub, v in value.items():  # the first of these lines is where the table is written
                    self.add(f"{self.key(name)} . {self.key(sub)} = {toml_value(v)}", (*keys, name, sub),
                             (*keys, name))
            else:
                self.pair((*keys, name), value)
        for name, value in later:
            self.table((*keys, name), value)

    def line_of(self, keys: Key) -> int | None:
        """Where the key is written, or else its nearest enclosing table."""
        while keys and keys not in self.lines:
            keys = keys[:-1]
        return self.lines.get(keys)

    def text(self) -> str:
        return "".join(self.chunks)


def render(draw: Any, data: dict[str, Any]) -> Doc:
    doc = Doc(draw)
    for name, value in data.items():  # top-level keys come before any [table]
        if name not in ("models", "pairs") or not isinstance(value, dict):
            doc.pair((name,), value)
    for section in ("models", "pairs"):
        tables = data.get(section)
        if not isinstance(tables, dict):
            continue
        plain = {name: body for name, body in tables.items() if not isinstance(body, dict)}
        if plain:
            doc.header((section,))
            for name, value in plain.items():
                doc.pair((section, name), value)
        for name, body in tables.items():
            if isinstance(body, dict):
                doc.table((section, name), body)
    return doc


names = st.text(min_size=1, max_size=6) | st.sampled_from(["qwen", "qwen2.5-coder", "a b", "x.y", "ünï"])
good_files = (st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True)
              | st.text(st.characters(codec="utf-8", exclude_characters="/\\\0:"), max_size=8)).map(
    lambda stem: stem + ".gguf")
HEX = "0123456789abcdef"
not_strings = st.sampled_from([3, -1, 1.5, True, [1, "a"], ["[models.x]", [2]], {"a": 1}, {}])
not_tables = st.sampled_from([3, "x", True, [1], ["[pairs.y]"]])
BAD_FILES = ["../x.gguf", "..\\x.gguf", "/etc/x.gguf", "a/b.gguf", "a\\b.gguf", "x\0.gguf", "x.bin", "x.gguf.txt",
             "C:x.gguf", "C:\\x.gguf", "\\\\server\\share\\x.gguf", "..", ".", "x.gguf/", "x.gguf/.", "~/x.gguf", ""]
BAD_PLACEHOLDERS = ["p{x}", "p{0}", "p{", "p}", "p{n[0]}", "p{n.foo}", "p{n:q}", "p{n!z}", "p{}"]


@st.composite
def valid_catalogs(draw) -> dict[str, Any]:
    models = {}
    for name in draw(st.lists(names, min_size=1, max_size=3, unique=True)):
        body: dict[str, Any] = {"file": draw(good_files)}
        for optional, values in [("title", st.text(max_size=12)), ("quantization", st.sampled_from(["Q4_K_M", ""])),
                                 ("size", st.integers(1, 2**40))]:
            if draw(st.booleans()):
                body[optional] = draw(values)
        if draw(st.booleans()):
            body["hf"] = {"repo": "org/repo", "file": "sub/dir/x.gguf"}
        if draw(st.booleans()):
            body["pypi"] = {"package": "p-part{n}", "version": "1.0", "parts": draw(st.integers(1, 30)),
                            "member": "p_part{n}/data/part{i:02d}.bin", "sha256": draw(st.text(HEX, min_size=64,
                                                                                               max_size=64))}
        models[name] = dict(sorted(body.items(), key=lambda _: draw(st.integers(0, 9))))  # any key order
    pairs = {}
    for name in draw(st.lists(names, min_size=1, max_size=2, unique=True)):
        pairs[name] = {"target": draw(st.sampled_from(sorted(models))), "draft": draw(st.sampled_from(sorted(models)))}
        if draw(st.booleans()):
            pairs[name]["note"] = draw(st.text(max_size=12))
    return {"default_pair": draw(st.sampled_from(sorted(pairs))), "models": models, "pairs": pairs}


@st.composite
def invalid_catalogs(draw) -> tuple[dict[str, Any], Key]:
    """A valid catalog with one thing wrong, and the dotted key the error must name."""
    data = draw(valid_catalogs())
    model = draw(st.sampled_from(sorted(data["models"])))
    body = data["models"][model]
    pair = draw(st.sampled_from(sorted(data["pairs"])))
    unknown = "".join(data["models"]) + "".join(data["pairs"]) + "-unknown"  # longer than any name
    m, p = ("models", model), ("pairs", pair)
    kind = draw(st.sampled_from(["file missing", "file bad", "field type", "size", "hf", "pypi", "unknown key",
                                 "pair", "default_pair", "models not a table", "model not a table"]))
    if kind == "file missing":
        del body["file"]
        return data, (*m, "file")
    if kind == "file bad":
        body["file"] = draw(st.sampled_from(BAD_FILES) | not_strings)
        return data, (*m, "file")
    if kind == "field type":
        name = draw(st.sampled_from(["title", "quantization"]))
        body[name] = draw(not_strings)
        return data, (*m, name)
    if kind == "size":
        body["size"] = draw(st.sampled_from([0, -3, "1 GB", True, 1.5, [1]]))
        return data, (*m, "size")
    if kind == "hf":
        if draw(st.booleans()):
            body["hf"] = draw(not_tables)
            return data, (*m, "hf")
        hf = body.setdefault("hf", {"repo": "org/repo", "file": "x.gguf"})
        name = draw(st.sampled_from(["repo", "file"]))
        if draw(st.booleans()):
            del hf[name]
        else:
            hf[name] = draw(not_strings | st.just(""))
        return data, (*m, "hf", name)
    if kind == "pypi":
        pypi = body.setdefault("pypi", {"package": "p{n}", "version": "1", "parts": 2, "member": "m{i}",
                                        "sha256": "a" * 64})
        name = draw(st.sampled_from(["package", "version", "parts", "member", "sha256"]))
        if draw(st.integers(0, 3)) == 0:
            del pypi[name]
        elif name == "sha256":
            pypi[name] = draw(st.sampled_from(["a" * 63, "a" * 65, "g" * 64, "", 64, "0x" + "a" * 62]))
        elif name == "parts":
            pypi[name] = draw(st.sampled_from([0, -1, "2", True, 2.5, 10**6]))
        elif name in ("package", "member"):
            pypi[name] = draw(st.sampled_from(BAD_PLACEHOLDERS) | not_strings)
        else:
            pypi[name] = draw(not_strings)
        return data, (*m, "pypi", name)
    if kind == "unknown key":
        tables = {(): data, m: body, p: data["pairs"][pair]}
        tables.update({(*m, sub): body[sub] for sub in ("hf", "pypi") if sub in body})
        where = draw(st.sampled_from(sorted(tables)))
        name = draw(st.sampled_from(["fiel", "Title", "sha265", "x", "default-pair", " ", ""]))
        tables[where][name] = draw(st.integers() | st.text(max_size=4))
        return data, (*where, name)
    if kind == "pair":
        role = draw(st.sampled_from(["target", "draft", "note"]))
        if role == "note":
            data["pairs"][pair]["note"] = draw(not_strings)
        elif role == "target" and draw(st.booleans()):  # a pair may leave out its draft (lookup only)
            del data["pairs"][pair][role]
        else:
            data["pairs"][pair][role] = draw(st.just(unknown) | not_strings)
        return data, (*p, role)
    if kind == "default_pair":
        if draw(st.booleans()):
            del data["default_pair"]
        else:
            data["default_pair"] = draw(st.just(unknown) | st.sampled_from([3, [1], {"a": 1}, ""]))
        return data, ("default_pair",)
    if kind == "models not a table":
        data["models"] = draw(not_tables)
        return data, ("models",)
    data["models"][model] = draw(not_tables)
    return data, m


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("props")


def write(folder: Path, text: str | bytes) -> Path:
    path = folder / "models.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@PROPS
@given(data=st.data())
def test_every_invalid_catalog_names_its_file_line_and_key(folder, data):
    catalog, wrong = data.draw(invalid_catalogs())
    doc = render(data.draw, catalog)
    path = write(folder, doc.text())
    with pytest.raises(SpecchatError) as caught:
        load_catalog(path)
    message = str(caught.value)
    line = doc.line_of(wrong)
    where = f"{path} line {line}" if line else str(path)
    assert "\n" not in message
    assert message.startswith(f"{where}: {dotted_key(wrong)} "), (doc.text(), message)
    tally("bad input: models.toml + config", inputs=1)


@FEW
@given(data=st.data())
def test_valid_catalogs_load_and_every_key_is_located(folder, data):
    catalog = data.draw(valid_catalogs())
    doc = render(data.draw, catalog)
    text = doc.text()
    loaded = load_catalog(write(folder, text))
    assert sorted(loaded.models) == sorted(catalog["models"]) and loaded.default_pair == catalog["default_pair"]
    for keys, line in doc.lines.items():
        assert key_line(text, keys) == line, (text, keys)
        # The key as messages write it is TOML for exactly that key.
        nested = tomllib.loads(f"{dotted_key(keys)} = 1")
        for k in keys:
            nested = nested[k]
        assert nested == 1
    tally("bad input: models.toml + config", inputs=1)


TRICKY = r'''# [models.a] in a comment
title = """ends in two quotes"""""
x = 'C:\path\' # a literal string ending in a backslash
"q\u0075oted" = 1
[ models . "a.b" ]
file = "x.gguf"
arr = [
  [1, 2],
  "[models.c]",  # a comment
]
inline = { deep = { er = 1 }, s = "}" }
dt = 1979-05-27 07:32:00Z
[[runs]]
n = 1
[models.'c']
pypi.sha256 = "0"
'''


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("keys, line", [
    (("title",), 2), (("x",), 3), (("quoted",), 4), (("models", "a.b"), 5), (("models", "a.b", "file"), 6),
    (("models", "a.b", "arr"), 7), (("models", "a.b", "inline", "deep", "er"), 11), (("models", "a.b", "dt"), 12),
    (("runs", "n"), 14), (("models", "c"), 15), (("models", "c", "pypi", "sha256"), 16),
    (("models", "c", "pypi"), 16), (("models", "c", "file"), 15), (("models", "a.b", "size"), 5), (("nothing",), None),
])
def test_key_line_finds_keys_past_strings_comments_and_arrays(keys, line, newline):
    text = TRICKY.replace("\n", newline)
    tomllib.loads(text)  # the locator is only ever given text that parses
    assert key_line(text, keys) == line


BREAKERS = ["= 1", "[models", "x = ", 'a = "unterminated', "[[]]", "k = 1 2", "\x01", "[models.x]\n[models.x]",
            "k = [1,", "k = {a = 1", "'''"]


@FEW
@given(data=st.data(), breaker=st.sampled_from(BREAKERS))
def test_invalid_toml_keeps_tomllib_position(folder, data, breaker):
    doc = render(data.draw, data.draw(valid_catalogs()))
    lines = doc.text().split("\n")
    # Between statements: inside a multi-line string the breaker would just be text.
    lines.insert(data.draw(st.sampled_from(doc.starts)) - 1, breaker)
    path = write(folder, "\n".join(lines))
    with pytest.raises(SpecchatError) as caught:
        load_catalog(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: invalid TOML: ")
    at = re.search(r"\(at line (\d+), column \d+\)$|\(at end of document\)$", message)
    assert at and (at.group(1) is None or 1 <= int(at.group(1)) <= len(lines) + breaker.count("\n")), message
    tally("bad input: models.toml + config", inputs=1)


# Any file at all: TOML-ish text, any text, or bytes that are not UTF-8.
any_files = (st.text(st.sampled_from('[]{}="\'.,#\n abx1') | st.characters(codec="utf-8"), max_size=60)
             | st.binary(max_size=30))


@PROPS
@given(text=any_files)
def test_any_catalog_file_loads_or_fails_in_one_line(folder, text):
    path = write(folder, text)
    try:
        load_catalog(path)
    except SpecchatError as e:  # the only exception a user may see
        assert "\n" not in str(e) and str(path) in str(e)
    if isinstance(text, str):  # the locator, even on text that does not parse, answers a line or None
        line = key_line(text, ("models", "a", "file"))
        assert line is None or 1 <= line <= text.count("\n") + 1
    tally("bad input: models.toml + config", inputs=1)


@pytest.mark.parametrize("content", [b"\xff\xfe default_pair", "x = " + "[" * 5000, None])
def test_unreadable_catalogs_fail_in_one_line(folder, content):
    path = folder if content is None else write(folder, content)  # None: a directory
    with pytest.raises(SpecchatError, match=re.escape(str(path))) as caught:
        load_catalog(path)
    assert "\n" not in str(caught.value)


# --- catalog file names never leave the models directory -------------------------------------

def catalog_with_file(file: str) -> str:
    return f'default_pair = "p"\n[models.m]\nfile = {basic(file)}\n[pairs.p]\ntarget = "m"\ndraft = "m"\n'


@pytest.mark.parametrize("file", BAD_FILES)
def test_file_names_that_could_leave_the_models_directory_are_refused(folder, file):
    path = write(folder, catalog_with_file(file))
    with pytest.raises(SpecchatError, match=re.escape(f"{path} line 3: models.m.file must be")):
        load_catalog(path)


@PROPS
@given(file=st.lists(st.sampled_from(["..", ".", "/", "\\", "\0", "C:", ":", "x", "gguf", ".gguf", "~", " ", "é"]),
                     max_size=6).map("".join) | st.text(max_size=12) | good_files)
def test_accepted_file_names_stay_inside_the_models_directory(folder, file):
    path = write(folder, catalog_with_file(file))
    try:
        entry = load_catalog(path).model("m")
    except SpecchatError as e:
        assert str(e).startswith(f"{path} line 3: models.m.file must be")
    else:
        assert entry.file == file and file.endswith(".gguf") and not set(file) & {"/", "\\", "\0"}
        with mock.patch.dict(os.environ, {"SPECCHAT_MODELS_DIR": str(folder / "models")}):
            home = models_dir().resolve()
            for name in (entry.file, f".{entry.file}.123.partial"):  # fetch.py's final and partial names
                assert (models_dir() / name).resolve().parent == home
                assert (models_dir() / name).resolve().is_relative_to(home)
    tally("bad input: models.toml + config", inputs=1)


# --- config.toml -------------------------------------------------------------------------------

def _float(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.floats(lo, hi) | st.integers(math.ceil(lo), math.floor(hi))


# Per setting: values it accepts, and values it must refuse (falling back to the default).
SETTINGS: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]] = {
    "system_prompt": (st.text(max_size=20), not_strings),
    "temperature": (_float(0, 5), st.floats(max_value=-1e-9) | st.sampled_from([math.nan, "0.7", True, [1], {}])),
    "top_p": (st.floats(0, 1, exclude_min=True) | st.just(1), st.sampled_from([0, 0.0, 1.5, -1, math.nan, "1"])),
    "top_k": (st.integers(0, 10**6), st.sampled_from([-1, 1.0, 2.5, "3", True])),
    "min_p": (st.floats(0, 1, exclude_max=True) | st.just(0), st.sampled_from([1, 1.0, -0.1, math.nan, False])),
    "max_tokens": (st.integers(1, 10**9), st.sampled_from([0, -5, 512.0, "512"])),
    "guesser": (st.sampled_from(list(GUESSERS)), st.sampled_from(["psychic", "", "AUTO"]) | not_strings),
    "draft_length": (st.integers(0, 32), st.sampled_from([-1, 33, 4.0, "4"])),
    "pair": (st.text(max_size=10), not_strings),
    "offline": (st.booleans(), st.sampled_from([0, 1, "true", "yes", [True]])),
    "context": (st.integers(256, 1 << 20), st.sampled_from([0, 255, 1 << 21, 4096.0, "4096", True])),
    "threads": (st.integers(0, 1024), st.sampled_from([-1, 1025, 2.0, "2", True])),
    "gpu_layers": (st.integers(-1, 10_000), st.sampled_from([-2, 10_001, 1.0, "all", False])),
    "draft_gpu_layers": (st.integers(-1, 10_000), st.sampled_from([-2, 10_001, 1.0, "all", False])),
    "theme": (st.text(max_size=10), not_strings),
    "server": (st.sampled_from(["", "http://127.0.0.1:8080", "https://gpu.example:8000/v1"]),
               st.sampled_from(["localhost:8080", "ftp://x", "gpu.example"]) | not_strings),
    "seed": (st.integers(-1, 2**63 - 1), st.sampled_from([-2, 2**63, 7.0, "7", True])),
    "thinking": (st.sampled_from(["default", "on", "off"]), st.sampled_from(["maybe", "", "ON", 1, True])),
    "tool_rounds": (st.integers(0, 32), st.sampled_from([-1, 33, 4.0, "4", True])),
}


@st.composite
def config_files(draw) -> tuple[Doc, dict[str, Any], list[str]]:
    """A config file, the settings it should give, and the keys that must be reported, in order."""
    doc, expected, reported = Doc(draw), {}, []
    unknown = st.text(min_size=1, max_size=8).filter(lambda k: k not in SETTINGS)
    keys = draw(st.lists(st.sampled_from(sorted(SETTINGS)) | unknown, unique=True, max_size=8))
    for key in keys:
        if key not in SETTINGS:
            doc.pair((key,), draw(st.integers() | st.text(max_size=5)))
            reported.append(key)
            continue
        good, bad = SETTINGS[key]
        if draw(st.booleans()):
            value = draw(good)
            expected[key] = float(value) if isinstance(getattr(Settings(), key), float) else value
        else:
            value = draw(bad)
            reported.append(key)
        doc.pair((key,), value)
    return doc, expected, reported


@PROPS
@given(case=config_files())
def test_bad_settings_fall_back_per_key_naming_line_and_key(folder, case):
    assert sorted(SETTINGS) == sorted(f.name for f in fields(Settings)), "a new setting needs its values here"
    doc, expected, reported = case
    path = folder / "config.toml"
    path.write_text(doc.text(), encoding="utf-8")
    loaded, problems = load_settings(path)
    assert loaded == Settings(**expected)
    assert len(problems) == len(reported)
    for key, problem in zip(reported, problems):
        assert "\n" not in problem and problem.startswith(f"{path} line {doc.lines[(key,)]}: ")
        assert key in problem or repr(key) in problem
    tally("bad input: models.toml + config", inputs=1)


@PROPS
@given(text=any_files)
def test_load_settings_never_raises(folder, text):
    path = folder / "config.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    loaded, problems = load_settings(path)
    assert isinstance(loaded, Settings) and all("\n" not in p and str(path) in p for p in problems)
    tally("bad input: models.toml + config", inputs=1)
