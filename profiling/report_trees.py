"""A recorded tree's rules on whole arrays, and its visibility mask.

A report of hundreds of steps at B = 1024 holds hundreds of thousands of nodes: profiling/report_checks.py walks a
tree node by node only where mask_if_valid() finds a rule broken, to name the first one and its place. It relies on
the document matching the schema exactly (profiling/report_schema_check.py: every id an int within 64 bits).
"""
from __future__ import annotations

import itertools

import numpy as np


def _flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(each row's length, every row's entries one after another)."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    return lengths, np.fromiter(itertools.chain.from_iterable(rows), np.int64, int(lengths.sum()))


def _scatter(lengths: np.ndarray, flat: np.ndarray) -> np.ndarray:
    n = len(lengths)
    mask = np.zeros((n, n), dtype=bool)
    mask[np.repeat(np.arange(n), lengths), flat] = True
    return mask


def mask_of_rows(rows: list[list[int]]) -> np.ndarray:
    """The [N, N] bool mask whose row i is True at the indices rows[i] lists (each within [0, N))."""
    return _scatter(*_flat(rows))


def mask_if_valid(tree: dict, size: int, max_depth: int, vocab: int) -> np.ndarray | None:
    """The visibility mask of tree (its arrays all of length size) where it keeps every rule report_checks.check_tree
    walks, else None."""
    tokens, ranks = tree["tokens"], tree["ranks"]
    if min(tokens) < 0 or max(tokens) >= vocab or min(ranks) < 0:
        return None
    parents, depths = np.array(tree["parents"], dtype=np.int64), np.array(tree["depths"], dtype=np.int64)
    if parents[0] != -1 or depths[0] != 0:
        return None
    nodes = np.arange(size)
    pad = parents == -1
    pad[0] = False
    if (depths[pad] != 0).any() or not all(tree["scores"][i] is None for i in np.flatnonzero(pad).tolist()):
        return None
    has_parent = ~pad
    has_parent[0] = False
    real = np.flatnonzero(has_parent)
    p = parents[real]
    if ((p < 0) | (p >= real)).any() or (depths[real] != depths[p] + 1).any() or (depths[real] > max_depth).any():
        return None
    # row i must be its parent's row, then i (the root and padding: [i] alone); by induction over the nodes (parents
    # first), that is exactly node i and its ancestors in increasing order
    lengths, flat = _flat(tree["visible"])
    parent_of = np.maximum(parents, 0)
    if (lengths != np.where(has_parent, lengths[parent_of] + 1, 1)).any():
        return None
    starts = np.cumsum(lengths) - lengths
    owner = np.repeat(nodes, lengths)  # the row of each entry
    at = np.arange(len(flat)) - starts[owner]  # its place in that row
    last = at == lengths[owner] - 1
    inherited = ~last
    if (flat[last] != owner[last]).any():
        return None
    if (flat[inherited] != flat[starts[parent_of[owner[inherited]]] + at[inherited]]).any():
        return None
    return _scatter(lengths, flat)
