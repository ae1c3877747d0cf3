"""Plotly figures of one step: the drafted tree (node-link) and its visibility mask. The report and the
dashboard both draw steps with these.

Tree layout: x = depth; leaves take consecutive rows in depth-first order (siblings by draft rank), and
each parent sits at the mean row of its children, so every subtree occupies a contiguous band of rows.
"""
from __future__ import annotations

import html
from collections.abc import Callable

import numpy as np
import plotly.graph_objects as go

from engine.records import StepRecord, TreeRecord

COLORS = {"root": "#4c4c4c", "accepted": "#2ca02c", "rejected": "#d62728", "bonus": "#ffbf00"}
MAX_LABELLED_NODES = 64  # above this, token ids only in the hover text


def real_nodes(tree: TreeRecord) -> list[int]:
    """The root and every drafted node (padding nodes have parent -1 and are left out)."""
    return [0] + [i for i in range(1, tree.num_nodes) if tree.parents[i] >= 0]


def tree_layout(tree: TreeRecord, extra_leaf_under: int | None = None) -> dict[int, tuple[float, float]]:
    """Node -> (x, y) for the root and every drafted node. extra_leaf_under: also place a virtual last child
    of that node (key tree.num_nodes), e.g. the step's bonus token, in a row of its own."""
    extra = tree.num_nodes
    depths = {i: tree.depths[i] for i in real_nodes(tree)}
    children: dict[int, list[int]] = {i: [] for i in depths}
    for i in real_nodes(tree)[1:]:
        children[tree.parents[i]].append(i)
    for kids in children.values():
        kids.sort(key=lambda c: (tree.ranks[c], c))
    if extra_leaf_under is not None:
        children[extra_leaf_under].append(extra)
        children[extra] = []
        depths[extra] = depths[extra_leaf_under] + 1
    rows: dict[int, float] = {}
    next_row = 0
    stack = [(0, False)]
    while stack:  # iterative post-order: a node's row is known once its children have theirs
        node, expanded = stack.pop()
        if expanded or not children[node]:
            if children[node]:
                rows[node] = float(np.mean([rows[c] for c in children[node]]))
            else:
                rows[node] = float(next_row)
                next_row += 1
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children[node]))
    return {n: (float(depths[n]), rows[n]) for n in rows}


def node_kind(step: StepRecord, node: int) -> str:
    if node == 0:
        return "root"
    return "accepted" if node in step.path else "rejected"


def _label(token: int, piece: Callable[[int], str] | None) -> str:
    """A node's label: the token id, or its piece escaped (plotly reads <b>, <a href> and entities in text)."""
    return str(token) if piece is None else html.escape(piece(token), quote=False)


def _token(token: int, piece: Callable[[int], str] | None) -> str:
    return str(token) if piece is None else f"{token} {html.escape(repr(piece(token)), quote=False)}"


def node_hover(step: StepRecord, node: int, piece: Callable[[int], str] | None) -> str:
    t, p = step.tree, step.probs
    probs = "" if p is None else (f"<br>target p {p.target[node]:.3f}, drafter marginal {p.draft[node]:.3f}"
                                  f"<br>moves on with p {p.move_on[node]:.3f}")
    return (f"node {node} ({node_kind(step, node)})<br>token {_token(t.tokens[node], piece)}<br>"
            f"depth {t.depths[node]}, rank {t.ranks[node]}<br>cum. log-prob {t.scores[node]:.3f}<br>"
            f"target pick {_token(step.target[node], piece)}{probs}")


def tree_figure(step: StepRecord, piece: Callable[[int], str] | None = None, num_dropped: int = 0) -> go.Figure:
    """Node-link figure of the step's drafted tree: accepted path in green, the bonus token in gold. Nodes are
    labelled piece(token): the token id by default, its text piece where the model has a tokenizer. num_dropped:
    how many of the step's committed tokens fell past max_new_tokens (metrics.num_dropped), which the title and the
    bonus token's hover say were not committed."""
    tree = step.tree
    last = step.path[-1]
    pos = tree_layout(tree, extra_leaf_under=last)
    bonus_xy = pos.pop(tree.num_nodes)
    num_rows = 1 + int(max(bonus_xy[1], *(y for _, y in pos.values())))
    accepted_edges = set(zip(step.path[:-1], step.path[1:], strict=True))
    edge_xy: dict[bool, tuple[list, list]] = {True: ([], []), False: ([], [])}
    for node in pos:
        if node == 0:
            continue
        parent = tree.parents[node]
        xs, ys = edge_xy[(parent, node) in accepted_edges]
        xs += [pos[parent][0], pos[node][0], None]
        ys += [pos[parent][1], pos[node][1], None]
    fig = go.Figure()
    for on_path, (xs, ys) in edge_xy.items():
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip", showlegend=False,
                                 line={"color": COLORS["accepted"] if on_path else "#b0b0b0",
                                       "width": 3 if on_path else 1}))
    fig.add_trace(go.Scatter(x=[pos[last][0], bonus_xy[0]], y=[pos[last][1], bonus_xy[1]], mode="lines",
                             hoverinfo="skip", showlegend=False, line={"color": COLORS["bonus"], "dash": "dot"}))
    labelled = len(pos) <= MAX_LABELLED_NODES
    dropped = f" · the last {num_dropped} not committed (max_new_tokens)" if num_dropped else ""
    for kind in ("root", "accepted", "rejected"):
        nodes = [n for n in pos if node_kind(step, n) == kind]
        fig.add_trace(go.Scatter(
            x=[pos[n][0] for n in nodes], y=[pos[n][1] for n in nodes], name=kind,
            mode="markers+text" if labelled else "markers", text=[_label(tree.tokens[n], piece) for n in nodes],
            textposition="top center", hovertext=[node_hover(step, n, piece) for n in nodes], hoverinfo="text",
            marker={"color": COLORS[kind], "size": 12 if labelled else 7, "line": {"width": 1, "color": "white"}}))
    fig.add_trace(go.Scatter(x=[bonus_xy[0]], y=[bonus_xy[1]], name="bonus", mode="markers+text",
                             text=[_label(step.bonus, piece)], textposition="top center",
                             hovertext=[f"bonus token {_token(step.bonus, piece)}<br>target pick at node {last}"
                                        + ("<br>not committed: max_new_tokens reached" if num_dropped else "")],
                             hoverinfo="text", marker={"color": COLORS["bonus"], "size": 12, "symbol": "star"}))
    fig.update_layout(title=f"{step.mode} step {step.index}: {len(pos)} nodes, {step.num_accepted} accepted "
                            f"+ bonus{dropped}", xaxis={"title": "depth", "dtick": 1},
                      yaxis={"visible": False, "range": [num_rows - 0.4, -0.6]},
                      height=min(1600, 160 + 44 * num_rows),
                      margin={"l": 20, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h"})
    return fig


def mask_figure(step: StepRecord, selected: int | None = None, nodes: list[int] | None = None) -> go.Figure:
    """The (B+1) x (B+1) visibility mask the step was verified with; cells between accepted nodes stand out.
    selected: a node whose row (what it attends to) is outlined. nodes: only these rows and columns, in this
    order and labelled by node id (a large tree's mask over the nodes a view shows)."""
    vis = np.asarray(step.tree.visibility, dtype=bool)  # [N, N]
    on_path = np.zeros(len(vis), dtype=bool)
    on_path[step.path] = True
    z = vis.astype(np.int8) + (vis & on_path[:, None] & on_path[None, :])
    axis = {} if nodes is None else {"x": [str(n) for n in nodes], "y": [str(n) for n in nodes]}
    if nodes is not None:
        z = z[np.ix_(nodes, nodes)]
    fig = go.Figure(go.Heatmap(
        z=z, zmin=0, zmax=2, showscale=False, **axis,
        colorscale=[[0, "#f4f4f4"], [0.5, "#6b8fd6"], [1.0, COLORS["accepted"]]],
        hovertemplate="query node %{y}, key node %{x}: %{z}<extra></extra>"))
    which = "visibility mask" if nodes is None else f"visibility mask of the {len(nodes)} nodes shown"
    fig.update_layout(title={"text": f"{step.mode} step {step.index}: {which}<br><sup>grey hidden · blue "
                                     "visible · green both nodes accepted</sup>", "y": 0.98}, height=520,
                      xaxis={"title": "key node", "side": "top", "type": "category" if nodes else "-"},
                      yaxis={"title": "query node", "autorange": "reversed", "type": "category" if nodes else "-"},
                      margin={"l": 40, "r": 20, "t": 110, "b": 20})
    if selected is not None and (nodes is None or selected in nodes):
        row = selected if nodes is None else nodes.index(selected)
        fig.add_shape(type="rect", x0=-0.5, x1=len(z) - 0.5, y0=row - 0.5, y1=row + 0.5,
                      line={"color": COLORS["bonus"], "width": 2}, name=f"node {selected}")
    return fig
