"""profiling/tree_view.py on random trees up to 1024 nodes built by the tree_build op: the icicle's hierarchy
against the tree's parent array, the ladder's rows against the children and subtree sizes read off the
visibility mask, and the size of the figures at B = 1024."""
from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest
import torch

from engine.records import StepRecord, TreeRecord
from kernels import ops
from profiling.figures import mask_figure
from profiling.tree_view import (
    FOCUS_LINE,
    MAX_SIBLINGS,
    box_label,
    icicle_arrays,
    icicle_figure,
    ladder,
    ladder_figure,
    ladder_nodes,
    subtree_sizes,
)


def piece(token: int) -> str:
    return f"t{token}<&>"


def random_step(rng: random.Random, budget: int | None = None, vocab: int | None = None) -> StepRecord:
    """A tree from the tree_build op over a random draft (padding where the draft allows fewer nodes), its
    accepted path the root's chain to a random node (read off the visibility mask)."""
    budget = rng.randint(1, 1024) if budget is None else budget
    depth, vocab = rng.randint(2, 12), vocab or rng.choice([2, 5, 40, 600])
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    draft = torch.log_softmax(torch.randn(depth, vocab, generator=gen) * rng.uniform(0.5, 4.0), -1)
    built = ops.tree_build(draft, torch.tensor(rng.randrange(vocab)), budget)
    vis = built.visibility.numpy()
    tree = TreeRecord(built.tokens.tolist(), built.parents.tolist(), built.depths.tolist(), built.ranks.tolist(),
                      built.scores.tolist(), vis)
    real = [0] + [n for n in range(1, tree.num_nodes) if tree.parents[n] >= 0]
    end = rng.choice(real)
    path = [int(j) for j in np.flatnonzero(vis[end])]  # its ancestors and itself, parents first
    n = tree.num_nodes
    return StepRecord(index=rng.randrange(10), mode="ddtree", prefix_len=rng.randrange(100), tree=tree,
                      target=[rng.randrange(vocab) for _ in range(n)], logit_gap=[1.0] * n, path=path,
                      bonus=rng.randrange(vocab), committed=[])


def real_nodes_of(tree: TreeRecord) -> list[int]:
    return [0] + [n for n in range(1, tree.num_nodes) if tree.parents[n] >= 0]


def sizes_from_mask(tree: TreeRecord) -> dict[int, int]:
    """A node's subtree: every node that sees it (itself included)."""
    vis = np.asarray(tree.visibility)
    return {n: int(vis[:, n].sum()) for n in real_nodes_of(tree)}


@pytest.mark.parametrize("seed", [random.randrange(2**31) for _ in range(12)])
def test_icicle_hierarchy_is_the_parent_array(seed):
    step = random_step(random.Random(seed))
    tree = step.tree
    a = icicle_arrays(step, piece)
    real = real_nodes_of(tree)
    assert a["ids"] == [str(n) for n in real], seed
    assert a["parents"] == ["" if n == 0 else str(tree.parents[n]) for n in real]
    assert set(a["parents"]) - {""} <= set(a["ids"]), "every parent is a node of the figure"
    assert all(label.startswith(piece(tree.tokens[n])[:11]) for label, n in zip(a["labels"], real, strict=True))
    assert subtree_sizes(tree) == sizes_from_mask(tree), "the widths the icicle draws (values 1, remainder)"
    fig = icicle_figure(step, step.path[-1], piece).data[0]
    assert list(fig.values) == [1] * len(real) and fig.branchvalues == "remainder"


@pytest.mark.parametrize("seed", [random.randrange(2**31) for _ in range(25)])
def test_the_ladder_shows_the_spine_its_siblings_and_folds_the_rest(seed):
    rng = random.Random(seed)
    step = random_step(rng)
    tree = step.tree
    size = sizes_from_mask(tree)
    real = real_nodes_of(tree)
    focus = rng.choice(real)
    vis = np.asarray(tree.visibility)
    chain = step.path if focus in step.path else [int(j) for j in np.flatnonzero(vis[focus])]
    boxes = ladder(step, focus)
    rows: dict[int, list] = {}
    for b in boxes:
        rows.setdefault(b.depth, []).append(b)
    assert sorted(rows) == list(range(max(rows) + 1)) and len(rows) in (len(chain), len(chain) + 1), seed
    for depth, row in rows.items():
        assert [b.col for b in row] == list(range(len(row))) and len(row) <= MAX_SIBLINGS + 2
        if depth == 0:
            assert [(b.node, b.kind) for b in row] == [(0, "root")]
            continue
        parent = chain[depth - 1]
        kids = sorted((c for c in real[1:] if tree.parents[c] == parent), key=lambda c: (tree.ranks[c], c))
        shown = [b.node for b in row if b.node is not None]
        if depth < len(chain):
            assert row[0].node == chain[depth]
            assert shown[1:] == [c for c in kids if c != chain[depth]][:len(shown) - 1], "lowest ranks first"
        else:
            assert (row[0].kind == "bonus") == (chain[-1] == step.path[-1])
            assert shown == kids[:len(shown)]
        folds = [b for b in row if b.kind == "more"]
        hidden = [c for c in kids if c not in shown]
        assert len(folds) == (1 if hidden else 0)
        if folds:
            assert folds[0].col == len(row) - 1 and folds[0].folded == len(hidden)
            assert folds[0].below == sum(size[c] for c in hidden)
    for b in boxes:
        if b.node is not None:
            assert b.below == size[b.node] - 1
            assert b.kind == ("root" if b.node == 0 else "accepted" if b.node in step.path else "rejected")
            label = box_label(step, b, piece)
            assert f"#{b.node} · rank {tree.ranks[b.node]}" in label and f"{tree.scores[b.node]:.2f}" in label
            assert "t" + str(tree.tokens[b.node]) in label and "<&>" not in label, "the piece, escaped"


@pytest.mark.parametrize("seed", [random.randrange(2**31) for _ in range(5)])
def test_the_ladder_figure_outlines_the_focus_and_the_mask_follows_it(seed):
    rng = random.Random(seed)
    step = random_step(rng)
    focus = rng.choice(real_nodes_of(step.tree))
    boxes = ladder(step, focus)
    fig = ladder_figure(step, focus, piece)
    assert len(fig.layout.shapes) == len(boxes)
    outlined = [s for s in fig.layout.shapes if s.line.color == FOCUS_LINE]
    mine = next(b for b in boxes if b.node == focus)
    assert len(outlined) == 1 and outlined[0].x0 < mine.col < outlined[0].x1 and outlined[0].y0 < mine.depth
    labels = fig.data[-1]
    assert list(labels.text) == [box_label(step, b, piece) for b in boxes]
    assert list(labels.customdata) == [-1 if b.node is None else b.node for b in boxes]
    nodes = ladder_nodes(boxes)
    mask = mask_figure(step, focus, nodes)
    vis = np.asarray(step.tree.visibility, dtype=np.int8)
    on_path = np.isin(np.arange(len(vis)), step.path)
    want = vis + (vis.astype(bool) & on_path[:, None] & on_path[None, :])
    assert np.array_equal(np.asarray(mask.data[0].z), want[np.ix_(nodes, nodes)])
    assert list(mask.data[0].y) == [str(n) for n in nodes]
    row = nodes.index(focus)
    assert (mask.layout.shapes[0].y0, mask.layout.shapes[0].y1) == (row - 0.5, row + 0.5)


def test_the_views_of_a_1024_node_tree_stay_small_and_quick():
    """Measured on the CPU: the ladder, the icicle and the shown nodes' mask at B = 1024 (the whole mask is a
    1025 x 1025 heatmap of about 1.4 MB, drawn only on request)."""
    step = random_step(random.Random(1), budget=1024, vocab=600)
    assert len(real_nodes_of(step.tree)) == 1025
    focus = step.path[-1]
    ladder_figure(step, focus, piece)  # plotly's first figure pays for its imports
    sizes, seconds = {}, {}
    for name, make in {"ladder": lambda: ladder_figure(step, focus, piece),
                       "icicle": lambda: icicle_figure(step, focus, piece),
                       "mask": lambda: mask_figure(step, focus, ladder_nodes(ladder(step, focus)))}.items():
        start = time.perf_counter()
        sizes[name] = len(make().to_json())
        seconds[name] = time.perf_counter() - start
    print(f"B = 1024: bytes {sizes}, seconds {seconds}")
    assert sizes["ladder"] < 40_000 and sizes["mask"] < 30_000 and sizes["icicle"] < 600_000, sizes
    assert sum(seconds.values()) < 5.0, seconds
    json.loads(ladder_figure(step, focus, piece).to_json())
