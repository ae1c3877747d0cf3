"""report.json: every StepRecord of every run, the summaries, the kernel table, the repeat statistics, the
pieces of the tokens it mentions and the environment: enough for profiling/report_reader.py to rebuild the runs.

Strict JSON (no NaN or Infinity): a padding node's -inf score is written as null. The schema is
profiling/schema.py (REPORT_SCHEMA, version SCHEMA_VERSION).
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from engine.records import RunRecord, StepRecord
from profiling.measurement import Measurement
from profiling.metrics import primary_mode
from profiling.repeats import STATISTICS, RepeatStats, kernel_rows
from profiling.schema import SCHEMA_VERSION


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
        "spans": [list(s) for s in spans] if spans else None, "committed_text": step.committed_text,
        "probs": None if step.probs is None else {
            "target": list(step.probs.target), "draft": list(step.probs.draft), "move_on": list(step.probs.move_on),
            "expected_accepted": step.probs.expected_accepted, "draft_expected": step.probs.draft_expected},
        "experts": None if step.experts is None else {
            "touched": list(step.experts.touched), "bytes_per_expert": step.experts.bytes_per_expert,
            "bytes_read": step.experts.bytes_read},
        "budget": None if step.budget is None else dataclasses.asdict(step.budget),
    }


def run_dict(run: RunRecord) -> dict:
    return {"mode": run.mode, "first_token": run.first_token, "prefill_ns": run.prefill_ns, "wall_ns": run.wall_ns,
            "num_steps": run.num_steps, "tokens": list(run.tokens), "prompt_text": run.prompt_text, "text": run.text}


def repeats_dict(repeats: RepeatStats) -> dict:
    return {"count": repeats.count,
            "modes": {mode: {k: row[k] for k in STATISTICS} for mode, row in repeats.modes.items()}}


def vocabulary_dict(runs: dict[str, RunRecord]) -> dict | None:
    """Every run's RunRecord.vocabulary in one table, ids as decimal keys and bytes as hex (None: no tokenizer)."""
    merged = {t: entry for run in runs.values() for t, entry in (run.vocabulary or {}).items()}
    if all(run.vocabulary is None for run in runs.values()):
        return None
    return {str(t): {"piece": piece, "bytes": data.hex()} for t, (piece, data) in sorted(merged.items())}


def build_report(data: Measurement) -> dict:
    runs, capture = data.runs, data.capture
    primary = runs[primary_mode(runs)]
    return {
        "schema_version": SCHEMA_VERSION,
        "environment": data.environment,
        "config": {"model": primary.model, "decode": primary.decode, "drafter": primary.drafter,
                   "prompt": list(primary.prompt), "modes": list(runs), "parallel": primary.parallel},
        "primary": primary.mode,
        "summaries": data.summaries,
        "runs": {mode: run_dict(run) for mode, run in runs.items()},
        "steps": [step_dict(s) for run in runs.values() for s in run.steps],
        "kernels": kernel_rows(runs, data.repeats, capture),
        "capture": capture.to_dict() if capture is not None else None,
        "repeats": repeats_dict(data.repeats),
        "vocabulary": vocabulary_dict(runs),
    }


def render(data: Measurement) -> bytes:
    return json.dumps(build_report(data), indent=1, allow_nan=False).encode()
