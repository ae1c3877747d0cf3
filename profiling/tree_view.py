"""Two views of a step's drafted tree that stay readable up to B = 1024, and the node choice they share.

- The focus ladder: the spine (the accepted path, or the path from the root to a chosen node off it), one row per
  depth: the spine's node first, then its siblings by draft rank, each labelled with its token piece, node id,
  rank, cumulative log-prob and the size of the subtree below it, which stays folded; past MAX_SIBLINGS siblings
  the rest fold into one "+N more" box. After the spine's last node come its children (and, after the last
  accepted node, the bonus token). At most MAX_SIBLINGS + 2 boxes a row whatever B is, so every box is readable.
- The icicle: every node, its width proportional to its subtree, for the tree's shape at a glance (click a box to
  zoom into its subtree; labels show where they fit).
"""
from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import plotly.graph_objects as go

from engine.records import StepRecord, TreeRecord
from profiling.figures import COLORS, node_hover, node_kind, real_nodes

MAX_SIBLINGS = 7  # boxes beside the spine's node in a ladder row; the rest fold into one box
FILLS = {"root": "#d9d9d9", "accepted": "#a6dba0", "rejected": "#f6c6c6", "more": "#f0f0f0", "bonus": "#ffe08a"}
FOCUS_LINE = "#ff7f0e"
EDGE = "#9a9a9a"
HALF_HEIGHT = 0.32  # of a box, in rows
TEXT = "#222222"
CLICKED = {"marker": {"opacity": 0}, "textfont": {"color": TEXT}}
MAX_PIECE = 12  # characters of a token piece shown in a box


@dataclass(frozen=True, slots=True)
class Box:
    """One box of the ladder: a node, a fold of siblings (node None, kind "more") or the bonus token."""

    depth: int  # its row
    col: int
    kind: str  # "root", "accepted", "rejected", "more", "bonus"
    node: int | None = None
    below: int = 0  # nodes in its subtree under it (a fold: nodes in the folded siblings' subtrees, them included)
    folded: int = 0  # a fold: how many siblings it stands for


def children_by_rank(tree: TreeRecord) -> dict[int, list[int]]:
    """Every real node's children, lowest draft rank first (padding nodes left out)."""
    kids: dict[int, list[int]] = {n: [] for n in real_nodes(tree)}
    for n in real_nodes(tree)[1:]:
        kids[tree.parents[n]].append(n)
    for k in kids.values():
        k.sort(key=lambda c: (tree.ranks[c], c))
    return kids


def subtree_sizes(tree: TreeRecord) -> dict[int, int]:
    """Nodes in each real node's subtree, itself included (parents precede children, so one backward pass)."""
    size = dict.fromkeys(real_nodes(tree), 1)
    for n in reversed(real_nodes(tree)[1:]):
        size[tree.parents[n]] += size[n]
    return size


def ancestry(tree: TreeRecord, node: int) -> list[int]:
    """The nodes from the root to `node`, both included."""
    chain = [node]
    while chain[-1] != 0:
        chain.append(tree.parents[chain[-1]])
    return chain[::-1]


def spine(step: StepRecord, focus: int) -> list[int]:
    """The ladder's spine: the accepted path when the focus is on it, else the path from the root to the focus."""
    return list(step.path) if focus in step.path else ancestry(step.tree, focus)


def ladder(step: StepRecord, focus: int, max_siblings: int = MAX_SIBLINGS) -> list[Box]:
    """The focus ladder's boxes, row by row (see the module's docstring)."""
    tree = step.tree
    kids, size = children_by_rank(tree), subtree_sizes(tree)
    chain = spine(step, focus)

    def row(depth: int, first: Box | None, others: list[int]) -> list[Box]:
        boxes = [first] if first is not None else []
        start = len(boxes)
        shown = others[:max_siblings + 1 - start]
        boxes += [Box(depth, start + i, node_kind(step, n), n, size[n] - 1) for i, n in enumerate(shown)]
        rest = others[len(shown):]
        if rest:
            boxes.append(Box(depth, len(boxes), "more", None, sum(size[n] for n in rest), len(rest)))
        return boxes

    boxes = [Box(0, 0, "root", 0, size[0] - 1)]
    for depth, (parent, node) in enumerate(pairwise(chain), start=1):
        boxes += row(depth, Box(depth, 0, node_kind(step, node), node, size[node] - 1),
                     [c for c in kids[parent] if c != node])
    last = chain[-1]
    bonus = Box(len(chain), 0, "bonus") if last == step.path[-1] else None
    return boxes + row(len(chain), bonus, kids[last])


def ladder_nodes(boxes: list[Box]) -> list[int]:
    """The tree nodes the ladder shows, in node order."""
    return sorted(b.node for b in boxes if b.node is not None)


def _piece(token: int, piece: Callable[[int], str] | None) -> str:
    text = str(token) if piece is None else piece(token)
    return text if len(text) <= MAX_PIECE else text[:MAX_PIECE - 1] + "…"


def box_label(step: StepRecord, box: Box, piece: Callable[[int], str] | None = None) -> str:
    """What a box shows without hovering: token piece; node id and draft rank; cumulative log-prob and the
    folded nodes below it. The depth is the row's."""
    tree = step.tree
    if box.kind == "bonus":
        return f"<b>{html.escape(_piece(step.bonus, piece), quote=False)}</b><br>bonus token"
    if box.kind == "more":
        return f"+{box.folded} more<br>sibling{'s' * (box.folded > 1)}<br>{box.below} node{'s' * (box.below > 1)}"
    n = box.node
    below = f" · +{box.below}" if box.below else ""
    return (f"<b>{html.escape(_piece(tree.tokens[n], piece), quote=False)}</b><br>#{n} · rank {tree.ranks[n]}<br>"
            f"{tree.scores[n]:.2f}{below}")


def _ladder_edges(boxes: list[Box]) -> list[tuple[str, list, list]]:
    """The lines from each row's spine node to the row below: down, along the gap, down to each box (grey);
    the spine's own link green where the node below is accepted, gold to the bonus."""
    last_col: dict[int, int] = {}
    for b in boxes:
        last_col[b.depth] = max(last_col.get(b.depth, 0), b.col)
    xs: list[float | None] = []
    ys: list[float | None] = []
    spine_links = []
    for depth in sorted(d for d in last_col if d > 0):
        mid = depth - 0.5
        xs += [0, 0, None, 0, last_col[depth], None]
        ys += [depth - 1 + HALF_HEIGHT, mid, None, mid, mid, None]
        for b in (b for b in boxes if b.depth == depth):
            xs += [b.col, b.col, None]
            ys += [mid, depth - HALF_HEIGHT, None]
            if b.col == 0 and b.kind in ("accepted", "bonus"):
                spine_links.append((COLORS["accepted"] if b.kind == "accepted" else COLORS["bonus"],
                                    [0, 0], [depth - 1 + HALF_HEIGHT, depth - HALF_HEIGHT]))
    return [(EDGE, xs, ys), *spine_links]


def ladder_figure(step: StepRecord, focus: int, piece: Callable[[int], str] | None = None,
                  max_siblings: int = MAX_SIBLINGS) -> go.Figure:
    """The focus ladder: boxes on a grid (column, depth), edges from each spine node to the row below, the focus
    outlined. A node's hover adds the target's pick (and its probabilities at T > 0)."""
    boxes = ladder(step, focus, max_siblings)
    fig = go.Figure()
    for colour, xs, ys in _ladder_edges(boxes):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"color": colour, "width": 1 if colour == EDGE else 3}))
    shapes = [{"type": "rect", "x0": b.col - 0.46, "x1": b.col + 0.46, "y0": b.depth - HALF_HEIGHT,
               "y1": b.depth + HALF_HEIGHT, "fillcolor": FILLS[b.kind], "layer": "below",
               "line": {"color": FOCUS_LINE if b.node == focus else "#8c8c8c", "width": 3 if b.node == focus else 1,
                        "dash": "dot" if b.kind == "more" else "solid"}} for b in boxes]
    hover = [node_hover(step, b.node, piece) if b.node is not None else
             (f"bonus token {step.bonus}: the target's pick at node {step.path[-1]}" if b.kind == "bonus" else
              f"{b.folded} more siblings, {b.below} nodes with their subtrees: choose one in Focus node")
             for b in boxes]
    fig.add_trace(go.Scatter(x=[b.col for b in boxes], y=[b.depth for b in boxes], mode="markers+text",
                             text=[box_label(step, b, piece) for b in boxes], textfont={"size": 11, "color": TEXT},
                             selected=CLICKED, unselected=CLICKED,  # a click moves the focus, dims nothing
                             customdata=[-1 if b.node is None else b.node for b in boxes], hovertext=hover,
                             hoverinfo="text", showlegend=False,
                             marker={"size": 40, "symbol": "square", "opacity": 0}))
    num_rows = max(b.depth for b in boxes) + 1
    fig.update_layout(
        title={"text": f"{step.mode} step {step.index}: focus on node {focus} ({len(boxes)} of "
                       f"{len(real_nodes(step.tree))} nodes shown)<br><sup>green accepted · red rejected · gold "
                       "bonus · orange outline the focus · +n: nodes folded below · grey: more siblings</sup>"},
        xaxis={"visible": False, "range": [-0.55, max_siblings + 1.55]},
        yaxis={"range": [num_rows - 0.5, -0.5], "tickvals": list(range(num_rows)),
               "ticktext": [f"depth {d}" for d in range(num_rows)], "zeroline": False, "showgrid": False},
        height=110 + 64 * num_rows, margin={"l": 60, "r": 10, "t": 70, "b": 10}, dragmode="pan",
        plot_bgcolor="white", shapes=shapes,
        clickmode="event+select")
    return fig


def icicle_arrays(step: StepRecord, piece: Callable[[int], str] | None = None) -> dict[str, list]:
    """go.Icicle's ids, parents ("" for the root), labels and per-node kinds over the real nodes; each node's
    value is 1 and branchvalues "remainder", so a box's size is its subtree's node count."""
    tree = step.tree
    nodes = real_nodes(tree)
    return {"ids": [str(n) for n in nodes], "parents": ["" if n == 0 else str(tree.parents[n]) for n in nodes],
            "labels": [_piece(tree.tokens[n], piece) for n in nodes], "kinds": [node_kind(step, n) for n in nodes],
            "nodes": nodes}


def icicle_figure(step: StepRecord, focus: int, piece: Callable[[int], str] | None = None) -> go.Figure:
    a = icicle_arrays(step, piece)
    tree = step.tree
    fig = go.Figure(go.Icicle(
        ids=a["ids"], parents=a["parents"], labels=a["labels"], values=[1] * len(a["ids"]), branchvalues="remainder",
        marker={"colors": [FOCUS_LINE if n == focus else FILLS[k] for n, k in zip(a["nodes"], a["kinds"],
                                                                                 strict=True)]},
        customdata=[[tree.ranks[n], tree.scores[n], n] for n in a["nodes"]],
        texttemplate="%{label}<br>r%{customdata[0]} %{customdata[1]:.2f}",
        hovertext=[node_hover(step, n, piece) for n in a["nodes"]], hoverinfo="text",
        tiling={"orientation": "v"}, sort=False, marker_line={"width": 0.5, "color": "white"}))
    fig.update_layout(title={"text": f"{step.mode} step {step.index}: the whole tree ({len(a['ids'])} nodes)<br>"
                                     "<sup>width: subtree size · click a box to zoom in, the bar above to go back"
                                     "</sup>"},
                      uniformtext={"minsize": 9, "mode": "hide"}, height=520,
                      margin={"l": 10, "r": 10, "t": 70, "b": 10})
    return fig
