"""The five exports, on synthetic runs and on real decodes (AR, chain, DDTree) of models/model_tiny.kdtr."""
from __future__ import annotations

import csv
import html
import html.parser
import io
import json
import os
import pathlib
import random

import jsonschema
import numpy as np
import pytest
from fake_records import fake_runs

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.drafters import DrafterSpec
from profiling import export_csv, figures, metrics, report
from profiling.capture import ProfEvent, attribute, capture_runs
from profiling.capture_data import Capture, KernelEvent, OpTime, RangeTime, RunCapture
from profiling.divergence import verdict
from profiling.measurement import Measurement
from profiling.schema import REPORT_SCHEMA

# -- real decodes -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_runs(tiny_checkpoint):
    from engine.decoding.session import decode_runs

    cfg = DecodeConfig(budget=random.randint(4, 24), block_size=random.randint(3, 8), max_new_tokens=12)
    return decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg,
                       DrafterSpec(noise=0.4, seed=random.randrange(1000)), ("chain", "ddtree"))


@pytest.fixture(scope="module")
def captured(tiny_checkpoint):
    cfg = DecodeConfig(budget=8, block_size=4, max_new_tokens=8)
    return capture_runs(DecodeRequest(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, DrafterSpec(noise=0.3),
                                      ("chain", "ddtree")))


def run_sets(real_runs) -> list[dict]:
    seed = random.randrange(2**31)
    return [real_runs, fake_runs(seed), fake_runs(seed + 1, diverge_at=random.randrange(17)),
            fake_runs(seed + 2, mode="chain")]


# -- checkers -----------------------------------------------------------------------------------------------


def check_trace(doc: dict) -> list[dict]:
    """Every X event lies inside the enclosing one on its track or after it; every pid/tid is named.

    Like Perfetto, compares integer ns (µs * 1000, rounded): float sums of µs values are inexact."""
    events = doc["traceEvents"]
    xs = [e for e in events if e["ph"] == "X"]
    assert xs and {e["ph"] for e in events} <= {"X", "M"}
    named_pids = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    named_tracks = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict[tuple, list] = {}
    for e in xs:
        assert e["dur"] >= 0 and e["ts"] >= 0 and isinstance(e["args"], dict)
        tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    assert {p for p, _ in tracks} <= named_pids and set(tracks) <= named_tracks
    for track in tracks.values():
        stack: list[tuple[int, int]] = []
        for e in sorted(track, key=lambda e: (e["ts"], -e["dur"])):
            start = round(e["ts"] * 1000)
            end = start + round(e["dur"] * 1000)
            while stack and start >= stack[-1][1]:
                stack.pop()
            if stack:  # starts inside the top span, so it must end inside it too
                assert end <= stack[-1][1], (e, stack[-1])
            stack.append((start, end))
    return xs


class ExternalRefs(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.num_scripts = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.num_scripts += tag == "script"
        if tag == "script" and attrs.get("src"):
            self.refs.append((tag, attrs["src"]))
        if tag == "link":
            self.refs.append((tag, attrs.get("href", "")))
        if tag in ("img", "iframe") and attrs.get("src", "").startswith(("http", "//")):
            self.refs.append((tag, attrs["src"]))


# -- report.json ----------------------------------------------------------------------------------------------


def test_report_json_validates_and_its_summaries_recompute_from_its_steps(real_runs):
    jsonschema.Draft202012Validator.check_schema(REPORT_SCHEMA)
    for runs in run_sets(real_runs):
        doc = json.loads(report.render(Measurement.of(runs), "report.json"))
        jsonschema.validate(doc, REPORT_SCHEMA)
        assert doc["config"]["modes"] == list(runs) and set(doc["summaries"]) == set(runs) - {"ar"}
        assert doc["primary"] == ("ddtree" if "ddtree" in runs else "chain")
        recorded = doc["runs"]
        depth = doc["config"]["decode"]["block_size"] - 1
        for mode, s in doc["summaries"].items():
            steps = [st for st in doc["steps"] if st["mode"] == mode]
            accepted = [len(st["path"]) - 1 for st in steps]
            assert s["mode"] == mode
            assert s["tau"] == pytest.approx(sum(len(st["committed"]) for st in steps) / len(steps))
            assert s["acceptance_histogram"] == [accepted.count(k) for k in range(depth + 1)]
            assert s["per_position_acceptance"] == pytest.approx([np.mean([a > d for a in accepted])
                                                                  for d in range(depth)])
            for run_mode, prefix in (("ar", "ar_"), (mode, "")):
                mode_steps = [st for st in doc["steps"] if st["mode"] == run_mode]
                seconds = (recorded[run_mode]["prefill_ns"] + sum(st["wall_ns"] for st in mode_steps)) / 1e9
                assert s[f"{prefix}tokens_per_s"] == pytest.approx(len(recorded[run_mode]["tokens"]) / seconds)
                generated = [recorded[run_mode]["first_token"]] + [t for st in mode_steps for t in st["committed"]]
                assert generated[:len(recorded[run_mode]["tokens"])] == recorded[run_mode]["tokens"]
            assert s["matches_ar"] == (recorded["ar"]["tokens"] == recorded[mode]["tokens"])
            assert s["speedup"] == pytest.approx(s["tokens_per_s"] / s["ar_tokens_per_s"])
        for st in doc["steps"]:
            assert st["num_accepted"] == len(st["path"]) - 1
            assert sum(st["timings_ns"][k] for k in st["timings_ns"] if k.count("/") == 1) <= st["timings_ns"]["step"]


def test_report_json_steps_round_trip_the_records(real_runs):
    for runs in run_sets(real_runs):
        doc = json.loads(report.render(Measurement.of(runs), "report.json"))
        records = [step for run in runs.values() for step in run.steps]
        assert len(doc["steps"]) == len(records)
        for rec, st in zip(records, doc["steps"], strict=True):
            tree = rec.tree
            assert st["tree"]["tokens"] == tree.tokens and st["tree"]["parents"] == tree.parents
            assert st["tree"]["scores"] == [s if np.isfinite(s) else None for s in tree.scores]
            mask = np.zeros_like(tree.visibility)
            for i, row in enumerate(st["tree"]["visible"]):
                mask[i, row] = True
            assert (mask == tree.visibility).all()
            assert st["path"] == rec.path and st["committed"] == rec.committed
            assert st["timings_ns"] == rec.timings_ns


def test_report_json_kernel_rows_match_the_kernel_table(real_runs):
    doc = json.loads(report.render(Measurement.of(real_runs), "report.json"))
    one_repeat = [row | {"mean_ms_median": row["mean_ms"], "mean_ms_p10": row["mean_ms"], "mean_ms_p90": row["mean_ms"],
                         "mean_ms_min": row["mean_ms"], "mean_ms_max": row["mean_ms"], "mean_ms_n": 1}
                  for run in real_runs.values() for row in metrics.kernel_table(run)]
    assert doc["kernels"] == json.loads(json.dumps(one_repeat)), "a single run is one repeat: n = 1"
    for mode in ("chain", "ddtree"):
        names = {r["name"] for r in doc["kernels"] if r["mode"] == mode}
        assert {"step", "step/draft", "step/tree_build", "step/verify", "step/verify/layer0/attn/verify_attn",
                "step/verify/lm_head", "step/tree_accept", "step/kv_compact", "step/draft_update"} <= names


# -- trace.json -----------------------------------------------------------------------------------------------


def test_trace_parses_and_nests(real_runs):
    for runs in run_sets(real_runs):
        doc = json.loads(report.render(Measurement.of(runs), "trace.json"))
        xs = check_trace(doc)
        for run in runs.values():
            pid = {"ar": 1, "chain": 2, "ddtree": 3}[run.mode]
            steps = [e for e in xs if e["pid"] == pid and e["args"].get("range") == "step"]
            assert [e["args"]["step"] for e in steps] == list(range(run.num_steps))
            assert [round(e["dur"] * 1000) for e in steps] == [s.timings_ns["step"] for s in run.steps]
            attn = [e for e in xs if e["pid"] == pid and e["name"] == "verify_attn"]
            assert attn and all(e["args"]["N"] == run.steps[e["args"]["step"]].tree.num_nodes for e in attn)


def test_trace_places_captured_kernels_on_named_stream_tracks():
    runs = fake_runs(random.randrange(2**31))
    dd = runs["ddtree"]
    rng = random.Random()
    kernels = [KernelEvent(f"k{i}", 7, rng.randrange(dd.num_steps), "step/verify", rng.randrange(200_000),
                           rng.randrange(1, 50_000)) for i in range(40)]
    kernels += [KernelEvent("memcpy", 13, None, None, rng.randrange(1000), 500)]
    empty = RunCapture([], [], [])
    capture = Capture(["cpu", "cuda"], {"ar": empty, "ddtree": RunCapture([], [], kernels)})
    doc = json.loads(report.render(Measurement.of(runs, capture), "trace.json"))
    xs = check_trace(doc)
    assert sum(e["tid"] == 107 for e in xs) == 40 and sum(e["tid"] == 113 for e in xs) == 1
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert "CUDA stream 7" in names[(3, 107)] and "CUDA stream 13" in names[(3, 113)]


# -- CSVs, HTML, figures -------------------------------------------------------------------------------------


def test_csvs_have_the_documented_columns_and_values(real_runs):
    for runs in run_sets(real_runs):
        steps = list(csv.DictReader(io.StringIO(report.render(Measurement.of(runs), "steps.csv").decode())))
        kernels = list(csv.DictReader(io.StringIO(report.render(Measurement.of(runs), "kernels.csv").decode())))
        assert tuple(steps[0]) == export_csv.STEP_COLUMNS and tuple(kernels[0]) == export_csv.KERNEL_COLUMNS
        records = [step for run in runs.values() for step in run.steps]
        assert len(steps) == len(records)
        for row, rec in zip(steps, records, strict=True):
            assert (row["mode"], int(row["step"]), int(row["num_accepted"])) == (rec.mode, rec.index,
                                                                                 rec.num_accepted)
            assert [int(t) for t in row["committed"].split()] == rec.committed
            assert float(row["step_ms"]) == pytest.approx(rec.timings_ns["step"] / 1e6)
            stages = [float(row[f"{s}_ms"]) for s in export_csv.STAGES if row[f"{s}_ms"]]
            assert sum(stages) + float(row["other_ms"]) == pytest.approx(float(row["step_ms"]))
            assert (row["draft_ms"] == "") == (rec.mode == "ar")
            if rec.probs is not None:  # greedy: the target's distribution is a point mass, so expected == realised
                assert float(row["expected_accepted"]) == pytest.approx(rec.num_accepted)
                assert float(row["draft_expected"]) == pytest.approx(rec.probs.draft_expected)
        assert len(kernels) == sum(len(metrics.kernel_table(run)) for run in runs.values())
        assert all(r["profiler_cpu_ms"] == "" and r["device_ms"] == "" for r in kernels)


def test_report_html_is_self_contained(real_runs):
    real, _, diverged, chain = run_sets(real_runs)
    for runs in (real, diverged, chain):
        page = report.render(Measurement.of(runs), "report.html").decode()
        parser = ExternalRefs()
        parser.feed(page)
        assert parser.refs == [] and parser.num_scripts >= 1
        assert "@import" not in page and "cdn.plot.ly" not in page.split("</head>")[0]
        for heading in ("Headline", "Text", "Acceptance and timing", "Kernel breakdown", "Per-step timeline",
                        "Token diff"):
            assert f"<h2>{heading}</h2>" in page
        primary = "DDTree" if "ddtree" in runs else "chain"
        assert f"<h2>Trees of chosen {primary} steps</h2>" in page
        summaries = metrics.summarize_runs(runs)
        for mode, summary in summaries.items():
            label = {"chain": "chain", "ddtree": "DDTree"}[mode]
            if summary["matches_ar"]:
                assert f"{label} emitted exactly the AR tokens" in page
            else:  # a visible warning with the verdict, and the speedup labelled
                assert "Warning: the texts differ." in page and html.escape(verdict(summary, label)) in page
                assert "speedup (* over different outputs)" in page
        assert "Plotly.newPlot" in page and page.count("plotly.js v") >= 1


def test_tree_layout_is_layered_and_subtrees_are_contiguous(real_runs):
    dd = real_runs["ddtree"]
    for step in [*dd.steps, *fake_runs(random.randrange(2**31))["ddtree"].steps]:
        tree = step.tree
        pos = figures.tree_layout(tree)
        assert set(pos) == set(figures.real_nodes(tree))
        kids = {n: [c for c in pos if c != 0 and tree.parents[c] == n] for n in pos}
        leaves = [n for n in pos if not kids[n]]
        assert sorted(pos[n][1] for n in leaves) == list(range(len(leaves)))
        for n, (x, y) in pos.items():
            assert x == tree.depths[n]
            if kids[n]:
                assert y == pytest.approx(np.mean([pos[c][1] for c in kids[n]]))
            below, stack = [], [n]
            while stack:
                m = stack.pop()
                below += [m] if not kids[m] else []
                stack += kids[m]
            rows = sorted(pos[m][1] for m in below)
            assert rows == list(range(int(rows[0]), int(rows[0]) + len(rows)))
        fig = figures.tree_figure(step)
        drawn = sum(len(t.x) for t in fig.data if t.mode and "markers" in t.mode)
        assert drawn == len(pos) + 1  # every node and the bonus
        mask = figures.mask_figure(step)
        assert (np.asarray(mask.data[0].z) > 0).tolist() == tree.visibility.tolist()


# -- writing --------------------------------------------------------------------------------------------------


def test_write_all_refuses_to_overwrite_without_force(tmp_path):
    runs = fake_runs(random.randrange(2**31))
    paths = report.write_all(Measurement.of(runs), tmp_path / "new" / "dir")
    assert sorted(p.name for p in paths) == sorted(report.FORMATS)
    target = tmp_path / "out"
    target.mkdir()
    sentinel = f"keep me {random.random()}"
    (target / "steps.csv").write_text(sentinel)
    with pytest.raises(report.ReportError, match="--force"):
        report.write_all(Measurement.of(runs), target)
    assert (target / "steps.csv").read_text() == sentinel
    assert sorted(os.listdir(target)) == ["steps.csv"]
    report.write_all(Measurement.of(runs), target, force=True)
    assert (target / "steps.csv").read_bytes() == report.render(Measurement.of(runs), "steps.csv")
    assert not [n for n in os.listdir(target) if n.endswith(".tmp")]


def test_write_all_rejects_a_file_or_an_uncreatable_directory(tmp_path):
    runs = fake_runs(random.randrange(2**31))
    (tmp_path / "f").write_text("x")
    with pytest.raises(report.ReportError, match="not a directory"):
        report.write_all(Measurement.of(runs), tmp_path / "f")
    with pytest.raises(report.ReportError, match="cannot create"):
        report.write_all(Measurement.of(runs), tmp_path / "f" / "sub")
    with pytest.raises(report.ReportError, match="unknown report format"):
        report.render(Measurement.of(runs), "report.xml")


def test_write_all_rejects_a_read_only_directory(tmp_path, monkeypatch):
    runs = fake_runs(random.randrange(2**31))
    tmp_path.chmod(0o500)
    if os.geteuid() == 0:  # root may write anyway: make the permission check see what a user would
        real_access = os.access
        monkeypatch.setattr(report.os, "access", lambda p, mode: real_access(p, mode) and pathlib.Path(p) != tmp_path)
    try:
        with pytest.raises(report.ReportError, match="not writable"):
            report.write_all(Measurement.of(runs), tmp_path)
        assert not any(tmp_path.iterdir()), "nothing written"
    finally:
        tmp_path.chmod(0o700)


# -- torch.profiler capture -----------------------------------------------------------------------------------


def test_attribute_assigns_kernels_to_the_innermost_range():
    names = {"prefill", "step", "step/verify", "step/verify/layer0/attn"}
    host = [
        ProfEvent("prefill", 0, 100, 1, False, 0, 1, 0),
        ProfEvent("aten::mm", 10, 20, 1, False, 0, 2, 0),
        ProfEvent("step", 200, 300, 1, False, 0, 3, 0),
        ProfEvent("step/verify", 210, 200, 1, False, 0, 4, 0),
        ProfEvent("aten::linear", 220, 50, 1, False, 0, 5, 0),
        ProfEvent("aten::mm", 230, 30, 1, False, 0, 6, 0),
        ProfEvent("cudaLaunchKernel", 240, 5, 1, False, 0, 5, 0),  # a runtime call whose CUPTI id collides
        ProfEvent("step/verify/layer0/attn", 300, 80, 1, False, 0, 7, 0),
        ProfEvent("ddtree::verify_attn", 310, 40, 1, False, 0, 8, 0),
        ProfEvent("step", 600, 100, 1, False, 0, 9, 0),
        ProfEvent("aten::add", 610, 10, 1, False, 0, 10, 0),
    ]
    device = [
        ProfEvent("gemm", 50, 7, 0, True, 7, 0, 2),
        ProfEvent("gemm", 260, 11, 0, True, 7, 0, 6),
        ProfEvent("attn_kernel", 330, 13, 0, True, 7, 0, 8),
        ProfEvent("step/verify", 250, 90, 0, True, 7, 0, 0),  # a GPU-side copy of our range: not a kernel
        ProfEvent("add_kernel", 640, 3, 0, True, 8, 0, 10),
    ]
    rc = attribute(host + device, names)
    rt = rc.range_times()
    assert rt["step"].count == 2 and rt["step"].cpu_ms == pytest.approx(400 / 1e6)
    assert rt["step"].device_ms == pytest.approx((11 + 13 + 3) / 1e6)
    assert rt["step/verify"].device_ms == pytest.approx((11 + 13) / 1e6)
    assert rt["step/verify/layer0/attn"].device_ms == pytest.approx(13 / 1e6)
    assert rt["prefill"].device_ms == pytest.approx(7 / 1e6)
    ops = {(o.range, o.name): o for o in rc.ops}
    assert ops[("step/verify", "aten::linear")].device_ms == pytest.approx(11 / 1e6)  # via its child aten::mm
    assert ("step/verify", "aten::mm") not in ops  # nested in aten::linear: not a top-level op
    assert ops[("step/verify/layer0/attn", "ddtree::verify_attn")].cpu_ms == pytest.approx(40 / 1e6)
    k = {(x.name, x.step): x for x in rc.kernels}
    assert k[("gemm", None)].start_ns == 50 and k[("gemm", 0)].start_ns == 60
    assert k[("attn_kernel", 0)].range == "step/verify/layer0/attn" and k[("add_kernel", 1)].start_ns == 40
    assert len(rc.kernels) == 4


def test_cpu_capture_lines_up_with_the_timers(captured, tmp_path):
    runs, capture = captured
    assert capture.activities == ["cpu"] and set(capture.runs) == {"ar", "chain", "ddtree"}
    for run in runs.values():
        rt = capture.runs[run.mode].range_times()
        names = {n for s in run.steps for n in s.timings_ns}
        assert names <= set(rt) and "prefill" in rt
        assert rt["step"].count == run.num_steps
        parents = metrics.range_parents(sorted(names))
        for name in names:
            occurrences = sum(name in s.timings_ns for s in run.steps)
            timed = sum(s.timings_ns.get(name, 0) for s in run.steps) / 1e6
            assert rt[name].count == occurrences
            # the record_function opens before the timer starts and closes after it stops
            assert rt[name].cpu_ms >= timed - 0.05 * occurrences, name
            kids = [k for k in names if parents[k] == name]
            assert sum(rt[k].cpu_ms for k in kids) <= rt[name].cpu_ms, name
        assert any(o.name.startswith("ddtree::verify_attn") for o in capture.runs[run.mode].ops)
    report.write_all(Measurement.of(runs, capture), tmp_path)
    doc = json.loads((tmp_path / "report.json").read_text())
    jsonschema.validate(doc, REPORT_SCHEMA)
    rows = [r for r in doc["kernels"] if r["name"] == "step/verify"]
    assert rows and all(r["profiler_cpu_ms"] > 0 and r["device_ms"] is None for r in rows)
    assert "torch.profiler capture" in (tmp_path / "report.html").read_text()
    check_trace(json.loads((tmp_path / "trace.json").read_text()))


def test_html_shows_device_columns_only_for_a_cuda_capture():
    runs = fake_runs(random.randrange(2**31))
    ops = [OpTime("step/verify", "aten::mm", 3, 1.5, 0.25)]
    for activities in (["cpu"], ["cpu", "cuda"]):
        captures = {m: RunCapture([RangeTime("step", runs[m].num_steps, 2.0, 0.5)], ops, []) for m in runs}
        page = report.render(Measurement.of(runs, Capture(activities, captures)), "report.html").decode()
        assert "aten::mm" in page and ("<th>device ms</th>" in page) == ("cuda" in activities)
        kernels = list(csv.DictReader(io.StringIO(report.render(Measurement.of(runs, Capture(activities, captures)),
                                                                "kernels.csv").decode())))
        step = [r for r in kernels if r["name"] == "step"]
        assert all(r["profiler_cpu_ms"] == "2.0" for r in step)
        assert all(r["device_ms"] == ("0.5" if "cuda" in activities else "") for r in step)


def test_environment_records_whether_the_tree_has_uncommitted_changes(tmp_path):
    """Reports and benchmark runs say whether they measured a commit or a working tree that differs from it."""
    import subprocess

    from profiling.environment import git_commit, git_dirty

    assert git_commit(tmp_path) is None and git_dirty(tmp_path) is None  # not a repository
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True)
    assert len(git_commit(tmp_path)) == 40 and git_dirty(tmp_path) is False
    (tmp_path / "a.py").write_text("x = 2\n")
    assert git_dirty(tmp_path) is True
    subprocess.run([*git, "checkout", "-q", "a.py"], check=True)
    (tmp_path / "b.py").write_text("new file\n")  # untracked, not ignored: part of what a run measures
    assert git_dirty(tmp_path) is True
