"""steps.csv (one row per step of every run) and kernels.csv (one row per timed range per run).

The columns are fixed (STEP_COLUMNS, KERNEL_COLUMNS); a value that does not apply is an empty cell.
"""
from __future__ import annotations

import csv
import io

from engine.decoding.decoder import STAGES
from engine.records import RunRecord, StepRecord
from profiling.measurement import Measurement
from profiling.metrics import STEP, stage_ns
from profiling.repeats import RANGE_COLUMNS, kernel_rows

STEP_COLUMNS = ("mode", "step", "prefix_len", "num_nodes", "num_drafted", "num_accepted", "expected_accepted",
                "draft_expected", "num_committed", "committed", "committed_text", "bonus", "experts_touched",
                "expert_bytes", "wall_ms", "step_ms",
                *(f"{s}_ms" for s in STAGES), "other_ms", "auto_budget", "auto_drafted", "auto_expected_accepted",
                "auto_predicted_ms")
KERNEL_COLUMNS = ("mode", "name", "parent", "depth", "leaf", "count", "total_ms", "mean_ms", "p50_ms", "p95_ms",
                  "self_ms", "share", "profiler_cpu_ms", "device_ms", *RANGE_COLUMNS)


def _table(columns: tuple[str, ...], rows: list[dict]) -> bytes:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in columns})
    return out.getvalue().encode()


def step_row(step: StepRecord) -> dict:
    stages = stage_ns(step)
    step_ns = step.timings_ns.get(STEP)
    known = [stages[s] for s in STAGES if s in stages]
    return {
        "mode": step.mode, "step": step.index, "prefix_len": step.prefix_len, "num_nodes": step.tree.num_nodes,
        "num_drafted": sum(p >= 0 for p in step.tree.parents), "num_accepted": step.num_accepted,
        "expected_accepted": step.probs.expected_accepted if step.probs else None,
        "draft_expected": step.probs.draft_expected if step.probs else None,
        "num_committed": step.num_committed, "committed": " ".join(map(str, step.committed)),
        "committed_text": step.committed_text, "bonus": step.bonus,
        "experts_touched": " ".join(map(str, step.experts.touched)) if step.experts else None,
        "expert_bytes": step.experts.bytes_read if step.experts else None,
        "wall_ms": step.wall_ns / 1e6, "step_ms": step_ns / 1e6 if step_ns is not None else None,
        **{f"{s}_ms": stages[s] / 1e6 if s in stages else None for s in STAGES},
        "other_ms": (step_ns - sum(known)) / 1e6 if step_ns is not None else None,
        **_budget_cells(step),
    }


def _budget_cells(step: StepRecord) -> dict:
    """--budget auto's choice at the step: the best bucket, whether it drafted, and that bucket's expected accepted
    drafted tokens and predicted step time (empty under a fixed budget)."""
    choice = step.budget
    if choice is None:
        return dict.fromkeys(("auto_budget", "auto_drafted", "auto_expected_accepted", "auto_predicted_ms"))
    i = choice.buckets.index(choice.chosen)
    return {"auto_budget": choice.chosen, "auto_drafted": int(choice.drafted),
            "auto_expected_accepted": choice.expected[i], "auto_predicted_ms": choice.cost_s[i] * 1e3}


def render_steps(runs: dict[str, RunRecord]) -> bytes:
    return _table(STEP_COLUMNS, [step_row(s) for run in runs.values() for s in run.steps])


def render_kernels(data: Measurement) -> bytes:
    return _table(KERNEL_COLUMNS, kernel_rows(data.runs, data.repeats, data.capture))
