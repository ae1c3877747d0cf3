"""profiling.repeats: statistics against numpy, the spread rule, repeated decodes of the tiny fixture, and the
statistics the reports carry."""
from __future__ import annotations

import csv
import io
import json
import random

import jsonschema
import numpy as np
import pytest

from cli.__main__ import main
from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import decode
from profiling import report
from profiling.measure import repeat_runs
from profiling.measurement import Measurement
from profiling.metrics import run_time_ns, tokens_per_s
from profiling.repeats import (
    LARGE_SPREAD,
    inter_token_ms,
    median_repeat,
    range_stats,
    relative_spread,
    repeat_stats,
    stats,
    summarize_repeats,
)
from profiling.schema import REPORT_SCHEMA


def test_stats_match_numpy_and_drop_missing_values():
    xs = [random.uniform(0, 100) for _ in range(random.randint(1, 30))]
    got = stats([*xs, None])
    assert got["n"] == len(xs) and got["min"] == min(xs) and got["max"] == max(xs)
    assert got["median"] == pytest.approx(np.median(xs))
    assert (got["p10"], got["p90"]) == pytest.approx(tuple(np.percentile(xs, [10, 90])))
    assert stats([None])["median"] is None and relative_spread(stats([None])) is None
    assert relative_spread(stats([1.0, 1.0, 1.0])) == 0.0


def test_repeated_runs_summarised(tiny_checkpoint):
    prompt = tiny_checkpoint.prompt.tolist()
    cfg = DecodeConfig(budget=random.randint(2, 30))
    with pytest.raises(ValueError, match="repeats=0"):
        repeat_runs(DecodeRequest(tiny_checkpoint, prompt, cfg), 0)
    seen = []
    repeated = repeat_runs(DecodeRequest(tiny_checkpoint, prompt, cfg), 3,
                           on_progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)] and [list(r) for r in repeated] == [["ar", "ddtree"]] * 3
    want = decode(tiny_checkpoint, prompt, cfg, "ar").tokens
    assert all(r[m].tokens == want for r in repeated for m in r), "every repeat decodes the same tokens"
    summary = summarize_repeats(repeated)
    dd = summary["ddtree"]
    assert dd["tokens_per_s"]["median"] == pytest.approx(np.median([tokens_per_s(r["ddtree"]) for r in repeated]))
    assert dd["speedup"]["median"] == pytest.approx(
        np.median([tokens_per_s(r["ddtree"]) / tokens_per_s(r["ar"]) for r in repeated]))
    assert dd["ttft_ms"]["max"] == pytest.approx(max(r["ddtree"].prefill_ns for r in repeated) / 1e6)
    assert dd["itl_p95_ms"]["median"] == pytest.approx(
        np.median([np.percentile([s.wall_ns / 1e6 for s in r["ddtree"].steps], 95) for r in repeated]))
    assert inter_token_ms(repeated[0]["ar"]) == [s.wall_ns / 1e6 for s in repeated[0]["ar"].steps]
    assert dd["large_spread"] == [k for k in ("tokens_per_s", "speedup") if relative_spread(dd[k]) > LARGE_SPREAD]
    times = sorted(run_time_ns(r["ddtree"]) for r in repeated)
    assert run_time_ns(median_repeat(repeated, "ddtree")["ddtree"]) == times[1]
    ranges = range_stats(repeated, "ddtree")
    assert {"step", "step/verify"} <= set(ranges) and all(s["n"] == 3 for s in ranges.values())


def test_run_repeats_prints_the_statistics_and_rejects_bad_counts(capsys):
    fixture = "models/model_tiny.kdtr"
    assert main(["run", "--fixture", fixture, "--repeats", "2", "--budget", "8"]) == 0
    out = capsys.readouterr()
    lines = [line.split() for line in out.out.splitlines()]
    assert "2 repeats after one warm-up:" in out.out and out.err.count("repeat ") == 2
    rows = {tuple(line[:2]): [float(x) for x in line[2:]] for line in lines if line[:2] in (
        ["DDTree", "tokens_per_s"], ["DDTree", "speedup"], ["AR", "ttft_ms"])}
    assert len(rows) == 3 and ("AR", "speedup") not in rows
    for median, p10, p90, lo, hi in rows.values():
        assert lo <= p10 <= median <= p90 <= hi
    for bad, message in ((["--repeats", "0"], "expected an integer >= 1"), (["--repeats", "2", "--profile"],
                                                                              "captures one run")):
        assert main(["run", "--fixture", fixture, *bad]) == 2
        assert message in capsys.readouterr().err


def test_the_reports_carry_the_statistics_of_every_repeat(tiny_checkpoint, tmp_path):
    prompt = tiny_checkpoint.prompt.tolist()
    repeated = repeat_runs(DecodeRequest(tiny_checkpoint, prompt, DecodeConfig(budget=random.randint(2, 12))), 3)
    runs = median_repeat(repeated, "ddtree")
    report.write_all(Measurement.of(runs, repeats=repeat_stats(repeated)), tmp_path)
    doc = json.loads((tmp_path / "report.json").read_bytes())
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["repeats"]["count"] == 3 and set(doc["repeats"]["modes"]) == {"ar", "ddtree"}
    speeds = [tokens_per_s(r["ddtree"]) for r in repeated]
    dd = doc["repeats"]["modes"]["ddtree"]
    assert dd["tokens_per_s"]["p10"] == pytest.approx(np.percentile(speeds, 10)) and dd["tokens_per_s"]["n"] == 3
    assert dd["speedup"]["max"] == pytest.approx(max(tokens_per_s(r["ddtree"]) / tokens_per_s(r["ar"])
                                                     for r in repeated))
    assert doc["summaries"]["ddtree"]["time_ms"] == pytest.approx(dd["time_ms"]["median"]), "the median repeat"
    verify = [np.mean([s.timings_ns["step/verify"] for s in r["ddtree"].steps]) / 1e6 for r in repeated]
    rows = {(r["mode"], r["name"]): r for r in csv.DictReader(io.StringIO((tmp_path / "kernels.csv").read_text()))}
    row = rows[("ddtree", "step/verify")]
    assert float(row["mean_ms_p90"]) == pytest.approx(np.percentile(verify, 90)) and row["mean_ms_n"] == "3"
    assert float(row["mean_ms_min"]) <= float(row["mean_ms"]) <= float(row["mean_ms_max"])
    for obj in doc["kernels"]:
        assert float(rows[(obj["mode"], obj["name"])]["mean_ms_median"]) == pytest.approx(obj["mean_ms_median"])


def test_run_repeats_writes_its_statistics_into_the_reports(tmp_path, capsys):
    assert main(["run", "--fixture", "models/model_tiny.kdtr", "--repeats", "2", "--budget", "6",
                 "--report", str(tmp_path)]) == 0
    capsys.readouterr()
    doc = json.loads((tmp_path / "report.json").read_bytes())
    assert doc["repeats"]["count"] == 2
    assert all(s["n"] == 2 for row in doc["repeats"]["modes"].values() for s in row.values())
    assert all(r["mean_ms_n"] == 2 for r in doc["kernels"] if r["count"] > 0)
