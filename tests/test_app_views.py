"""The dashboard's renderers without a server: colours that stay apart, token chips that carry their pieces and
ids, the acceptance-by-rank counts, the shared time axis of the runs, and the labelled path of a large tree."""
from __future__ import annotations

import html
import random
import re

import numpy as np
import pytest

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from profiling.figures import mask_figure
from ui.charts import accepted_ranks, distinct_colours, runs_timeline
from ui.views import PREFILL_COLOUR, path_rows, step_colour, tokens_html


def test_step_colours_do_not_repeat_and_alternate_in_shade():
    colours = [step_colour(i) for i in range(200)]
    assert len(set(colours)) == len(colours) and PREFILL_COLOUR not in colours
    assert step_colour(0) != step_colour(8)
    lightness = [int(re.search(r"(\d+)%\)$", c).group(1)) for c in colours[:4]]
    assert lightness[0] != lightness[1] and lightness[0] == lightness[2]


def test_distinct_colours_stay_distinct_past_the_palette():
    for n in (1, 5, 24, 25, random.randint(26, 120)):
        colours = distinct_colours(n)
        assert len(colours) == n and len(set(colours)) == n


def test_token_chips_show_pieces_escaped_with_ids_and_steps_on_hover():
    tokens = [(random.randrange(1000), step) for step in range(-1, 6)]
    pieces = {t: f"<{t}&·>" for t, _ in tokens}
    chips = re.findall(r'title="id (\d+) · ([^"]+)"[^>]*>([^<]*)</span>', tokens_html(tokens, pieces.get))
    assert [(int(i), label, html.unescape(text)) for i, label, text in chips] == [
        (t, "prefill" if s < 0 else f"step {s}", pieces[t]) for t, s in tokens]


def test_accepted_ranks_count_the_path_nodes_ranks(tiny_checkpoint):
    run = decode(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), DecodeConfig(budget=random.randint(8, 40)),
                 "ddtree", DrafterSpec("oracle", noise=0.6, seed=random.randrange(100)))
    counts = accepted_ranks(run)
    assert sum(counts) == sum(s.num_accepted for s in run.steps)
    for rank, count in enumerate(counts):
        assert count == sum(s.tree.ranks[n] == rank for s in run.steps for n in s.path[1:])


def test_the_runs_share_one_time_axis(tiny_checkpoint):
    prompt, cfg = tiny_checkpoint.prompt.tolist(), DecodeConfig(budget=random.randint(2, 20))
    runs = {mode: decode(tiny_checkpoint, prompt, cfg, mode) for mode in ("ar", "ddtree")}
    fig = runs_timeline(runs)
    for trace, run in zip(fig.data, runs.values(), strict=True):
        widths = [run.prefill_ns / 1e6, *(s.wall_ns / 1e6 for s in run.steps)]
        assert list(trace.x) == pytest.approx(widths)
        assert list(trace.base) == pytest.approx(np.cumsum([0.0, *widths[:-1]]))


def test_path_rows_hold_the_path_and_its_siblings_and_the_mask_outlines_a_node(tiny_checkpoint):
    run = decode(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), DecodeConfig(budget=random.randint(16, 200)),
                 "ddtree", DrafterSpec("oracle", noise=0.5, seed=random.randrange(100)))
    step = random.choice(run.steps)
    tree = step.tree
    rows = path_rows(step)
    want = {0} | {c for n in step.path for c in range(1, tree.num_nodes) if tree.parents[c] == n}
    assert {r["node"] for r in rows} == want and len(rows) == len(want)
    for r in rows:
        n = r["node"]
        assert (r["token"], r["depth"], r["rank"], r["cum. log-prob"]) == (tree.tokens[n], tree.depths[n],
                                                                             tree.ranks[n], tree.scores[n])
        assert r["accepted"] == (n in step.path)
    node = random.choice(sorted(want))
    shape = mask_figure(step, node).layout.shapes[0]
    assert (shape.y0, shape.y1) == (node - 0.5, node + 0.5) and not mask_figure(step).layout.shapes
