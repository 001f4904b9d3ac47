"""Which source each position of a blend takes, in exact proportions, by random access.

A blend of sources with weights ``w_s`` is a sequence of source numbers. Its quality is the
*prefix discrepancy*: how far, after ``n`` positions, the count ``c_s(n)`` of each source is
from ``w_s * n``. Megatron's ``BlendedDataset`` builds the sequence greedily (each position
goes to the source furthest behind) into arrays of the epoch's size; this module computes
the source of any position, and every prefix count, in O(number of sources) time and memory,
vectorised over a block of positions.

Construction
------------
A binary tree over the sources. The root's count after ``n`` positions is ``n``; an inner
node with count ``P`` gives its smaller child (share ``r <= 1/2`` of the node's weight)
``floor(r * P + 1/2)`` and its other child the rest. Every count is nondecreasing in ``n``
and the leaves' counts sum to ``n``, so exactly one source gains at each position: that is
the position's source, and its count before the position is the draw's index within the
source. Random access is one pass down the tree.

Bound
-----
A child's count is within ``1/2`` of ``r * P``, so its error against ``W_child * n`` is at
most ``1/2 + r * (error of P)``. Unrolled from the root (error 0), a leaf ``l`` at depth
``d`` with ancestors ``v_1 .. v_{d-1}`` below the root is off by at most::

    (1 + sum_i w_l / W(v_i)) / 2

(:attr:`Interleave.bounds`), and the bound is reached for weights in general position (the
counts equidistribute over the tree's rounding phases). Depth two never exceeds 1, so up to
four sources every prefix is within 1 of its share, for any weights. With five or more
sources the tree is chosen to minimise the largest bound (exact search up to
:data:`EXACT_SEARCH_SOURCES` sources, a bounded search beyond); some weights have no tree
whose bound is 1 (e.g. 0.479/0.354/0.142/0.0248/0.00003: best 1.024). Megatron's greedy is
no better there: it exceeds 1 as well (see ``docs/design.md``).

Counts are computed in float64 (``r * P + 1/2`` rounded twice, then floored): deterministic
on every IEEE-754 platform, monotone by construction, and within ``3 * depth * 2**-53 * n`` of
the exact rounding: below ``2**32`` positions that adds about ``1.5e-6`` per tree level to
the bound.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from rangestream.errors import LoaderConfigError, OutOfRangeError

__all__ = [
    "BOUNDED_SEARCH_SOURCES",
    "EXACT_SEARCH_SOURCES",
    "MAX_POSITION",
    "SEARCH_STEPS",
    "Interleave",
]

EXACT_SEARCH_SOURCES = 8
"""Up to this many sources the tree with the smallest bound is found exhaustively (about
0.1 s at 8); beyond, the search is bounded (see :class:`_TreeSearch`). Every step is
deterministic, so every process builds the same tree from the same weights."""

BOUNDED_SEARCH_SOURCES = 12
"""Up to this many sources (beyond :data:`EXACT_SEARCH_SOURCES`), the refined greedy tree
seeds a branch and bound limited to :data:`SEARCH_STEPS` subtrees (about a second)."""

SEARCH_STEPS = 200_000

MAX_POSITION = 2**53
"""Counts are exact float64 integers below this many positions."""

Tree: TypeAlias = int | tuple["Tree", "Tree"]


@dataclass(frozen=True)
class _Split:
    """One inner node: ``smaller = floor(ratio * count + 1/2)``, ``larger = count - smaller``."""

    node: int
    ratio: float
    smaller: int
    larger: int


def _fractions(weights: Sequence[float]) -> list[Fraction]:
    """Weights normalised exactly. A float is read as the decimal it prints as (``0.1`` is
    1/10, not the binary fraction nearest to it), so ``0.7, 0.2, 0.1`` is exactly 7:2:1."""
    values: list[Fraction] = []
    for index, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(
            weight, (int, float, Fraction, np.integer, np.floating)
        ):
            raise LoaderConfigError(f"weight {index} must be a number, got {weight!r}")
        if isinstance(weight, (float, np.floating)):
            if not math.isfinite(weight):
                raise LoaderConfigError(f"weight {index} must be finite, got {weight!r}")
            value = Fraction(repr(float(weight)))
        else:
            value = Fraction(weight)
        if value < 0:
            raise LoaderConfigError(f"weight {index} must be >= 0, got {weight!r}")
        values.append(value)
    total = sum(values, Fraction(0))
    if total == 0:
        raise LoaderConfigError(f"at least one weight must be positive, got {list(weights)!r}")
    return [value / total for value in values]


class _TreeSearch:
    """Minimise ``max_l w_l * sum_{ancestors v below the root} 1 / W(v)`` over binary trees.

    Branch and bound over every tree (heaviest leaves first), seeded with the greedy tree
    below with every subtree of at most :data:`EXACT_SEARCH_SOURCES` leaves replaced by the
    best one for its place; exhaustive up to :data:`EXACT_SEARCH_SOURCES` leaves, limited
    to :data:`SEARCH_STEPS` subtrees up to :data:`BOUNDED_SEARCH_SOURCES`, skipped beyond.

    The greedy tree answers "can every leaf stay within ``tau``?" bottom-up, like Huffman's
    algorithm: a node placed under ancestors summing ``x`` keeps all its leaves within
    ``tau`` iff ``x <= slack``, where a leaf's slack is ``tau / w_l`` and merging two nodes
    into ``v`` leaves ``min(slack_a, slack_b) - 1 / W(v)``. It repeatedly merges the node
    with the most slack with the partner that keeps the most; the two nodes left become
    the root's children. ``tau`` is found by bisection.
    """

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = list(weights)
        self.steps = math.inf  # subtrees the branch and bound may still examine

    def total(self, leaves: tuple[int, ...]) -> float:
        return math.fsum(self.weights[leaf] for leaf in leaves)

    def cost(self, tree: Tree) -> float:
        """The tree's largest leaf cost (the quantity minimised)."""
        worst = 0.0

        def walk(node: Tree, x: float, depth: int) -> None:
            nonlocal worst
            if isinstance(node, int):
                worst = max(worst, self.weights[node] * x)
                return
            below = x + (1.0 / self.total(_leaves(node)) if depth > 0 else 0.0)
            walk(node[0], below, depth + 1)
            walk(node[1], below, depth + 1)

        walk(tree, 0.0, 0)
        return worst

    def best(self) -> Tree:
        count = len(self.weights)
        if count == 1:
            return 0
        greedy = self.refine(self.greedy(), 0.0, 0)
        if count > BOUNDED_SEARCH_SOURCES:
            return greedy
        if count > EXACT_SEARCH_SOURCES:
            self.steps = SEARCH_STEPS
        # heaviest first: the splits tried first pair heavy leaves with few others
        leaves = tuple(sorted(range(count), key=lambda leaf: (-self.weights[leaf], leaf)))
        found = self.exhaustive(leaves, self.cost(greedy))
        return greedy if found is None else found

    # -- greedy (bottom-up, bisection on the target) --------------------------------------

    def greedy(self) -> Tree:
        low, high = 0.0, 2.0 * len(self.weights)
        tree = self.within(high)
        assert tree is not None, "every leaf fits under a bound of 2 * sources"
        for _ in range(_BISECTION_STEPS):
            middle = (low + high) / 2
            candidate = self.within(middle)
            if candidate is None:
                low = middle
            else:
                high, tree = middle, candidate
        return tree

    def within(self, tau: float) -> Tree | None:
        """A tree keeping every leaf cost within ``tau``, or ``None`` if the greedy fails."""
        nodes: list[tuple[float, float, Tree]] = [
            (tau / weight, weight, leaf) for leaf, weight in enumerate(self.weights)
        ]
        while len(nodes) > 2:
            first = max(range(len(nodes)), key=lambda k: (nodes[k][0], -k))
            slack, weight, tree = nodes[first]
            partner, kept = -1, -math.inf
            for k, (other_slack, other_weight, _) in enumerate(nodes):
                if k != first:
                    merged = min(slack, other_slack) - 1.0 / (weight + other_weight)
                    if merged > kept:
                        partner, kept = k, merged
            joined = (kept, weight + nodes[partner][1], (tree, nodes[partner][2]))
            nodes = [node for k, node in enumerate(nodes) if k not in (first, partner)]
            nodes.append(joined)
        if min(nodes[0][0], nodes[1][0]) < 0:
            return None
        return (nodes[0][2], nodes[1][2])

    # -- exact ---------------------------------------------------------------------------

    def exhaustive(self, leaves: tuple[int, ...], cap: float) -> Tree | None:
        """The best tree over ``leaves`` as the whole tree (root not counted), if it beats
        ``cap``."""
        best_tree: Tree | None = None
        for left, right in self.splits(leaves):
            if self.steps <= 0:
                break
            tree, cost = self.pair(left, right, 0.0, cap)
            if tree is not None:
                best_tree, cap = tree, cost
        return best_tree

    def pair(
        self, left: tuple[int, ...], right: tuple[int, ...], x: float, cap: float
    ) -> tuple[Tree | None, float]:
        left_tree, left_cost = self.subtree(left, x, cap)
        if left_tree is None:
            return None, cap
        right_tree, right_cost = self.subtree(right, x, cap)
        if right_tree is None:
            return None, cap
        return (left_tree, right_tree), max(left_cost, right_cost)

    def subtree(self, leaves: tuple[int, ...], x: float, cap: float) -> tuple[Tree | None, float]:
        """The best subtree over ``leaves`` under ancestors summing ``x``, if below ``cap``."""
        if len(leaves) == 1:
            cost = self.weights[leaves[0]] * x
            return (leaves[0], cost) if cost < cap else (None, cap)
        if self.steps <= 0:
            return None, cap
        self.steps -= 1
        inner = x + 1.0 / self.total(leaves)
        if max(self.weights[leaf] for leaf in leaves) * inner >= cap:
            return None, cap  # every leaf costs at least this much, wherever it goes below
        best_tree: Tree | None = None
        for left, right in self.splits(leaves):
            if self.steps <= 0:
                break
            tree, cost = self.pair(left, right, inner, cap)
            if tree is not None:
                best_tree, cap = tree, cost
        return best_tree, cap

    @staticmethod
    def splits(leaves: tuple[int, ...]) -> Iterator[tuple[tuple[int, ...], tuple[int, ...]]]:
        """Every split of ``leaves`` into two non-empty parts, each once."""
        first, rest = leaves[0], leaves[1:]
        for size in range(len(rest)):
            for chosen in itertools.combinations(rest, size):
                yield (first, *chosen), tuple(leaf for leaf in rest if leaf not in chosen)

    def refine(self, tree: Tree, x: float, depth: int) -> Tree:
        """Replace each maximal subtree of at most :data:`EXACT_SEARCH_SOURCES` leaves by
        the best subtree for its place (never worse: its leaves' costs depend only on
        ``x`` and the subtree)."""
        if isinstance(tree, int):
            return tree
        leaves = tuple(sorted(_leaves(tree)))
        if depth > 0 and len(leaves) <= EXACT_SEARCH_SOURCES:
            current = self.cost_below(tree, x)
            better, _ = self.subtree(leaves, x, current)
            return tree if better is None else better
        below = x + (1.0 / self.total(leaves) if depth > 0 else 0.0)
        return (self.refine(tree[0], below, depth + 1), self.refine(tree[1], below, depth + 1))

    def cost_below(self, tree: Tree, x: float) -> float:
        if isinstance(tree, int):
            return self.weights[tree] * x
        inner = x + 1.0 / self.total(_leaves(tree))
        return max(self.cost_below(tree[0], inner), self.cost_below(tree[1], inner))


_BISECTION_STEPS = 40


def _leaves(tree: Tree) -> tuple[int, ...]:
    if isinstance(tree, int):
        return (tree,)
    return _leaves(tree[0]) + _leaves(tree[1])


class Interleave:
    """Random-access blend of sources in exact proportions.

    Parameters
    ----------
    weights : sequence of float
        Non-negative weights, one per source, normalised here exactly (a float counts as
        the decimal it prints as). Sources of weight 0 never occur.

    Notes
    -----
    Only the weights define the sequence: every process that builds an ``Interleave`` from
    the same weights gets the same tree and the same sequence, so positions can be
    evaluated anywhere (any rank, any worker, after any resume). See the module docstring
    for the construction and the bound.
    """

    def __init__(self, weights: Sequence[float]) -> None:
        exact = _fractions(weights)
        self._exact = exact
        self.num_sources = len(exact)
        active = [index for index, weight in enumerate(exact) if weight > 0]
        leaf_weights = [float(exact[index]) for index in active]
        tree = _TreeSearch(leaf_weights).best()
        self._tree: Tree = self._relabel(tree, active)
        self._splits: list[_Split] = []
        self._root = self._build(self._tree)
        self._bounds = self._leaf_bounds()

    # -- construction -----------------------------------------------------------------------

    @staticmethod
    def _relabel(tree: Tree, labels: list[int]) -> Tree:
        if isinstance(tree, int):
            return labels[tree]
        return (Interleave._relabel(tree[0], labels), Interleave._relabel(tree[1], labels))

    def _weight(self, tree: Tree) -> Fraction:
        if isinstance(tree, int):
            return self._exact[tree]
        return self._weight(tree[0]) + self._weight(tree[1])

    def _build(self, tree: Tree) -> int:
        """Number the nodes (sources keep their index; inner nodes follow) top-down."""
        if isinstance(tree, int):
            return tree
        node = self.num_sources + len(self._splits)
        placeholder = _Split(node, 0.0, -1, -1)
        self._splits.append(placeholder)
        slot = len(self._splits) - 1
        left_weight, right_weight = self._weight(tree[0]), self._weight(tree[1])
        small, large = (tree[0], tree[1]) if left_weight <= right_weight else (tree[1], tree[0])
        ratio = float(min(left_weight, right_weight) / (left_weight + right_weight))
        small_node = self._build(small)
        large_node = self._build(large)
        self._splits[slot] = _Split(node, ratio, small_node, large_node)
        return node

    def _leaf_bounds(self) -> list[float]:
        bounds = [0.0] * self.num_sources

        def walk(tree: Tree, inverse_sum: Fraction, depth: int) -> None:
            if isinstance(tree, int):
                share = self._exact[tree]
                bounds[tree] = 0.0 if depth == 0 else float((1 + share * inverse_sum) / 2)
                return
            below = inverse_sum + (1 / self._weight(tree) if depth > 0 else 0)
            walk(tree[0], below, depth + 1)
            walk(tree[1], below, depth + 1)

        walk(self._tree, Fraction(0), 0)
        return bounds

    # -- what it is ---------------------------------------------------------------------------

    @property
    def weights(self) -> tuple[float, ...]:
        """Normalised weights (sum 1), as floats."""
        return tuple(float(weight) for weight in self._exact)

    @property
    def exact_weights(self) -> tuple[Fraction, ...]:
        """Normalised weights as exact fractions (what the bound is measured against)."""
        return tuple(self._exact)

    @property
    def tree(self) -> Tree:
        """The tree of sources, as nested pairs of source indices."""
        return self._tree

    @property
    def bounds(self) -> tuple[float, ...]:
        """Per source, the largest ``|c_s(n) - w_s * n|`` over all ``n`` (0 for absent ones)."""
        return tuple(self._bounds)

    @property
    def bound(self) -> float:
        """The largest per-source bound: every prefix is within this of its share."""
        return max(self._bounds)

    def __repr__(self) -> str:
        weights = ", ".join(f"{weight:.4g}" for weight in self.weights)
        return f"Interleave(weights=[{weights}], bound={self.bound:.4f})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Interleave) and self._exact == other._exact

    def __hash__(self) -> int:
        return hash(tuple(self._exact))

    # -- evaluation -----------------------------------------------------------------------

    def counts(self, n: npt.ArrayLike) -> np.ndarray:
        """Positions each source holds among the first ``n``.

        Parameters
        ----------
        n : array_like of int
            Prefix lengths in ``[0, MAX_POSITION]``; any shape.

        Returns
        -------
        numpy.ndarray
            ``int64`` array shaped ``n.shape + (num_sources,)``; each row sums to its ``n``.
        """
        prefix = np.asarray(n)
        if prefix.dtype.kind not in "iu":
            raise LoaderConfigError(f"prefix lengths must be integers, got dtype {prefix.dtype}")
        if prefix.size and (prefix.min() < 0 or prefix.max() > MAX_POSITION):
            raise OutOfRangeError(
                f"prefix lengths must lie in [0, {MAX_POSITION}], found "
                f"[{prefix.min()}, {prefix.max()}] for {self!r}"
            )
        out = np.zeros((*prefix.shape, self.num_sources), dtype=np.int64)
        values: dict[int, np.ndarray] = {self._root: prefix.astype(np.int64)}
        for split in self._splits:
            count = values.pop(split.node)
            smaller = np.floor(count * split.ratio + 0.5).astype(np.int64)
            values[split.smaller] = smaller
            values[split.larger] = count - smaller
        for source, count in values.items():
            out[..., source] = count
        return out

    def sources(self, positions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
        """Source of each position, and the position's index among that source's draws.

        Parameters
        ----------
        positions : array_like of int
            Positions in ``[0, MAX_POSITION)``; any shape.

        Returns
        -------
        sources, draws : numpy.ndarray
            ``int64`` arrays shaped like ``positions``: ``draws`` is how many earlier
            positions hold the same source (``counts(position)[source]``).
        """
        index = np.asarray(positions)
        if index.dtype.kind not in "iu":
            raise LoaderConfigError(f"positions must be integers, got dtype {index.dtype}")
        if index.size and (index.min() < 0 or index.max() >= MAX_POSITION):
            raise OutOfRangeError(
                f"positions must lie in [0, {MAX_POSITION}), found "
                f"[{index.min()}, {index.max()}] for {self!r}"
            )
        flat = index.astype(np.int64).reshape(-1)
        source = np.full(flat.shape, self._root, dtype=np.int64)
        draw = flat.copy()
        if self._splits:
            source, draw = self._descend(flat)
        return source.reshape(index.shape), draw.reshape(index.shape)

    def _descend(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Follow each position down the tree: at a node holding ``P`` earlier positions,
        the position goes to the child whose count grows from ``P`` to ``P + 1``."""
        node = np.full(positions.shape, self._root, dtype=np.int64)
        before = positions.copy()  # earlier positions held by the current node
        for split in self._splits:  # top-down: a node is split after its parent
            here = np.flatnonzero(node == split.node)
            if here.size == 0:
                continue
            count = before[here]
            smaller_before = np.floor(count * split.ratio + 0.5).astype(np.int64)
            smaller_after = np.floor((count + 1) * split.ratio + 0.5).astype(np.int64)
            to_smaller = smaller_after > smaller_before
            node[here] = np.where(to_smaller, split.smaller, split.larger)
            before[here] = np.where(to_smaller, smaller_before, count - smaller_before)
        return node, before
