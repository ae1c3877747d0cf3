"""How much a recording may hold and how fast it opens (profiling/report_reader.py's MAX_BYTES, MAX_VALUES,
MAX_MASK_CELLS): the largest one the limits admit opens within seconds, a larger one is refused before it is
parsed, saying how much it holds and what to record instead; the other files of a report set, given as a report,
are named with the file to open; the whole-array tree checks agree with the node-by-node walk."""
from __future__ import annotations

import copy
import json
import random
import re
import time

import pytest

from benchmarks.big_recording import big_measurement, big_report, largest_admitted
from profiling import export_csv, report, report_checks, report_kind, report_reader, report_trees
from profiling.report_reader import ReportReadError, read_report, read_report_file

CPU_BOUND_S = 12.0  # measured 4.8 s on a 2-core development machine; the reader before took 13 s, and minutes earlier


def test_the_largest_recording_the_limits_admit_opens_in_seconds():
    import engine.drafters  # noqa: F401 - torch, which the dashboard has loaded: its import is not the reader's

    data = largest_admitted()
    wall, cpu = time.perf_counter(), time.process_time()
    rec = read_report(data, "largest.json")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    steps = rec.runs["ddtree"].steps
    cells = sum(s.tree.num_nodes ** 2 for run in rec.runs.values() for s in run.steps)
    print(f"\nthe largest admitted recording: {len(data) / 2**20:.0f} MiB, {data.count(b',') / 1e6:.1f} million "
          f"values, {len(steps)} DDTree steps at B = 1024 ({cells / 2**20:.0f} MiB of masks): opened in {wall:.1f} s "
          f"({cpu:.1f} s of CPU)")
    measures = (len(data), data.count(b",") + 1, cells)
    limits = (report_reader.MAX_BYTES, report_reader.MAX_VALUES, report_reader.MAX_MASK_CELLS)
    assert steps[0].tree.num_nodes == 1025 and all(m <= limit for m, limit in zip(measures, limits, strict=True))
    assert any(m * (1 + 1 / len(steps)) > limit for m, limit in zip(measures, limits, strict=True)), \
        "one step more would pass a limit"
    assert cpu < CPU_BOUND_S, f"{cpu:.1f} s of CPU to open the largest recording the limits admit"


@pytest.fixture(scope="module")
def small() -> bytes:
    return big_report(3, budget=16, block_size=4)


def test_a_recording_beyond_the_limits_is_refused_with_what_it_holds(small, monkeypatch, tmp_path):
    read_report(small, "small.json")
    monkeypatch.setattr(report_reader, "MAX_VALUES", small.count(b","))
    with pytest.raises(ReportReadError, match=r"^small\.json holds about 0\.0 million JSON values, more than the 0 "
                                              r"million a recording may hold to open in seconds \(about 319 steps at "
                                              r"B = 1024\): record fewer steps \(a smaller --max-new\)"):
        read_report(small, "small.json")
    monkeypatch.undo()
    cells = sum(len(s["tree"]["tokens"]) ** 2 for s in json.loads(small)["steps"])
    monkeypatch.setattr(report_reader, "MAX_MASK_CELLS", cells - 1)
    with pytest.raises(ReportReadError, match=r"^small\.json's trees need 0 MiB of visibility masks .* more than the "
                                              r"0 MiB a recording may take in memory .*a smaller --budget"):
        read_report(small, "small.json")
    monkeypatch.setattr(report_reader, "MAX_BYTES", len(small) - 1)
    (tmp_path / "report.json").write_bytes(small)
    for read in (lambda: read_report(small, "small.json"), lambda: read_report_file(tmp_path / "report.json")):
        with pytest.raises(ReportReadError, match="MiB, more than the 0 MiB a report may be"):
            read()


@pytest.fixture(scope="module")
def report_set(tmp_path_factory):
    out = tmp_path_factory.mktemp("set")
    report.write_all(big_measurement(2, budget=8, block_size=4), out)
    return out


@pytest.mark.parametrize("kind", ["trace.json", "steps.csv", "kernels.csv", "report.html"])
def test_another_file_of_the_report_set_is_named_with_the_one_to_open(report_set, kind, monkeypatch):
    path = report_set / kind
    expected = f"{path} is a {kind} ("
    for read in (lambda: read_report_file(path), lambda: read_report(path.read_bytes(), str(path))):
        with pytest.raises(ReportReadError) as error:
            read()
        message = str(error.value)
        assert message.startswith(expected) and "not a report.json: open the report.json in the same report " \
                                                "directory" in message, message
        assert "export it again" not in message and "damaged" not in message
    monkeypatch.setattr(report_reader, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(ReportReadError, match=f"is a {kind}"):
        read_report_file(path)  # too large, but what it is comes first


def test_a_trace_is_named_whatever_the_order_of_its_keys(report_set):
    trace = json.loads((report_set / "trace.json").read_bytes())
    reordered = json.dumps({"displayTimeUnit": trace["displayTimeUnit"], **trace}, indent=2).encode()
    with pytest.raises(ReportReadError, match=r"^t\.json is a trace\.json \(the Chrome Trace Event timeline"):
        read_report(reordered, "t.json")


def test_the_csv_starts_it_recognises_are_the_writers_columns():
    assert export_csv.STEP_COLUMNS[:3] == report_kind.STEP_CSV_START
    assert export_csv.KERNEL_COLUMNS[:3] == report_kind.KERNEL_CSV_START


def test_a_float_or_a_boolean_where_an_id_goes_is_refused_with_its_place(small):
    """jsonschema takes 1.0 for an integer; a report never holds one, and the reader names the place."""
    doc = json.loads(small)
    i = next(k for k, s in enumerate(doc["steps"]) if s["mode"] == "ddtree")
    for field, index, bad, place in (("visible", 1, [0, 1.0], f"steps[{i}].tree.visible[1][1]"),
                                     ("parents", 2, 1.0, f"steps[{i}].tree.parents[2]"),
                                     ("tokens", 3, True, f"steps[{i}].tree.tokens[3]")):
        damaged = copy.deepcopy(doc)
        damaged["steps"][i]["tree"][field][index] = bad
        with pytest.raises(ReportReadError, match=r"^bad\.json does not match the report schema \(version 2\) at "
                                                  + re.escape(place) + ": "):
            read_report(json.dumps(damaged).encode(), "bad.json")


def _damaged(tree: dict, rng: random.Random) -> dict:
    """tree with one rule-relevant value changed: a parent, a depth, a row of visible, a token, a rank, a score."""
    out = copy.deepcopy(tree)
    n = len(out["tokens"])
    i = rng.randrange(n)
    field = rng.choice(["parents", "depths", "visible", "tokens", "ranks", "scores"])
    if field == "visible":
        row = out["visible"][i]
        change = rng.choice(["append", "drop", "swap", "repeat", "shift"])
        if change == "append":
            row.append(rng.randrange(n))
        elif change == "drop" and row:
            row.pop(rng.randrange(len(row)))
        elif change == "swap" and len(row) > 1:
            row[0], row[-1] = row[-1], row[0]
        elif change == "repeat":
            row.insert(0, row[0])
        else:
            out["visible"][i] = [x + rng.choice([-1, 1]) for x in row]
    elif field == "scores":
        out["scores"][i] = None if out["scores"][i] is not None else -1.5
    else:
        out[field][i] = rng.choice([-2, -1, 0, 1, out[field][i] + 1, out[field][i] - 1, n, n - 1, 600])
    return out


def test_the_whole_array_tree_checks_agree_with_the_node_by_node_walk():
    doc = json.loads(big_report(2, budget=24, block_size=5))
    trees = [s["tree"] for s in doc["steps"] if s["mode"] == "ddtree"]
    rng = random.Random(random.randrange(2**31))
    refused = 0
    for case in range(400):
        tree = trees[case % len(trees)] if case < 2 else _damaged(trees[case % len(trees)], rng)
        n = len(tree["tokens"])
        mask = report_trees.mask_if_valid(tree, n, 4, 512)
        try:
            report_checks._walk_tree(tree, n, 4, 512, "t")
        except report_checks.ReportCheckError:
            assert mask is None, (case, tree)
            refused += 1
            continue
        assert mask is not None, (case, tree)
        assert (mask == report_trees.mask_of_rows(tree["visible"])).all()
    assert refused > 200
