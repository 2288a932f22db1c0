"""Verifying several candidates at once (a token tree): exactness by sampling on fake models."""

from __future__ import annotations

from functools import lru_cache

import llama_cpp
import numpy as np
import pytest
from pooled import chi_square

from specchat.decoding.verify import Tree, verify, verify_tree, verify_tree_greedy
from specchat.errors import ContextFull
from specchat.llama.model import Model

V = 5  # the target's vocabulary
N = 20_000


@lru_cache(maxsize=None)
def dist(context: tuple[int, ...], width: int, salt: int) -> np.ndarray:
    """A fixed, uneven distribution for each context: a fake model."""
    seed = hash((salt, width, context)) % 2**32  # a tuple of ints hashes the same in every process
    d = np.random.default_rng(seed).dirichlet(np.full(width, 0.6))
    d.flags.writeable = False  # shared between calls
    return d


def target(context: tuple[int, ...]) -> np.ndarray:
    return dist(context, V, 1)


def grow(kind: str, width: int, rng: np.random.Generator) -> Tree:
    """A two-level tree over the empty context: `sampled` (two independent draws from the draft at the
    root, each followed by one draw), `fixed` (two deterministic branches, one of them two deep) or
    `mixed` (a deterministic branch, then two sampled ones)."""
    tokens, parents, drafts = [], [], []

    def add(token: int, parent: int, q: np.ndarray | None) -> int:
        tokens.append(token), parents.append(parent), drafts.append(q)
        return len(tokens) - 1

    def sampled(parent: int, context: tuple[int, ...]) -> None:
        q = dist(context, width, 2)
        x = int(rng.choice(width, p=q))
        node = add(x, parent, q)
        q2 = dist((*context, x), width, 2)
        add(int(rng.choice(width, p=q2)), node, q2)

    if kind in ("fixed", "mixed"):
        add(1, add(3, -1, None), None)
    if kind == "fixed":
        add(0, -1, None)
    if kind in ("sampled", "mixed"):
        sampled(-1, ()), sampled(-1, ())
    return Tree(tuple(tokens), tuple(parents), tuple(drafts))


def contexts(tree: Tree) -> list[tuple[int, ...]]:
    """Each row's context: the root's, then each node's path."""
    return [(), *(tuple(tree.tokens[n] for n in tree.path(i)) for i in range(len(tree.tokens)))]


def first_two(tree: Tree, rng: np.random.Generator) -> tuple[int, int, int]:
    """The first two tokens the step yields (a step that yields one is followed by a plain draw), and
    which of the root's branches the kept path went through (-1: none was kept)."""
    probs = rows(tree.tokens, tree.parents)
    v = verify_tree(tree, probs, rng)
    out = [tree.tokens[n] for n in v.path] + [v.token]
    if len(out) < 2:
        out.append(int(rng.choice(V, p=target((out[0],)))))
    return out[0], out[1], tree.children(-1).index(v.path[0]) if v.path else -1


@lru_cache(maxsize=None)
def rows(tree_tokens: tuple[int, ...], tree_parents: tuple[int, ...]) -> np.ndarray:
    tree = Tree(tree_tokens, tree_parents, (None,) * len(tree_tokens))
    return np.stack([target(c) for c in contexts(tree)])


def joint() -> np.ndarray:
    return np.stack([target(())[a] * target((a,)) for a in range(V)])


@pytest.mark.parametrize("kind", ["sampled", "fixed", "mixed"])
@pytest.mark.parametrize("width", [V, V - 1, V + 2])  # the draft's vocabulary: the same, narrower, wider
def test_tree_reproduces_the_target_at_t1(kind, width):
    rng = np.random.default_rng(width * 7 + len(kind))
    counts = np.zeros((V, V))
    branches = np.zeros(3)  # steps that kept a path through each of the root's branches
    for _ in range(N):
        tree = grow(kind, width, rng)
        a, b, branch = first_two(tree, rng)
        counts[a, b] += 1
        if branch >= 0:
            branches[branch] += 1
    assert chi_square(counts, joint()) > 1e-3
    # The first branch and the others were kept, many times: a tree bypassed keeps none, and one cut to its
    # first branch none through the others.
    assert branches[0] > N // 400 and branches[1:].sum() > N // 400, branches


def test_second_branch_raises_acceptance_over_one():
    """Two independent draft branches keep a token more often than one: what a tree is for."""
    rng = np.random.default_rng(5)
    one = two = 0
    for _ in range(N // 4):
        tree = grow("sampled", V, rng)
        probs = rows(tree.tokens, tree.parents)
        two += len(verify_tree(tree, probs, rng).path) > 0
        first = Tree(tree.tokens[:2], tree.parents[:2], tree.drafts[:2])
        one += len(verify_tree(first, probs[:3], rng).path) > 0
    assert two > one * 1.05


def algorithm_1(tokens: list[int], drafts: np.ndarray | None, p: np.ndarray) -> dict[tuple[int, int], float]:
    """The chance of each (guesses kept, token drawn) of one step, written out from Leviathan et al.'s
    Algorithm 1: guess i is kept with min(1, p_i(x) / q_i(x)); the first rejection draws from
    max(p_i - q_i, 0), normalised; a step that keeps all draws the bonus from p_k. A guess without q is
    a point mass."""
    out: dict[tuple[int, int], float] = {}
    reach = 1.0  # the chance of getting to guess i
    for i, x in enumerate(tokens):
        q = drafts[i] if drafts is not None else np.eye(p.shape[1])[x]
        keep = min(1.0, p[i, x] / q[x])
        residual = np.maximum(p[i] - q, 0.0)
        for t in range(p.shape[1]):
            out[(i, t)] = reach * (1 - keep) * residual[t] / residual.sum() if residual.sum() else 0.0
        reach *= keep
    for t in range(p.shape[1]):
        out[(len(tokens), t)] = reach * p[len(tokens), t]
    return out


@pytest.mark.parametrize("residual_from_p", [False, True])
def test_a_chain_keeps_and_draws_as_algorithm_1_says(monkeypatch, residual_from_p):
    """`verify` (the tree rule on a chain) against the chances written out from the paper, for a sampled
    draft and for point masses; the control draws each correction from p instead, and is caught."""
    import specchat.decoding.verify as verify_module

    if residual_from_p:
        monkeypatch.setattr(verify_module, "_residual", lambda p, q, x: p)
    p = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    q = np.array([[0.1, 0.7, 0.1, 0.1], [0.3, 0.3, 0.3, 0.1]])
    rng = np.random.default_rng(9)
    pvalues = []
    for tokens, drafts in (([1, 2], q), ([0, 1], None), ([3, 1], None)):
        want = algorithm_1(tokens, drafts, p)
        cells = [cell for cell, chance in want.items() if chance > 0]
        counts = dict.fromkeys(cells, 0)
        for _ in range(N // 2):
            v = verify(tokens, drafts, p, rng)
            counts[(v.n_accepted, v.token)] = counts.get((v.n_accepted, v.token), 0) + 1
        if set(counts) != set(cells):  # an outcome the rule gives no chance
            pvalues.append(0.0)
            continue
        total = sum(want[c] for c in cells)
        pvalues.append(chi_square(np.array([counts[c] for c in cells]), np.array([want[c] / total for c in cells])))
    assert (min(pvalues) < 1e-6) if residual_from_p else (min(pvalues) > 1e-3), pvalues


def test_greedy_takes_the_longest_branch_the_target_agrees_with():
    # root -> 3 -> 1 and root -> 0 -> 2 -> 4; the target's argmax goes 0, 2, 4, then 1
    tree = Tree((3, 1, 0, 2, 4), (-1, 0, -1, 2, 3), (None,) * 5)
    argmax = [0, 9, 9, 2, 4, 1]  # rows: root, then each node
    v = verify_tree_greedy(tree, argmax)
    assert (v.path, v.token) == ((2, 3, 4), 1)
    assert verify_tree_greedy(tree, [7, 0, 0, 0, 0, 0]) == type(v)((), 7)
    # stops where the branch and the target part: after 0 -> 2 the target wants 3, not 4
    assert verify_tree_greedy(tree, [0, 9, 9, 2, 3, 1]) == type(v)((2, 3), 3)


# --- one target step over a tree, on a real model ------------------------------------------------

TREE_TOKENS = (11, 12, 13, 14, 15, 16)
TREE_PARENTS = (-1, -1, 0, 2, 0, 1)  # 11 -> 13 -> 14, 11 -> 15, 12 -> 16: three leaves


@pytest.fixture(scope="module")
def smol_trees(smol_path):
    model = Model(smol_path, n_ctx=1024, tree_branches=4)  # by default only where a GPU takes the model
    yield model
    model.close()


@pytest.mark.real
def test_a_tree_evaluates_each_path_as_that_path_alone(smol_trees):
    """Every node's logits are those of its path decoded as one sequence in a batch of the same size
    (batches of different sizes may round differently, so the margin is measured on linear batches of
    this size); after keeping a path the cache holds it and nothing else. (That decoding then goes on
    as plain decoding would is the greedy-equivalence test's: tests/decoding/test_greedy_qwen.py.)"""
    smol = smol_trees
    session = smol.session
    context = smol.tokenize("The quick brown fox jumps over the lazy dog. The quick brown")
    size = 1 + len(TREE_TOKENS)

    def linear(path: list[int]) -> np.ndarray:
        """The path after the context, padded to the tree's batch size with tokens that come after it."""
        session.rewind(len(context) - 1)
        tokens = [TREE_TOKENS[n] for n in path]
        rows = session.decode([context[-1], *tokens, *[20] * (size - 1 - len(tokens))], "all")
        return np.array(rows[:1 + len(tokens)])

    def padded_margin(path: list[int]) -> float:
        """How much two linear batches of this size that share the path differ over it."""
        a = linear(path)
        session.rewind(len(context) - 1)
        tokens = [TREE_TOKENS[n] for n in path]
        b = session.decode([context[-1], *tokens, *[21] * (size - 1 - len(tokens))], "all")[:1 + len(tokens)]
        return float(np.abs(a - b).max())

    session.rewind(0)
    session.decode(context[:-1], "none")
    tree_rows = np.array(session.decode_tree(context[-1], TREE_TOKENS, TREE_PARENTS))
    session.keep_path([0, 2])
    assert session.tokens == [*context, 11, 13]
    memory = session._memory
    assert [llama_cpp.llama_memory_seq_pos_max(memory, s) for s in range(smol.tree_branches)] == \
        [len(context) + 1, -1, -1, -1]  # seq 0 holds the path; the other branches' sequences are gone
    for leaf in (3, 4, 5):
        path = Tree(TREE_TOKENS, TREE_PARENTS, (None,) * 6).path(leaf)
        want = linear(path)
        got = tree_rows[[0, *(n + 1 for n in path)]]
        assert np.abs(got - want).max() <= padded_margin(path), f"the path to node {leaf}"


@pytest.mark.real
def test_a_tree_larger_than_the_room_left_is_context_full_and_leaves_the_cache_as_it_was(smol_trees):
    """The tree's seven cells (the pending token and six nodes) must fit the cache, though its deepest path
    (11 -> 13 -> 14) reaches only four positions on: with room for five, the tree is refused before anything is
    decoded and the cache stays (judged by depth, as it was, llama.cpp found no cells, and the cache was lost);
    with room for its seven it goes in."""
    session = smol_trees.session
    n_ctx = smol_trees.n_ctx
    session.rewind(0)
    session.decode([20] * (n_ctx - 5), "none")
    with pytest.raises(ContextFull, match=f"needs {n_ctx + 2} tokens"):
        session.decode_tree(21, TREE_TOKENS, TREE_PARENTS)
    assert session.tokens == [20] * (n_ctx - 5)
    session.rewind(n_ctx - 1 - len(TREE_TOKENS))
    session.decode_tree(21, TREE_TOKENS, TREE_PARENTS)
    session.keep_path([0, 2, 3])
    assert session.tokens == [20] * (n_ctx - 1 - len(TREE_TOKENS)) + [21, 11, 13, 14]
