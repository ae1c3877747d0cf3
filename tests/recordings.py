"""Recordings for the reader's and the dashboard's tests: reports the engine writes, and a field-by-field check
that a report read back holds the records it was written from."""
from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from engine.decoding.request import DecodeRequest
from engine.records import RunRecord, StepRecord, TreeRecord
from profiling import report
from profiling.measure import repeat_runs
from profiling.measurement import Measurement
from profiling.repeats import median_repeat, repeat_stats


def record(ckpt, out_dir: pathlib.Path, cfg, drafter, modes, repeats: int):
    """`repeats` decodes of AR and `modes` on the checkpoint's prompt, written as the CLI writes them (the median
    repeat's runs with the statistics of all). Returns (the repeats, the written runs, report.json's path)."""
    repeated = repeat_runs(DecodeRequest(ckpt, ckpt.prompt.tolist(), cfg, drafter, modes), repeats)
    runs = median_repeat(repeated, modes[-1])
    report.write_all(Measurement.of(runs, repeats=repeat_stats(repeated)), out_dir, force=True)
    return repeated, runs, out_dir / "report.json"


def as_json(value: object) -> object:
    """A value as report.json holds it (tuples as lists, keys as text)."""
    return json.loads(json.dumps(value))


def assert_same_tree(a: TreeRecord, b: TreeRecord, where: str) -> None:
    for f in dataclasses.fields(TreeRecord):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "visibility":
            assert x.dtype == y.dtype and np.array_equal(x, y), f"{where}.tree.visibility"
        else:  # scores: -inf (padding) equals -inf
            assert x == y, f"{where}.tree.{f.name}"


def assert_same_step(a: StepRecord, b: StepRecord, where: str) -> None:
    for f in dataclasses.fields(StepRecord):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "tree":
            assert_same_tree(x, y, where)
        elif f.name == "spans":
            assert [tuple(s) for s in x] == y, f"{where}.spans"
        else:
            assert x == y, f"{where}.{f.name}: {x!r} != {y!r}"


def assert_same_run(a: RunRecord, b: RunRecord) -> None:
    """Every RunRecord field equal, the steps field by field; the read run has no logits (a report holds none)."""
    for f in dataclasses.fields(RunRecord):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "steps":
            assert len(x) == len(y)
            for i, (p, q) in enumerate(zip(x, y, strict=True)):
                assert_same_step(p, q, f"{a.mode} step {i}")
        elif f.name == "logits":
            assert y is None
        elif f.name in ("model", "decode", "drafter"):
            assert as_json(x) == y, f.name
        else:
            assert x == y, f"{a.mode}.{f.name}"
