"""The Decode page's tree section, readable at any budget up to B = 1024 (profiling/tree_view.py): one focus node,
chosen in a selectbox, by a row of the path table or by a click on a box of the ladder, and four views that
follow it: the focus ladder, the table of its spine and their siblings, the icicle of the whole tree and the
visibility mask with the focus's row outlined (for a large tree, the mask of the nodes the ladder shows)."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from engine.records import StepRecord
from profiling.figures import MAX_LABELLED_NODES, mask_figure, node_kind, real_nodes
from profiling.tree_view import icicle_figure, ladder, ladder_figure, ladder_nodes, spine
from ui import views
from ui.step_cache import cached

FOCUS = "tree_focus"
FOCUS_OF = "tree_focus_of"  # the step the focus was chosen in: a new step starts at its last accepted node
PLOTLY_CONFIG = {"displaylogo": False}


def _set_focus(node: int) -> None:
    st.session_state[FOCUS] = node


def _on_ladder_click() -> None:
    points = st.session_state.ladder.selection.points
    nodes = [p["customdata"] for p in points if p.get("customdata", -1) >= 0]
    if nodes:
        _set_focus(int(nodes[0]))


def _on_table_pick(key: str, rows: list[dict]) -> Callable[[], None]:
    def pick() -> None:
        chosen = st.session_state[key].selection.rows
        if chosen and chosen[0] < len(rows):
            _set_focus(rows[chosen[0]]["node"])
    return pick


def focus_label(step: StepRecord, node: int, piece: Callable[[int], str] | None) -> str:
    tree = step.tree
    token = str(tree.tokens[node]) if piece is None else f"{tree.tokens[node]} {piece(tree.tokens[node])!r}"
    return (f"node {node} · {token} · depth {tree.depths[node]} · rank {tree.ranks[node]} · log-prob "
            f"{tree.scores[node]:.3f} · {node_kind(step, node)}")


def section(step: StepRecord, piece: Callable[[int], str] | None) -> None:
    options = real_nodes(step.tree)
    signature = (step.mode, step.index, step.prefix_len, tuple(step.path))
    if st.session_state.get(FOCUS_OF) != signature or st.session_state.get(FOCUS) not in options:
        st.session_state[FOCUS_OF] = signature
        _set_focus(step.path[-1])
    focus = st.selectbox("Focus node", options, key=FOCUS, format_func=lambda n: focus_label(step, n, piece),
                         help="The views below follow it: click a box of the ladder or a row of the table to move it")
    boxes = cached("ladder_boxes", step, focus, lambda: ladder(step, focus))
    with st.container(key="tree"):
        st.plotly_chart(cached("ladder", step, focus, lambda: ladder_figure(step, focus, piece)), width="stretch",
                        config=PLOTLY_CONFIG, key="ladder", on_select=_on_ladder_click, selection_mode="points")
    st.caption("The ladder: one row per depth along the accepted path (or the path to a focus off it), its node "
               "first, then its siblings by draft rank; each box shows the token piece, node id, draft rank and "
               "cumulative log-prob, and +n counts the nodes folded below it. Click a box to focus on it.")
    rows = cached("path_rows", step, focus, lambda: views.path_rows(step, piece, spine(step, focus)))
    table_key = f"path_nodes_{focus}"  # a fresh table (no stale selection) for each focus
    st.dataframe(rows, hide_index=True, width="stretch", key=table_key, on_select=_on_table_pick(table_key, rows),
                 selection_mode="single-row", column_config={
                     "cum. log-prob": st.column_config.NumberColumn(format="%.3f"),
                     "accepted": st.column_config.CheckboxColumn()})
    st.caption("Every sibling along that path (the drafter's other candidates) and the children of its last node; "
               "select a row to focus on it.")
    overview_col, mask_col = st.columns(2)
    with overview_col.container(key="tree_overview"):
        st.plotly_chart(cached("icicle", step, focus, lambda: icicle_figure(step, focus, piece)), width="stretch",
                        config=PLOTLY_CONFIG, key="icicle_chart")
    with mask_col.container(key="mask"):
        whole = step.tree.num_nodes <= MAX_LABELLED_NODES or st.toggle(
            f"The whole {step.tree.num_nodes} x {step.tree.num_nodes} mask", key="whole_mask",
            help="Else the mask over the nodes the ladder shows, where one node's row is readable")
        mask = cached("mask", step, (focus, whole),
                      lambda: mask_figure(step, focus, None if whole else ladder_nodes(boxes)))
        st.plotly_chart(mask, width="stretch", config=PLOTLY_CONFIG, key="mask_chart")
