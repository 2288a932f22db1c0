"""Constrained decoding: a grammar's token masks over the target's distribution (llguidance).

A `Constraint` is a grammar compiled for one vocabulary; each generation starts its own `Matcher` from it,
which follows the tokens the answer commits. Within a step the matcher also walks the guesses, to give the
mask at every position the target verifies, and takes them back again: the rule then judges each guess
against the target's distribution restricted to what the grammar allows there (`sampling.masked`), so what
comes out is distributed exactly as the constrained target alone would produce it, whatever was guessed.

llguidance is imported here only: a generation without a constraint never loads it.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Sequence

import llguidance
import numpy as np

from specchat.errors import SpecchatError

if TYPE_CHECKING:
    from specchat.decoding.verify import Tree
    from specchat.llama.model import Model

# One tokenizer per vocabulary: llguidance reads every token's bytes (about a second for 150k tokens).
_TOKENIZERS: dict[str, llguidance.LLTokenizer] = {}


def tokenizer_of(model: Model) -> llguidance.LLTokenizer:
    """llguidance's view of a loaded model's vocabulary, its end-of-generation tokens as the grammar's end
    (so that an answer may end only where the grammar accepts). Cached by the model's file."""
    key = f"{model.path.resolve()}|{model.n_vocab}"
    if key not in _TOKENIZERS:
        import llguidance.llamacpp  # imports llama_cpp, which a loaded Model has already

        eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
        with warnings.catch_warnings():  # llguidance reads each token with a binding llama-cpp-python deprecates:
            warnings.simplefilter("ignore", DeprecationWarning)  # 150k warnings a vocabulary, and each costs time
            _TOKENIZERS[key] = llguidance.llamacpp.lltokenizer_from_vocab(model.vocab, eos_token=eog or None)
    return _TOKENIZERS[key]


class Constraint:
    """A grammar (llguidance's: Lark with `%json{…}` for JSON schemas, or what `grammar_from` makes) over one
    tokenizer's tokens. `name` says what it asks for, in messages."""

    def __init__(self, grammar: str, tokenizer: llguidance.LLTokenizer, name: str = "the grammar") -> None:
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error and not error.startswith("WARNING"):
            raise SpecchatError(f"{name} cannot be compiled: {error.strip().splitlines()[0]}")
        self.grammar, self.tokenizer, self.name = grammar, tokenizer, name
        self._compiled: llguidance.LLMatcher | None = None

    @classmethod
    def lark(cls, source: str, tokenizer: llguidance.LLTokenizer, name: str = "the grammar") -> Constraint:
        return cls(llguidance.LLMatcher.grammar_from_lark(source), tokenizer, name)

    def start(self) -> Matcher:
        """A matcher at the answer's start, for one generation: a copy of one compiled the first time (compiling
        a JSON schema's grammar takes milliseconds; a copy, microseconds)."""
        if self._compiled is None:
            self._compiled = llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0)
        return Matcher(self._compiled.deep_copy(), self.tokenizer.vocab_size, self.name,
                       frozenset(self.tokenizer.eos_tokens))


class Matcher:
    """Where one answer stands in the grammar: the tokens it has consumed, the mask for the next."""

    def __init__(self, matcher: llguidance.LLMatcher, n_vocab: int, name: str, ends: frozenset[int]) -> None:
        self._m, self.n_vocab, self.name = matcher, n_vocab, name
        # The end tokens are never consumed: nothing follows one (the answer ends there), and llguidance 1.9
        # does not count one it consumed when rolling back, so that rollback(n) past it takes back a token
        # too many (and the matcher would go on from a state the answer is not in).
        self.ends = ends
        self.consumed = 0  # tokens taken and not rolled back: the answer so far, while no step is under way
        self._check()

    def _check(self) -> None:
        if self._m.is_error():
            raise SpecchatError(f"{self.name} failed: {self._m.get_error().strip().splitlines()[0]}")

    def allowed(self) -> np.ndarray:
        """(n_vocab,) bool: the tokens the grammar allows next (an end-of-generation token only where it
        accepts)."""
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.n_vocab].astype(bool)

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` the grammar takes in a row from here (nothing is consumed)."""
        return int(self._m.validate_tokens([int(t) for t in tokens])) if len(tokens) else 0

    def after(self, tokens: Sequence[int]) -> np.ndarray:
        """What the grammar allows after `tokens` from here (then taken back); nothing where it refuses them.
        A drafter's masks (`guessers.base.Allowed`)."""
        if self.valid_prefix(tokens) < len(tokens) or self.ends.intersection(tokens):
            return np.zeros(self.n_vocab, dtype=bool)
        self.consume(tokens)
        try:
            return self.allowed()
        finally:
            self.rollback(len(tokens))

    def consume(self, tokens: Sequence[int]) -> None:
        """Take the answer's next tokens (not an end token: see `ends`)."""
        for t in tokens:
            if int(t) in self.ends:
                raise SpecchatError(f"{self.name}: an end token ({int(t)}) is never consumed; the answer ends there")
            if not self._m.consume_token(int(t)):
                raise SpecchatError(f"{self.name} refused token {int(t)}, which its own mask allowed: "
                                    f"{self._m.get_error().strip()[:200]}")
            self.consumed += 1

    def rollback(self, n: int) -> None:
        if n:
            if n > self.consumed or not self._m.rollback(n):
                raise SpecchatError(f"{self.name} could not take back {n} tokens ({self.consumed} consumed)")
            self.consumed -= n

    def masks(self, tree: Tree) -> np.ndarray:
        """(nodes + 1, n_vocab) bool, in the rows the rule reads: row 0 what may follow the answer so far, row
        i + 1 what may follow node i's path. The matcher walks each path and comes back to where it was. A
        node the grammar refuses can never be accepted (the target gives it probability 0), and after an end
        token the answer is over, so what follows either is never read: its row allows everything."""
        rows = np.ones((len(tree.tokens) + 1, self.n_vocab), dtype=bool)
        rows[0] = self.allowed()
        base, walked = self.consumed, []  # the path the matcher stands on, from the answer so far
        try:
            for i in range(len(tree.tokens)):
                path = [tree.tokens[n] for n in tree.path(i)]
                same = next((j for j, (a, b) in enumerate(zip(walked, path)) if a != b), min(len(walked), len(path)))
                self.rollback(len(walked) - same)
                walked = walked[:same]
                rest = path[same:]
                if self.valid_prefix(rest) < len(rest) or self.ends.intersection(rest):
                    continue
                self.consume(rest)
                walked = path
                rows[i + 1] = self.allowed()
        finally:
            self.rollback(self.consumed - base)
        return rows
