"""The committed H200 results: RESULTS.md's H200 section is what the committed run's JSON renders to, the
issue-7 verdicts follow from the numbers, and the committed profile report is a valid, greedy-exact report."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import jsonschema
import pytest

from benchmarks import results_md
from profiling.schema import REPORT_SCHEMA

ROOT = Path(__file__).resolve().parents[1]
RUN_DIR = ROOT / "benchmarks" / "results" / "h200"


def test_results_md_h200_section_is_the_committed_run_rendered():
    section = results_md.SECTION.search(results_md.RESULTS.read_text())
    assert section is not None
    assert section.group(0) == results_md.render(RUN_DIR)


def _kernels(rooflines: list[float], speedups: list[float], build_us: float) -> dict:
    rows = [{"N": n, "S": 4096, "ours_roofline": r, "speedup": s}
            for n, r, s in zip((8, 32, 65), rooflines, speedups, strict=True)]
    rows.append({"N": 1, "S": 4096, "ours_roofline": 0.01, "speedup": 0.9})  # N*H < 512: outside the target
    return {"verify_attn": rows, "attention": {"heads": 64}, "tree_build": [{"B": 256, "ours_us": build_us}]}


def _decode(step_over_ar: float) -> dict:
    return {"rows": [
        {"mode": "AR", "budget": 0, "noise": None, "eager_step_ms": 3.0, "graph_step_ms": 1.4},
        {"mode": "DDTree", "budget": 64, "noise": 0.0, "step_over_ar_eager": step_over_ar,
         "step_over_ar_graph": step_over_ar},
    ]}


@pytest.mark.parametrize(
    "rooflines, speedups, build_us, step, expected",
    [
        ([0.6, 0.7, 0.8], [2.5, 3.0, 4.0], 40.0, 1.2,
         ["60% to 80% (met)", "2.50x to 4.00x (met)", "slowest case N=1, S=4096: 0.90x (not met)",
          "40.0 µs (met)", "eager 1.20x, graph 1.20x (met)"]),
        ([0.2, 0.7, 0.4], [1.5, 3.0, 4.0], 74.8, 1.6,
         ["20% to 70% (met in 1 of 3 cases; not met at N=8, S=4096; N=65, S=4096)",
          "1.50x to 4.00x (met in 2 of 3 cases; not met at N=8, S=4096)",
          "74.8 µs (not met)", "eager 1.60x, graph 1.60x (not met)"]),
    ],
)
def test_targets_follow_from_the_numbers(rooflines, speedups, build_us, step, expected):
    table = results_md._targets(_kernels(rooflines, speedups, build_us), _decode(step))
    for text in expected:
        assert text in table


@pytest.mark.parametrize(("env", "expected"), [
    ({"git_commit": "4a316ea94ac5c011", "git_dirty": False}, "at commit 4a316ea94ac5"),
    ({"git_commit": "4a316ea94ac5c011"}, "at commit 4a316ea94ac5"),  # a run from before git_dirty was recorded
    ({"git_commit": "4a316ea94ac5c011", "git_dirty": True},
     "on the working tree at commit 4a316ea94ac5 with uncommitted changes"),
    ({"git_commit": None, "git_dirty": None}, "on a copy of the working tree"),
])
def test_results_name_the_measured_revision(env, expected):
    assert results_md._revision(env) == expected


def test_committed_profile_report_is_valid_and_greedy_exact(h200_report_dir):
    doc = json.loads((h200_report_dir / "report.json").read_text())
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["environment"]["device_name"] == "NVIDIA H200" and doc["capture"]
    for mode, summary in doc["summaries"].items():
        assert summary["matches_ar"] and summary["ar_tokens"] == summary["tokens"]
        assert len([s for s in doc["steps"] if s["mode"] == mode]) == summary["num_steps"]
    with (h200_report_dir / "kernels.csv").open() as f:
        kernels = list(csv.DictReader(f))
    assert {row["mode"] for row in kernels} == set(doc["config"]["modes"])
    assert any(row["name"].endswith("verify_attn") and float(row["device_ms"]) > 0 for row in kernels)
    trace = json.loads((h200_report_dir / "trace.json").read_text())
    assert trace["traceEvents"]
    assert "<html" in (h200_report_dir / "report.html").read_text()[:2000].lower()
