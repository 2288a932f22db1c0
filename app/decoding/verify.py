"""The acceptance rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Pure functions over arrays with the random generator passed in, so that tests can check
exactness by sampling with a fixed seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

import numpy as np

from specchat.decoding.sampling import SamplingConfig, logits_to_probs, masked, sample


@dataclass(frozen=True)
class Verdict:
    """`n_accepted` drafted tokens were kept, then `token` (a correction, or the bonus)."""

    n_accepted: int
    token: int

    def bonus(self, n_drafted: int) -> bool:
        return self.n_accepted == n_drafted


def verify(
    draft_tokens: Sequence[int],
    draft_probs: np.ndarray | None,
    target_probs: np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """Accept each drafted x with probability min(1, p(x)/q(x)); on the first rejection,
    sample from normalize(max(0, p - q)) and stop; if all k pass, sample the bonus from p[k].

    target_probs: (k+1, V), the target's distribution before each drafted token and after
    the last. draft_probs: (k, V) the draft's distributions, or None when the proposals are
    deterministic (prompt lookup), i.e. point masses: then acceptance is p(x) and the
    residual is p with x removed.
    """
    assert target_probs.shape[0] == len(draft_tokens) + 1, (target_probs.shape, len(draft_tokens))
    v = verify_tree(Tree.chain(draft_tokens, draft_probs), target_probs, rng)  # a chain: this rule, node by node
    return Verdict(len(v.path), v.token)


def verify_greedy(draft_tokens: Sequence[int], target_argmax: Sequence[int]) -> Verdict:
    """Temperature 0: a drafted token is accepted iff it is the target's argmax."""
    for i, x in enumerate(draft_tokens):
        if x != target_argmax[i]:
            return Verdict(i, int(target_argmax[i]))
    return Verdict(len(draft_tokens), int(target_argmax[len(draft_tokens)]))


def _residual(p: np.ndarray, q: np.ndarray | None, x: int) -> np.ndarray:
    if q is None:
        residual = p.copy()
        if x < len(p):
            residual[x] = 0.0
    else:
        # Over the union of both vocabularies: where only the target has a token, q is 0; where only
        # the draft has one, p is 0 and max(p - q, 0) is 0, so those columns drop out.
        q = q[:len(p)] if len(q) >= len(p) else np.pad(q, (0, len(p) - len(q)))
        residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    # Only reachable through rounding (a rejection implies p(x) < q(x), so mass exists above q);
    # falling back to p keeps the step well defined.
    return residual / total if total > 0 else p


@dataclass(frozen=True)
class Tree:
    """Several guessed continuations at once, sharing their prefixes: node i is `tokens[i]`, following
    node `parents[i]` (-1: the last committed token). A parent comes before its children. `drafts[i]` is
    the distribution node i's token was drawn from (a sampling draft's, given the path to its parent),
    or None for a deterministic guess (lookup, history: a point mass). Siblings drawn from a draft must
    be independent draws (with replacement); deterministic siblings should differ."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    drafts: tuple[np.ndarray | None, ...]

    def __post_init__(self) -> None:
        assert len(self.tokens) == len(self.parents) == len(self.drafts)
        assert all(-1 <= p < i for i, p in enumerate(self.parents)), "a parent comes before its children"

    @staticmethod
    def chain(tokens: Sequence[int], drafts: np.ndarray | None = None) -> "Tree":
        """One guess as a tree of a single branch."""
        return Tree(tuple(tokens), tuple(range(-1, len(tokens) - 1)),
                    tuple(None if drafts is None else drafts[i] for i in range(len(tokens))))

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node`."""
        nodes = []
        while node != -1:
            nodes.append(node)
            node = self.parents[node]
        return nodes[::-1]


@dataclass(frozen=True)
class TreeVerdict:
    """The nodes kept, root first (a path through the tree), then `token`: a correction, or the bonus."""

    path: tuple[int, ...]
    token: int


def verify_tree(tree: Tree, target_probs: np.ndarray | Rows[np.ndarray], rng: np.random.Generator) -> TreeVerdict:
    """Recursive rejection sampling (SpecInfer, Miao et al. 2024; Chen et al.'s multi-draft analysis):
    at each node, with r the target's distribution there, each child x in turn is accepted with
    probability min(1, r(x)/q(x)) and then followed; on a rejection r becomes normalize(max(0, r - q)),
    which the next child is judged against. If every child is rejected, the step ends on a token
    drawn from r. Each step of this is the single-candidate rule with r as its target, so the token
    that leaves a node is distributed exactly as r was: the target's distribution. For deterministic
    children (point masses) it is the same as drawing from the target and following the child that
    matches.

    target_probs: (len(tree.tokens) + 1, V): row 0 the target's distribution after the last committed
    token, row i + 1 the one after node i (its path evaluated as one sequence)."""
    assert target_probs.shape[0] == len(tree.tokens) + 1, (target_probs.shape, len(tree.tokens))
    node, path = -1, []
    while True:
        r = target_probs[node + 1]
        for child in tree.children(node):
            x, q = tree.tokens[child], tree.drafts[child]
            q_x = 1.0 if q is None else q[x]
            # A draft's vocabulary may be wider than the target's: a token past the target's end is
            # one the target cannot emit, r(x) = 0, and is rejected.
            r_x = r[x] if x < len(r) else 0.0
            # r >= q accepts with certainty: skip the draw so that greedy runs consume no randomness.
            # But never a token the target cannot emit: with q(x) = 0 too, r >= q held and a token
            # of target probability 0 was accepted (min(1, r/q) is 0/0 there; the target decides).
            if (r_x >= q_x and r_x > 0) or rng.random() * q_x < r_x:
                path.append(child)
                node = child
                break
            r = _residual(r, q, x)
        else:
            return TreeVerdict(tuple(path), sample(r, rng))


def verify_tree_greedy(tree: Tree, target_argmax: Sequence[int] | Rows[int]) -> TreeVerdict:
    """Temperature 0: follow the child that is the target's argmax, as deep as the tree agrees."""
    node, path = -1, []
    while True:
        best = int(target_argmax[node + 1])
        follow = next((c for c in tree.children(node) if tree.tokens[c] == best), None)
        if follow is None:
            return TreeVerdict(tuple(path), best)
        path.append(follow)
        node = follow


def verify_logits(tree: Tree, logits: np.ndarray, sampling: SamplingConfig, rng: np.random.Generator,
                  allowed: np.ndarray | None = None) -> TreeVerdict:
    """The rule on the target's logits (len(tree.tokens) + 1, V), rows as `verify_tree` reads them. Under a
    grammar, `allowed` (same rows) is what it allows after each row's path: the target's rows are masked and
    renormalised *before* the rule, so the rule is exact for the constrained target whatever the guesses
    (a refused guess has probability 0 there and is rejected). Greedy: the argmax among the allowed.

    A row is worked on only when the rule reads it, and it reads only the rows on the path it keeps (the kept
    guesses and one more): on a 150k vocabulary making a row's probabilities costs about 0.4 ms, masking it for a
    grammar more, and all 17 rows of a 16-token guess rejected at once cost 24-81 ms made up front (a CPU's step is
    30 ms, a GPU's a few; `bench/sampling`)."""
    def row(i: int) -> np.ndarray:
        return logits[i] if allowed is None else masked(logits[i], allowed[i])

    n = len(tree.tokens) + 1
    if sampling.greedy:
        return verify_tree_greedy(tree, Rows(lambda i: int(np.argmax(row(i))), n))
    return verify_tree(tree, Rows(lambda i: logits_to_probs(row(i), sampling), n), rng)


T = TypeVar("T")


class Rows(Generic[T]):
    """What the rule reads of the target's rows, row i made by `make(i)` when first read."""

    def __init__(self, make: Callable[[int], T], n: int) -> None:
        self._make, self.shape = make, (n,)
        self._rows: dict[int, T] = {}

    def __getitem__(self, i: int) -> T:
        if i not in self._rows:
            self._rows[i] = self._make(i)
        return self._rows[i]
