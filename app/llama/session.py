"""The cache of one llama.cpp context, for one sequence, with a rewind that works on every memory.

`Session.tokens` mirrors the cache exactly: every decode and rewind updates both or neither, so an
interrupted generation never leaves them out of step, and the next generation reuses the longest
common prefix. How a rewind is done depends on the memory the model has:

- TRIM: attention caches (full-size sliding windows included) drop positions from the end at any
  depth (`llama_memory_seq_rm`).
- ROLLBACK: recurrent and hybrid models whose llama.cpp keeps a few snapshots of the recurrent state
  (Qwen3.5, LFM2, Nemotron-H...) step back by up to that many positions, inside the last decode only.
- CHECKPOINT: recurrent state is a running summary with no history (Mamba, RWKV, most hybrids, and any
  rewind deeper than the snapshots): the state is saved where a rewind may come back to (before a
  verification, at the ends of a prompt), and a rewind restores the nearest saved state at or before
  its target, cuts the attention part there and decodes the tokens from there again.

Followers (a model's MTP head) see every decode and rewind of the cache they follow.
"""

from __future__ import annotations

import ctypes
import enum
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, Sequence

import llama_cpp
import numpy as np

from specchat.errors import ContextFull, SpecchatError
from specchat.llama.cores import FITTER

if TYPE_CHECKING:
    from specchat.llama.model import Model

# The recurrent part alone (a hybrid's attention part is cut by llama_memory_seq_rm after a restore):
# its size does not grow with the context. For a pure recurrent model it is the whole state.
_PARTIAL = llama_cpp.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
LASTING_CHECKPOINTS = 4  # turn boundaries kept for regenerate, an edit of a recent message and the next turns


def is_chain(parents: Sequence[int]) -> bool:
    """Whether guesses with these parents (-1: after the pending token) form one branch, node i after i - 1."""
    return all(parent == i - 1 for i, parent in enumerate(parents))


def tree_layout(parents: Sequence[int], leaves: Sequence[int]) -> tuple[list[int], list[set[int]]]:
    """Each node's depth (0: right after the pending token) and the sequences it is in: each leaf's path is one,
    numbered as `leaves` orders them, so a node is in those of the leaves below it."""
    depth = [0] * len(parents)
    seqs: list[set[int]] = [set() for _ in parents]
    for s, leaf in enumerate(leaves):
        node = leaf
        while node != -1:
            seqs[node].add(s)
            node = parents[node]
    for i, parent in enumerate(parents):
        depth[i] = 0 if parent == -1 else depth[parent] + 1
    return depth, seqs


class Memory(enum.Enum):
    TRIM = "trim"
    ROLLBACK = "rollback"
    CHECKPOINT = "checkpoint"
    RESTART = "restart"  # a state llama.cpp can neither cut nor save: a rewind decodes from the start


@dataclass(frozen=True)
class Checkpoint:
    pos: int  # the state after tokens[:pos]
    data: ctypes.Array  # llama.cpp's serialized sequence state


@dataclass
class RewindStats:
    """What rewinds cost this session (for `specchat costs`, the cost model and the tests)."""

    checkpoints: int = 0
    checkpoint_s: float = 0.0
    checkpoint_bytes: int = 0  # the size of the last one
    restores: int = 0
    restore_s: float = 0.0  # loading states, not the replays
    replayed: int = 0  # tokens decoded again after a restore


class Follower(Protocol):
    """Something that keeps a cache of its own in step with a session's (an MTP head)."""

    def decoded(self, tokens: Sequence[int], pos: int) -> None:
        """`tokens` were just decoded at positions pos, pos + 1, ... (one llama_decode call)."""

    def rewound(self, n: int) -> None:
        """The session now holds its first n positions only."""


def reusable(held: Sequence[int], tokens: Sequence[int]) -> int:
    """How much of a cache holding `held` serves `tokens`: their common prefix, short of the last token,
    which is decoded again for the logits after it."""
    same = next((i for i, (a, b) in enumerate(zip(held, tokens)) if a != b), min(len(held), len(tokens)))
    return min(same, len(tokens) - 1)


class Session:
    """The cache of a model's context, with the list of tokens it holds."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.tokens: list[int] = []
        self._ctx = model._ctx.ctx
        self._memory = llama_cpp.llama_get_memory(self._ctx)
        self._batch = llama_cpp.llama_batch_init(model.n_batch, 0, model.tree_branches)
        self.memory = model.memory
        self.rollback_depth = model.rollback_depth  # positions a ROLLBACK memory steps back by itself
        self._last_decode = 0  # tokens in the last llama_decode call, which a rollback may reach into
        self._rolled_back = True  # snapshots are single-use: one rollback per decode
        self._checkpoints: list[Checkpoint] = []  # lasting ones, by position
        self._step: Checkpoint | None = None  # the one taken before the current verification or draft
        self.followers: list[Follower] = []
        self.stats = RewindStats()
        # The tree `decode_tree` evaluated, until `keep_path` keeps one of its paths: leaves, parents, tokens.
        self._tree: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._guessed: int | None = None  # after decode_guesses of a chain: where its pending token went

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._checkpoints, self._step = [], None

    def reusable(self, tokens: Sequence[int]) -> int:
        """How much of this cache serves `tokens` (see `reusable`)."""
        return reusable(self.tokens, tokens)

    def prefill(self, tokens: Sequence[int]) -> int:
        """Make the cache hold exactly tokens[:-1], reusing the longest prefix it already holds;
        the last token stays pending, for the step that asks for its logits. Returns how many
        tokens were reused."""
        cached = self.reusable(tokens)
        self.rewind(cached)
        if len(tokens) - 1 > cached:
            # Where the next turn, a regenerated answer or an edited message comes back to: this turn's
            # start (what was reused) and its prompt's end.
            self.checkpoint(lasting=True)
            self.decode(tokens[cached:-1], "none")
            self.checkpoint(lasting=True)
        return cached

    # --- rewinding ---------------------------------------------------------------------------

    def checkpoint(self, lasting: bool = False, reach: int | None = None) -> None:
        """Keep the state here if this memory cannot come back by itself. `lasting`: a turn boundary,
        one of the few kept; otherwise the step checkpoint, replaced by the next. `reach`: the rewind to
        come undoes at most this many positions, all decoded by the next single decode (a
        verification): a memory with that many snapshots needs no copy."""
        if self.memory in (Memory.TRIM, Memory.RESTART) or not self.tokens:
            return
        if reach is not None and self.memory is Memory.ROLLBACK and reach <= self.rollback_depth:
            return
        t0 = time.perf_counter()
        size = llama_cpp.llama_state_seq_get_size_ext(self._ctx, 0, _PARTIAL)
        data = (ctypes.c_uint8 * size)()
        if llama_cpp.llama_state_seq_get_data_ext(self._ctx, data, size, 0, _PARTIAL) != size:
            raise SpecchatError(f"llama.cpp could not save the state of {self.model.name} for a rewind "
                                "(out of memory?); choose the none guesser")
        point = Checkpoint(len(self.tokens), data)
        if lasting:
            self._checkpoints = [c for c in self._checkpoints if c.pos != point.pos][-(LASTING_CHECKPOINTS - 1):]
            self._checkpoints.append(point)
        else:
            self._step = point
        s = self.stats
        s.checkpoints, s.checkpoint_s, s.checkpoint_bytes = s.checkpoints + 1, s.checkpoint_s + \
            time.perf_counter() - t0, size

    def rewind(self, n: int) -> None:
        """Drop every cached position from n on, by the cheapest way this memory allows. Checked: if
        it cannot be done, or is interrupted, the whole cache is cleared, so that it never lies."""
        if n >= len(self.tokens):
            return
        native = self.memory is Memory.TRIM or self._snapshots_hold(len(self.tokens) - n)
        if native and llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1):
            self._rolled_back = self.memory is Memory.ROLLBACK
            self._cut(n)
            return
        self._restore(n)

    def _snapshots_hold(self, drop: int) -> bool:
        """Whether llama.cpp's own snapshots of a ROLLBACK memory can step back `drop` positions: no more
        than it keeps, within the last decode (the state before that decode is not among them), once.
        llama.cpp's seq_rm on a recurrent memory may answer yes to a rollback its snapshots do not hold,
        so it is asked only where the answer is known to be true."""
        return (self.memory is Memory.ROLLBACK and not self._rolled_back
                and drop <= min(self.rollback_depth, self._last_decode - 1))

    def _nearest_saved(self, n: int) -> Checkpoint | None:
        """The saved state nearest before or at n."""
        points = [c for c in (*self._checkpoints, self._step) if c is not None and c.pos <= n]
        return max(points, key=lambda c: c.pos, default=None)

    def _restore(self, n: int) -> None:
        """Come back to n from the nearest saved state at or before it, decoding what lies between."""
        point = self._nearest_saved(n)
        replay = self.tokens[:n]
        t0 = time.perf_counter()
        try:
            start = 0
            if point is not None and llama_cpp.llama_state_seq_set_data_ext(
                    self._ctx, point.data, len(point.data), 0, _PARTIAL) and \
                    llama_cpp.llama_memory_seq_rm(self._memory, 0, point.pos, -1):
                start = point.pos
            else:  # no saved state to come back to: from the start, which always works
                llama_cpp.llama_memory_clear(self._memory, True)
            self._cut(start)
            self.stats.restores += 1
            self.stats.restore_s += time.perf_counter() - t0
            if n > start:
                self.stats.replayed += n - start
                self.decode(replay[start:n], "none")
        except BaseException:
            self.clear()
            raise

    def can_take_back(self) -> bool:
        """Whether this cache can take back a rejected guess. An attention cache drops positions; a recurrent
        state is saved and restored, tried here once on an empty cache. Where llama.cpp can do neither, the
        session falls back to restarting (Memory.RESTART): every guess would cost decoding the whole
        conversation again, so its owner should decode plainly."""
        if self.memory is Memory.TRIM:
            return True
        try:
            self.decode([0], "none")
            self.checkpoint(lasting=True)
            return True
        except SpecchatError:
            self.memory = Memory.RESTART
            return False
        finally:
            self.clear()

    def clear(self) -> None:
        """Forget everything, the cache and its saved states: it holds nothing and says so."""
        llama_cpp.llama_memory_clear(self._memory, True)
        self._cut(0)

    def _cut(self, n: int) -> None:
        """The cache now holds the first n positions: the token list, the saved states and the
        followers say the same."""
        del self.tokens[n:]
        self._checkpoints = [c for c in self._checkpoints if c.pos <= n]
        if self._step is not None and self._step.pos > n:
            self._step = None
        for follower in self.followers:
            follower.rewound(n)

    # --- decoding ----------------------------------------------------------------------------

    def decode(self, tokens: Sequence[int], logits: Literal["last", "all", "none"] = "last") -> np.ndarray:
        """Append tokens to the cache; return logits (rows, n_vocab) only where asked.

        The returned array is a view of llama.cpp's buffer, valid until the next decode.
        """
        if not tokens:
            raise ValueError("decode needs at least one token")
        start = len(self.tokens)
        if start + len(tokens) > self.model.n_ctx:
            raise ContextFull(f"the conversation needs {start + len(tokens)} tokens but the context holds "
                              f"{self.model.n_ctx} (start a new conversation or raise --ctx)")
        n_batch = self.model.n_batch
        if logits == "all" and len(tokens) > n_batch:
            raise ValueError("logits for every position need the tokens to fit in one batch")
        FITTER.refit()  # threads for the cores other programs leave free (cores.py): a clock read, mostly
        try:
            for lo in range(0, len(tokens), n_batch):
                chunk = tokens[lo:lo + n_batch]
                last_chunk = lo + n_batch >= len(tokens)
                self._fill(chunk, start + lo, logits, last_chunk)
                # Recorded before the call: if anything interrupts it, cutting back to `start` is right.
                self.tokens.extend(chunk)
                rc = llama_cpp.llama_decode(self._ctx, self._batch)
                if rc != 0:
                    raise SpecchatError(f"llama.cpp decode failed with code {rc} on {self.model.name}")
                self._last_decode, self._rolled_back = len(chunk), False
                for follower in self.followers:
                    follower.decoded(chunk, start + lo)
        except BaseException:
            self._drop_after(start)
            raise
        if logits == "none":
            return np.empty((0, self.model.n_vocab), dtype=np.float32)
        return self.last_logits(len(tokens) if logits == "all" else 1)

    def decode_guesses(self, pending: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Evaluate the pending token and the guesses after it in one batch (node i is tokens[i], after node
        parents[i]; -1: after the pending token): rows (1 + len(tokens), n_vocab). A chain, one branch, goes
        in as the context's own sequence, which every memory can take back; a tree with branches as one
        sequence per leaf (`decode_tree`, attention caches only). `keep` must come next."""
        if is_chain(parents):
            self._guessed = len(self.tokens)
            return self.decode([pending, *tokens], "all")
        self._guessed = None
        return self.decode_tree(pending, tokens, parents)

    def keep(self, path: Sequence[int]) -> None:
        """After `decode_guesses`: keep the pending token and the guesses along `path` (root first); take
        back the rest, by the cheapest way this memory allows."""
        if self._guessed is None:
            self.keep_path(path)
        else:
            self.rewind(self._guessed + 1 + len(path))

    def decode_tree(self, pending: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Evaluate the pending token and a tree of guesses after it in one batch (node i is tokens[i],
        after node parents[i]; -1: after the pending token). Each leaf's path is a llama.cpp sequence
        of its own, so a node shared by several paths is evaluated once, and every path sees the
        context through seq 0's cells, shared with it. Returns logits (1 + len(tokens), n_vocab): the
        pending token's, then each node's. The cache then holds the pending token; `keep_path` keeps
        one path after it and frees the rest, and must come next."""
        FITTER.refit()
        has_children = set(parents)
        leaves = [i for i in range(len(tokens)) if i not in has_children]
        if self.memory is not Memory.TRIM or self.followers or len(leaves) > self.model.tree_branches \
                or 1 + len(tokens) > self.model.n_batch:
            raise ValueError(f"a tree of {len(tokens)} nodes and {len(leaves)} leaves needs an attention cache "
                             "with as many sequences, a batch that holds it, and nothing following the cache")
        start = len(self.tokens)
        # Every node takes a cell of the one unified cache, whatever its depth: the room a tree needs is its size.
        if start + 1 + len(tokens) > self.model.n_ctx:
            raise ContextFull(f"the conversation needs {start + 1 + len(tokens)} tokens but the context holds "
                              f"{self.model.n_ctx} (start a new conversation or raise --ctx)")
        depth, seqs = tree_layout(parents, leaves)
        b = self._fill_tree(pending, tokens, start, depth, seqs, len(leaves))
        try:
            self.tokens.append(pending)  # before the call: an interruption cuts back to `start`
            for s in range(1, len(leaves)):  # the context's cells, shared with every other path
                llama_cpp.llama_memory_seq_cp(self._memory, 0, s, -1, -1)
            rc = llama_cpp.llama_decode(self._ctx, b)
            if rc != 0:
                raise SpecchatError(f"llama.cpp decode failed with code {rc} on {self.model.name}")
            self._last_decode, self._rolled_back = b.n_tokens, False
        except BaseException:
            self.clear()  # other sequences may hold cells now: start again from nothing, never half a tree
            raise
        self._tree = (leaves, list(parents), list(tokens))
        return self.last_logits(b.n_tokens)

    def _fill_tree(self, pending: int, tokens: Sequence[int], start: int, depth: Sequence[int],
                   seqs: Sequence[set[int]], n_leaves: int) -> llama_cpp.llama_batch:
        """The batch of a tree after `start`: the pending token in every leaf's sequence, then each node at its
        depth's position in the sequences of the leaves below it, every row asking for logits."""
        b = self._batch
        b.n_tokens = 1 + len(tokens)
        rows = [(pending, start, range(n_leaves))] + [
            (tok, start + 1 + depth[i], sorted(seqs[i])) for i, tok in enumerate(tokens)]
        for i, (tok, pos, ids) in enumerate(rows):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, len(ids), True
            for j, s in enumerate(ids):
                b.seq_id[i][j] = s
        return b

    def keep_path(self, path: Sequence[int]) -> None:
        """After `decode_tree`: keep the nodes of `path` (root first, a path down the tree) after the
        pending token, as seq 0, and free every other node's cells."""
        leaves, parents, tokens = self._tree
        self._tree = ([], [], [])
        start = len(self.tokens) - 1  # the pending token's position
        # the sequence of a leaf below the path's end holds the path; with an empty path, any does
        winner = next((s for s, leaf in enumerate(leaves) if not path or self._under(leaf, path[-1], parents)), 0)
        try:
            if len(leaves) > 1:
                llama_cpp.llama_memory_seq_keep(self._memory, winner)
                if winner != 0:
                    llama_cpp.llama_memory_seq_cp(self._memory, winner, 0, -1, -1)
                    llama_cpp.llama_memory_seq_rm(self._memory, winner, -1, -1)
            # the winner's nodes after the path
            if not llama_cpp.llama_memory_seq_rm(self._memory, 0, start + 1 + len(path), -1):
                raise SpecchatError(f"llama.cpp could not cut {self.model.name}'s cache after a tree of guesses")
        except BaseException:
            self.clear()
            raise
        self.tokens.extend(tokens[i] for i in path)

    @staticmethod
    def _under(leaf: int, node: int, parents: Sequence[int]) -> bool:
        while leaf != -1 and leaf != node:
            leaf = parents[leaf]
        return leaf == node

    def last_logits(self, rows: int) -> np.ndarray:
        """The logits rows of the latest decode, as a view of llama.cpp's buffer (no copy)."""
        ptr = llama_cpp.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(ptr, shape=(rows, self.model.n_vocab))

    def _fill(self, chunk: Sequence[int], pos0: int, logits: str, last_chunk: bool) -> None:
        b = self._batch
        b.n_tokens = len(chunk)
        want_all = logits == "all"
        for i, tok in enumerate(chunk):
            b.token[i] = tok
            b.pos[i] = pos0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = want_all
        if last_chunk and logits == "last":
            b.logits[len(chunk) - 1] = True

    def _drop_after(self, n: int) -> None:
        """After a failed or interrupted decode: back to n, or, where the memory cannot say so, to nothing."""
        if self.memory is Memory.TRIM and llama_cpp.llama_memory_seq_rm(self._memory, 0, n, -1):
            self._cut(n)
        else:
            self.clear()
