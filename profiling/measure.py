"""Measuring a DecodeRequest into a Measurement: one decode of AR and the modes, R repeats of it, or one decode
under torch.profiler, each wrapping engine.decoding.session.decode_request; a parallel run's ranks gathered on rank
0. The CLI's `run` and the dashboard's pages measure through here."""
from __future__ import annotations

from collections.abc import Callable

from engine.decoding.request import DecodeRequest
from engine.decoding.session import decode_request, load_target
from engine.model.parallel import current_shard, gather_to_leader
from engine.model.target import TargetModel
from engine.records import RunRecord, StepRecord
from profiling.capture import capture_runs
from profiling.job import Job, Plan
from profiling.measurement import Measurement
from profiling.repeats import median_repeat, repeat_stats


def repeat_runs(request: DecodeRequest, repeats: int, model: TargetModel | None = None,
                on_step: Callable[[StepRecord], None] | None = None,
                on_progress: Callable[[int, int], None] | None = None) -> list[dict[str, RunRecord]]:
    """decode_request `repeats` times on one model (`model`, else loaded once), the warm-up before the first only;
    on_step sees every step, on_progress(done, total) follows each repeat."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: expected an integer >= 1")
    model = model or load_target(request.checkpoint, request.config)
    out = []
    for i in range(repeats):
        out.append(decode_request(request, model, warmup=i == 0, on_step=on_step))
        if on_progress is not None:
            on_progress(i + 1, repeats)
    return out


def check_plan(repeats: int, profile: bool) -> None:
    """A measurement of `repeats` repeats, under torch.profiler or not, can be taken (checked before any decode)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"--repeats {repeats}: expected an integer >= 1")
    if repeats > 1 and profile:
        raise ValueError("--repeats and --profile: the profiler captures one run; drop one of them")


def measure(request: DecodeRequest, model: TargetModel | None = None, repeats: int = 1, profile: bool = False,
            on_step: Callable[[StepRecord], None] | None = None,
            on_progress: Callable[[int, int], None] | None = None) -> Measurement:
    """AR and the request's modes after one warm-up: `repeats` times (the runs are then the median repeat's, beside
    the statistics of all), or once under torch.profiler (profile; one repeat only, the profiler's overhead would
    be in every number). on_step sees every step, on_progress(done, total) follows each repeat."""
    check_plan(repeats, profile)
    capture = stats = None
    if profile:
        runs, capture = capture_runs(request, model, on_step)
    else:
        repeated = repeat_runs(request, repeats, model, on_step, on_progress)
        runs, stats = median_repeat(repeated, request.primary), repeat_stats(repeated)
    ranks = gather_to_leader(runs) if current_shard() is not None else None
    return Measurement.of(runs, capture, stats, ranks)


def measure_job(request: DecodeRequest, model: TargetModel, repeats: int) -> Job:
    """measure() of `repeats` repeats as a Job (profiling/job.py): started by the caller, stoppable at every step;
    its result is the Measurement."""
    check_plan(repeats, False)
    plan = Plan(repeats, (1 + len(request.modes)) * request.config.max_new_tokens, "repeat")
    return Job("measure", plan, lambda job: measure(request, model, repeats, on_step=lambda s: job.step(
        s.num_committed), on_progress=lambda done, total: job.units_done(done)))
