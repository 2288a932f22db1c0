"""Where auto (specchat.decoding.guessers.auto) copies from: the passage of the context that an answer copies,
and copies that part ways, sent together as one tree. Auto prices them; these only find and keep track."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, NamedTuple, Sequence

import numpy as np

from specchat.decoding.guessers.copying import matches
from specchat.decoding.verify import Tree

if TYPE_CHECKING:
    from specchat.decoding.history import HistoryIndex


@dataclass(frozen=True)
class Copy:
    """A place auto copies from: the context's own text from `start` ("lookup"), or the user's past
    conversations ("history"), with the kind of match behind it and its length, by which its guesses'
    acceptance is estimated. Kinds of lookup, kept apart: "far", the longest earlier match anywhere;
    "near", one that continues where the last guess left off, in the passage being copied (even a 1-token
    match there usually holds); "substitute", after the target replaced some copied text, copying on after
    that text."""

    source: str  # "lookup" or "history"
    start: int  # where in the context a lookup reads (0 for the history)
    kind: str  # "far", "near", "substitute", or "history"
    m: int  # the match length


class Found(NamedTuple):
    """A copy found this step and the tokens it would guess."""

    copy: Copy
    tokens: list[int]


class Offer(NamedTuple):
    """A copy offered this step: the tokens it would guess, cut to the length worth sending, each one's
    acceptance, and the rate (expected tokens per second) it would make sent alone."""

    copy: Copy
    tokens: list[int]
    alphas: np.ndarray
    rate: float


class Origins(NamedTuple):
    """Where a copy's guesses come from, where some are what the answer writes for a span of the passage."""

    positions: list[int]  # each guess's place in the context (a written span's guesses: where the span begins)
    swaps: list[tuple[int, ...] | None]  # the passage span that a guess is written for, if any
    end: int  # where the copy goes on after its last guess

    def at(self, j: int) -> int:
        """Where in the context the copy goes on after its first j guesses."""
        return self.positions[j] if j < len(self.positions) else self.end


class Swaps:
    """Spans of the passage that this answer writes as others: a renamed identifier, a changed name or date, a
    respelling. Each is learnt from the text where the target replaced a copied token and the answer then went
    on with the passage; later copies write it in their place, so that an edit seen once no longer ends every
    copy that reaches its words again. One that a step rejects is dropped: the answer does not make it there."""

    MOST = 4  # tokens on either side of a swap
    AGREE = 2  # tokens after it that the answer and the passage must share

    def __init__(self) -> None:
        self.written: dict[tuple[int, ...], tuple[int, ...]] = {}  # a passage span -> what the answer writes
        self._open: tuple[int, int] | None = None  # a replacement to resolve: (passage position, answer position)

    def replaced(self, source: int, at: int) -> None:
        """The target wrote context[at] where a copy guessed the passage's token at `source`."""
        self._open = (source, at)

    def learn(self, context: Sequence[int]) -> None:
        """The open replacement as a swap, once the answer goes on with the passage after it: the fewest tokens
        on either side (then as many on each) after which AGREE tokens of the answer are the passage's. Given up
        once the answer is past every length it could have."""
        if self._open is None:
            return
        source, at = self._open
        n, most, agree = len(context), self.MOST, self.AGREE
        for total in range(2, 2 * most + 1):
            for a in sorted(range(max(1, total - most), min(most, total - 1) + 1), key=lambda a: abs(2 * a - total)):
                b = total - a
                if at + b + agree <= n and source + a + agree <= at and all(
                        int(context[at + b + j]) == int(context[source + a + j]) for j in range(agree)):
                    self._open = None
                    self.add(tuple(int(t) for t in context[source:source + a]), tuple(int(t) for t in context[at:at + b]))
                    return
        if n >= at + most + agree:
            self._open = None

    def add(self, span: tuple[int, ...], wrote: tuple[int, ...]) -> None:
        """From now on, copies write `wrote` where the passage has `span`."""
        if span != wrote:
            self.written[span] = wrote

    def drop(self, span: tuple[int, ...]) -> None:
        self.written.pop(span, None)

    def apply(self, context: Sequence[int], start: int, k: int) -> tuple[list[int], Origins]:
        """The k guesses of a copy from `start`, each span this answer writes as another written so, and where
        each comes from."""
        tokens: list[int] = []
        positions: list[int] = []
        swaps: list[tuple[int, ...] | None] = []
        j, n, firsts = start, len(context), {span[0] for span in self.written}
        while len(tokens) < k and j < n:
            span = self._at(context, j) if int(context[j]) in firsts else None
            if span is None:
                tokens.append(int(context[j]))
                positions.append(j)
                swaps.append(None)
                j += 1
            else:
                wrote = self.written[span]
                tokens += wrote
                positions += [j] * len(wrote)
                swaps += [span] * len(wrote)
                j += len(span)
        end = positions[k] if len(tokens) > k else j
        return tokens[:k], Origins(positions[:k], swaps[:k], end)

    def _at(self, context: Sequence[int], j: int) -> tuple[int, ...] | None:
        """The longest span with a swap that the context holds from j."""
        found = None
        for span in self.written:
            if (found is None or len(span) > len(found)) and j + len(span) <= len(context) and all(
                    int(context[j + i]) == t for i, t in enumerate(span)):
                found = span
        return found


class Passage:
    """Where in the context to copy from: the longest earlier match; among equals, the one nearest after
    where the answer was last copying from, else the latest. In a passage that the answer copies with edits,
    the text after an edit is there, not at the latest " the" or "    return"."""

    def __init__(self, max_match: int = 32, window: int = 8, piece: Callable[[int], bytes] | None = None) -> None:
        self.max_match, self.window = max_match, window
        self.piece = piece  # a token's text, to see how much of the copied text the target replaced
        self.cursor: int | None = None  # where in the context the answer was last copying from
        self.replaced: int | None = None  # the copied token that the target just replaced, if any
        self.matches: tuple[np.ndarray, np.ndarray] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        self.prompt_end = 0  # where the answer began: copies before it are from the prompt
        self.swaps = Swaps()  # spans of the passage that this answer writes as others
        self._origins: dict[int, Origins] = {}  # per copy sent this step, by its start: where its guesses come from
        self._scanned = 0  # the context up to here has been looked at for tokens with no text
        self._structure: int | None = None  # just after the latest of them (None: none within max_match)

    def restart(self, prompt_end: int = 0) -> None:
        """A new generation, after a prompt this long: nothing is being copied yet."""
        self.cursor = self.replaced = None
        self.prompt_end = prompt_end
        self.swaps = Swaps()
        self._scanned, self._structure = max(0, prompt_end - self.max_match), None  # no match reaches further back

    def reach(self, context: Sequence[int]) -> int:
        """How far back a match may run. llama.cpp gives a chat template's control tokens (`<|im_start|>`,
        `<|im_end|>`) no text: they and the role line after them are structure that every message shares, not
        content. So a match stops at the latest token with no text, and where that is in the prompt, the header
        from it to the answer (`assistant\n`) counts as one token. Without this, a chat's second answer opened on a
        6-token match, `<|im_end|>\n<|im_start|>assistant\n` that the first answer followed too, and its first
        guess copied the first answer's opening; the miss spent the loss budget's room for the next 25 tokens.
        Raw text (no control tokens), or no tokens' text (`piece`): a match runs up to max_match back."""
        if self.piece is None:
            return self.max_match
        if len(context) < self._scanned:  # not the context the last steps extended: look again
            self._scanned, self._structure = max(0, len(context) - self.max_match), None
        for i in range(self._scanned, len(context)):
            if not self.piece(int(context[i])):
                self._structure = i + 1
        self._scanned = len(context)
        if self._structure is None:
            return self.max_match
        start = self.prompt_end - 1 if self._structure <= self.prompt_end else self._structure
        return min(self.max_match, len(context) - start)

    def guesses(self, context: Sequence[int], copy: Copy, k: int) -> list[int]:
        """What a copy would guess: the k tokens from its start, with what this answer writes for them."""
        if not self.swaps.written:
            return [int(t) for t in context[copy.start:copy.start + k]]
        tokens, self._origins[copy.start] = self.swaps.apply(context, copy.start, k)
        return tokens

    def find(self, context: Sequence[int]) -> Copy | None:
        if self.replaced is not None:
            self.swaps.replaced(self.replaced, len(context) - 1)
        self.swaps.learn(context)
        self._origins = {}
        ends, lengths = self.matches = matches(context, self.reach(context))
        source = None
        if len(ends):
            near = np.zeros(len(ends), dtype=bool)
            if self.cursor is not None:
                near = (ends >= self.cursor) & (ends <= self.cursor + self.window)
            # The last key sorts first: length, then near, then nearest the cursor or latest.
            best = int(np.lexsort((np.where(near, -ends, ends), near, lengths))[-1])
            source = Copy("lookup", int(ends[best]), "near" if near[best] else "far", int(lengths[best]))
        if self.replaced is not None and (source is None or source.kind != "near"):
            # The last guess was rejected inside a copy and nothing near matches the target's own
            # token: assume it replaced the copied text (a renamed identifier, a fixed word).
            resume = self._resume_after(context, self.replaced)
            if resume < len(context) - 1:
                source = Copy("lookup", resume, "substitute", 1)
        self.replaced = None
        return source

    def place(self, context: Sequence[int], copy: Copy) -> tuple[float, bool, int]:
        """What a copy found by the last `find` says by its place (policy.PlaceShift): the share of the earlier
        places that match as long as it does and go on with its token, whether it copies from the prompt, and
        how far back it is."""
        ends, lengths = self.matches
        alike = ends[lengths == copy.m]
        token = int(context[copy.start])
        agree = sum(int(context[end]) == token for end in alike) / len(alike) if len(alike) else 1.0
        return agree, copy.start < self.prompt_end, len(context) - copy.start

    def _resume_after(self, context: Sequence[int], replaced: int) -> int:
        """Where copying resumes after the target wrote context[-1] instead of context[replaced]:
        after the 1 to 3 copied tokens whose text is about as long as what the target wrote.
        A fixed typo is often one token for two (" availble" is " avail" "ble"; " available"
        is one token); a renamed identifier is one for one."""
        if self.piece is None:
            return replaced + 1
        wrote = len(self.piece(context[-1]))
        best, best_gap, copied = replaced + 1, None, 0
        for end in range(replaced + 1, min(replaced + 4, len(context) - 1)):
            copied += len(self.piece(context[end - 1]))
            gap = abs(copied - wrote)
            if best_gap is None or gap < best_gap:
                best, best_gap = end, gap
        return best

    def landed(self, start: int, drafted: int, accepted: int) -> None:
        """A copy from `start` had `accepted` of its `drafted` guesses kept. Only a guess that landed at
        least once shows where the answer copies from: a first-token miss may just be the wrong occurrence,
        and following it would drift off the passage."""
        origins = self._origins.get(start)
        if accepted:
            self.cursor = origins.at(accepted) if origins else start + accepted
        self.replaced = self.cursor if 0 < accepted < drafted else None
        swap = origins.swaps[accepted] if origins and accepted < drafted else None
        if swap is not None:  # the answer does not write it so here: a rename that is not everywhere
            self.swaps.drop(swap)
            self.replaced = None

    def other(self, context: Sequence[int], firsts: set[int]) -> Copy | None:
        """The longest (then latest) earlier match of the last context that goes on with none of `firsts`."""
        ends, lengths = self.matches
        other = [i for i in range(len(ends)) if int(context[ends[i]]) not in firsts]
        if not other:
            return None
        i = max(other, key=lambda j: (lengths[j], ends[j]))
        return Copy("lookup", int(ends[i]), "far", int(lengths[i]))


def copies(context: Sequence[int], k: int, passage: Passage, history: HistoryIndex | None) -> Iterator[Found]:
    """Every place to copy from, and what it would guess: the context's own text first (of two copies
    with one first token, a tree keeps the first), then the history."""
    if k <= 0:
        return
    copy = passage.find(context)
    if copy is not None:
        yield Found(copy, passage.guesses(context, copy, k))
    if history is not None:
        tokens, m = history.propose(context, k)
        yield Found(Copy("history", 0, "history", m), tokens)


def branches(offers: Sequence[Offer], most: int) -> list[Offer]:
    """At most `most` offers, one per first token: deterministic siblings must differ."""
    kept: list[Offer] = []
    for offer in offers:
        if offer.tokens[0] not in {other.tokens[0] for other in kept} and len(kept) < most:
            kept.append(offer)
    return kept


def as_tree(chains: Sequence[list[int]]) -> Tree:
    """Copies that differ from their first token on, each a chain under the root."""
    flat: list[int] = []
    parents: list[int] = []
    for tokens in chains:
        parents += [-1, *range(len(flat), len(flat) + len(tokens) - 1)]
        flat += tokens
    return Tree(tuple(flat), tuple(parents), (None,) * len(flat))


@dataclass(frozen=True)
class SentTree:
    """Copies sent as one tree: where it started in the context, and per branch the copy, its first token
    and how many it drafted. Which branch held is read from the context at the next step."""

    at: int
    branches: tuple[tuple[Copy, int, int], ...]

    @classmethod
    def of(cls, at: int, offers: Sequence[Offer]) -> SentTree:
        """These offers sent as one tree at context position `at`."""
        return cls(at, tuple((offer.copy, offer.tokens[0], len(offer.tokens)) for offer in offers))

    def outcomes(self, context: Sequence[int], accepted: int) -> list[tuple[Copy, int, int]]:
        """Each branch's copy, drafted and kept, now that the context shows which one held: that one kept
        what the step kept, the others nothing. The one that held comes last: a copy that missed must not
        undo where the one that held left off."""
        held = int(context[self.at]) if accepted and self.at < len(context) else None
        return [(copy, drafted, accepted if first == held else 0)
                for copy, first, drafted in sorted(self.branches, key=lambda b: b[1] == held)]


@dataclass(frozen=True)
class Unsent:
    """Copies found but not sent, and where the context ended then: the next step's context shows whether
    they would have held, evidence that costs nothing."""

    at: int = 0
    found: tuple[Found, ...] = ()

    def outcomes(self, context: Sequence[int]) -> list[tuple[Copy, int, int]]:
        """What each copy would have made of the step, as (copy, drafted, kept): the context now holds the
        tokens that step committed, and a copied token is kept exactly when it equals the committed one
        (greedy or sampled: the exact rule keeps a point mass where the target's draw lands on it). So every
        copy auto passes up is judged for free, and an estimate that ruled copying out learns when the
        answer starts to copy, instead of waiting to drift back to its prior."""
        committed = [int(t) for t in context[self.at:]] if self.at <= len(context) else []
        judged = []
        for copy, tokens in self.found:
            n = min(len(tokens), len(committed))
            if n:
                judged.append((copy, n, next((j for j in range(n) if tokens[j] != committed[j]), n)))
        return judged
