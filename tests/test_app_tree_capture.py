"""Under AppTest: the Profile page's torch.profiler capture (CPU ops per range, as profiling.capture_view shapes
the capture the page took) and the Decode page's tree views at B = 1024 (the focus, the ladder, the path table
and the mask following it)."""
from __future__ import annotations

import base64
import json
import random
import time

import numpy as np
from test_app import plotly_specs, press, run, start

from profiling import capture_view
from profiling.figures import real_nodes
from profiling.tree_view import box_label, ladder, ladder_nodes, spine
from ui import views
from ui.tree_panel import focus_label


def test_the_profile_page_captures_with_torch_profiler_and_shows_cpu_ops_per_range():
    at = start()
    run(at.switch_page("app_pages/profile.py"))
    at.number_input(key="profile_repeats").set_value(1)
    run(at)
    assert any(i.value.startswith("No capture for these settings yet") for i in at.info)
    charts = len(plotly_specs(at))
    press(at, "Capture with torch.profiler")
    captured = at.session_state["live"].captured
    runs, cap = captured.runs, captured.capture
    assert cap.activities == ["cpu"] and list(cap.runs) == ["ar", "ddtree"]
    assert any("**CPU ops**" in c.value for c in at.caption), "labelled as CPU ops"
    assert len(plotly_specs(at)) == charts, "tables only"
    frames = [df.value for df in at.dataframe]
    summary = next(f for f in frames if "top_ops" in f.columns)
    want = [capture_view.run_summary(runs[m], rc, on_device=False) for m, rc in cap.runs.items()]
    assert summary.to_dict("records") == want
    ranges = next(f for f in frames if "CPU op calls" in f.columns)
    rows = capture_view.range_rows(runs["ddtree"], cap.runs["ddtree"], on_device=False)
    assert [r.strip("\u2003") for r in ranges["range"]] == [r["range"] for r in rows], "DDTree's ranges first"
    assert list(ranges["CPU op calls"]) == [r["op_calls"] for r in rows]
    picked = at.selectbox(key="capture_range")
    assert picked.value.startswith("step/") and picked.value in picked.options
    name = random.choice([o for o in picked.options if o != picked.value])
    picked.set_value(name)
    run(at)
    ops = next(df.value for df in at.dataframe if "op" in df.value.columns)
    assert ops.to_dict("records") == capture_view.op_rows(cap.runs["ddtree"], name)

    at.radio(key="capture_run").set_value("AR")
    run(at)
    ranges = next(df.value for df in at.dataframe if "CPU op calls" in df.value.columns)
    assert list(ranges["calls"].dropna()) == [r["calls"] for r in capture_view.range_rows(
        runs["ar"], cap.runs["ar"], on_device=False) if r["calls"] is not None]

    at.sidebar.number_input(key="budget").set_value(at.sidebar.number_input(key="budget").value + 1)
    run(at)
    assert any(i.value.startswith("No capture for these settings yet") for i in at.info), "taken with other settings"


def decoded_mask(spec: dict) -> np.ndarray:
    z = spec["data"][0]["z"]
    if isinstance(z, dict):  # plotly's typed-array encoding
        shape = [int(x) for x in str(z["shape"]).split(",")]
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z)


def test_the_decode_page_reads_a_1024_node_tree_by_its_focus(tiny_checkpoint):
    at = start()
    at.sidebar.number_input(key="budget").set_value(1024)
    run(at)
    press(at, "Step")
    step = at.session_state["live"].decoder.steps[-1]
    piece = views.piece_of(tiny_checkpoint.tokenizer)
    assert step.tree.num_nodes == 1025
    focus = at.selectbox(key="tree_focus")
    assert focus.options == [focus_label(step, n, piece) for n in real_nodes(step.tree)]
    assert focus.value == step.path[-1], "a new step starts at its last accepted node"
    start_s = time.perf_counter()
    run(at)
    rerun_s = time.perf_counter() - start_s
    specs = [json.loads(s) for s in plotly_specs(at)]
    print(f"B = 1024 Decode page: rerun {rerun_s:.2f} s, figures {[len(s) for s in plotly_specs(at)]} bytes")
    assert sum(len(s) for s in plotly_specs(at)) < 1_000_000, "the whole 1025 x 1025 mask is drawn only on request"

    off_path = [n for n in real_nodes(step.tree) if n not in step.path]
    for node in (random.choice(off_path), random.choice(step.path)):
        at.selectbox(key="tree_focus").set_value(node)
        run(at)
        specs = [json.loads(s) for s in plotly_specs(at)]
        ladder_spec, mask_spec = specs[0], specs[2]
        boxes = ladder(step, node)
        assert f"focus on node {node} " in ladder_spec["layout"]["title"]["text"]
        assert ladder_spec["data"][-1]["text"] == [box_label(step, b, piece) for b in boxes]
        table = at.dataframe[0].value
        assert list(table["node"]) == [r["node"] for r in views.path_rows(step, piece, spine(step, node))]
        shown = ladder_nodes(boxes)
        assert mask_spec["data"][0]["y"] == [str(n) for n in shown]
        row = shown.index(node)
        assert (mask_spec["layout"]["shapes"][0]["y0"], mask_spec["layout"]["shapes"][0]["y1"]) == (row - .5, row + .5)
        vis = np.asarray(step.tree.visibility)
        assert np.array_equal(decoded_mask(mask_spec) > 0, vis[np.ix_(shown, shown)])

    at.toggle(key="whole_mask").set_value(True)
    run(at)
    whole = json.loads(plotly_specs(at)[2])
    assert decoded_mask(whole).shape == (1025, 1025) and whole["layout"]["shapes"][0]["y0"] == node - 0.5
