"""report.json: every StepRecord of both runs, the summary, the kernel table and the environment.

Strict JSON (no NaN or Infinity): a padding node's -inf score is written as null. The schema is
profiling/schema.py (REPORT_SCHEMA, version SCHEMA_VERSION).
"""
from __future__ import annotations

import json
import math

import numpy as np

from engine.records import RunRecord, StepRecord

from .capture_data import Capture
from .environment import environment
from .metrics import kernel_table, summarize
from .schema import SCHEMA_VERSION


def finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def step_dict(step: StepRecord) -> dict:
    tree = step.tree
    spans = getattr(step, "spans", None)  # StepRecord.spans: the timer's measured offsets, when recorded
    return {
        "mode": step.mode, "index": step.index, "prefix_len": step.prefix_len,
        "tree": {
            "tokens": list(tree.tokens), "parents": list(tree.parents), "depths": list(tree.depths),
            "ranks": list(tree.ranks), "scores": [finite_or_none(s) for s in tree.scores],
            "visible": [np.flatnonzero(row).tolist() for row in np.asarray(tree.visibility)],
        },
        "target": list(step.target), "logit_gap": [float(g) for g in step.logit_gap], "path": list(step.path),
        "bonus": step.bonus, "committed": list(step.committed), "num_accepted": step.num_accepted,
        "num_committed": step.num_committed, "wall_ns": step.wall_ns, "timings_ns": dict(step.timings_ns),
        "spans": [list(s) for s in spans] if spans else None,
    }


def run_dict(run: RunRecord) -> dict:
    return {"mode": run.mode, "first_token": run.first_token, "prefill_ns": run.prefill_ns, "wall_ns": run.wall_ns,
            "num_steps": run.num_steps, "tokens": list(run.tokens)}


def build_report(ar: RunRecord, dd: RunRecord, capture: Capture | None = None) -> dict:
    summary = summarize(ar, dd)  # checks that the runs are a pair
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": environment(str(dd.decode["device"])),
        "config": {"model": dd.model, "decode": dd.decode, "drafter": dd.drafter, "prompt": list(dd.prompt)},
        "summary": summary,
        "runs": {"ar": run_dict(ar), "ddtree": run_dict(dd)},
        "steps": [step_dict(s) for s in (*ar.steps, *dd.steps)],
        "kernels": kernel_table(ar, capture) + kernel_table(dd, capture),
        "capture": capture.to_dict() if capture is not None else None,
    }


def render(ar: RunRecord, dd: RunRecord, capture: Capture | None = None) -> bytes:
    return json.dumps(build_report(ar, dd, capture), indent=1, allow_nan=False).encode()
