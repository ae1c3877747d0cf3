"""How long a measurement or a budget sweep will take, from runs of the same settings already timed: shown before
one starts, so a user can lower the repeats first. An estimate only: a busy machine or another budget's tree
changes it (the running job's own pace, profiling/job.py, takes over once it starts)."""
from __future__ import annotations

from engine.records import RunRecord
from profiling.metrics import primary_mode, run_time_ns

WARM_UP_STEPS = 2  # engine.decoding.session.warm_up: two untimed steps of AR and each mode


def _warm_up_s(run: RunRecord) -> float:
    return (run.prefill_ns + sum(s.wall_ns for s in run.steps[:WARM_UP_STEPS])) / 1e9


def measure_estimate_s(runs: dict[str, RunRecord], repeats: int) -> float:
    """Seconds `repeats` repeats of AR and the modes take, at the pace of `runs` (one repeat of them)."""
    return sum(repeats * run_time_ns(r) / 1e9 + _warm_up_s(r) for r in runs.values())


def sweep_estimate_s(runs: dict[str, RunRecord], num_budgets: int, repeats: int) -> float:
    """Seconds a sweep of `num_budgets` budgets x `repeats` decodes takes (and its untimed first decode), each at the
    pace of the DDTree (else the chain) run in `runs`: larger trees cost more a step and take fewer steps."""
    return (1 + num_budgets * repeats) * run_time_ns(runs[primary_mode(runs)]) / 1e9


def duration_text(seconds: float) -> str:
    """"8 s", "2 min 5 s"."""
    seconds = max(0, round(seconds))
    minutes, rest = divmod(seconds, 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
