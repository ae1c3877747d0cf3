"""torch.profiler capture of an AR + DDTree decode, attributed to our stage ranges.

The decoders run with StepTimer(annotate=True), so every stage is also a record_function of the same full
name ("step/verify/layer0/attn") and the profiler's events line up with our timers. Each device kernel is
attributed to the innermost of our ranges that was open on the host when the CPU op that launched it ran
(kineto links the kernel to that op by correlation id); each top-level CPU op (one called directly inside
our ranges) to the range around it. Range times are inclusive, like the timers: a range's device_ms counts
the kernels of its child ranges too. Timings recorded during a capture include the profiler's overhead.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import Build, decode_request
from engine.model.target import TargetModel
from engine.records import RunRecord, StepRecord
from engine.timers import StepTimer
from profiling.capture_data import Capture, KernelEvent, OpTime, RangeTime, RunCapture
from profiling.metrics import STEP

PREFILL = "prefill"


@dataclass(slots=True, frozen=True)
class ProfEvent:
    """One profiler event, reduced to what attribution needs (times in ns on the profiler's clock)."""

    name: str
    start_ns: int
    dur_ns: int
    thread: int
    on_device: bool
    stream: int
    correlation: int  # host events: the op's id
    linked: int  # device events: the id of the host op that launched it (0: unknown)


def events_from(prof: torch.profiler.profile) -> list[ProfEvent]:
    out = []
    for e in prof.profiler.kineto_results.events():
        on_device = e.device_type() != torch.autograd.DeviceType.CPU
        out.append(ProfEvent(e.name(), e.start_ns(), e.duration_ns(), e.start_thread_id(), on_device,
                             e.device_resource_id() if on_device else 0, e.correlation_id(),
                             e.linked_correlation_id()))
    return out


def _is_runtime_call(name: str) -> bool:
    """CUDA runtime/driver calls (cudaLaunchKernel, cuLaunchKernel) carry CUPTI correlation ids, a different
    numbering from the torch ops' ids that device events link to."""
    return name.startswith("cu") and "::" not in name


def _enclosing(host: list[ProfEvent]) -> list[int]:
    """Index of each host event's innermost enclosing host event on its thread (-1: none)."""
    parent = [-1] * len(host)
    order = sorted(range(len(host)), key=lambda i: (host[i].thread, host[i].start_ns, -host[i].dur_ns))
    stack: list[int] = []
    for i in order:
        e = host[i]
        while stack and (host[stack[-1]].thread != e.thread
                         or host[stack[-1]].start_ns + host[stack[-1]].dur_ns <= e.start_ns):
            stack.pop()
        parent[i] = stack[-1] if stack else -1
        stack.append(i)
    return parent


def attribute(events: Sequence[ProfEvent], names: set[str]) -> RunCapture:
    """Our ranges' host and device times, top-level ops per range, and device kernels placed in steps."""
    host = [e for e in events if not e.on_device]
    parent = _enclosing(host)
    is_range = [e.name in names for e in host]

    def innermost_range(i: int) -> int:  # host event i itself if it is one of our ranges, else its nearest
        while i >= 0 and not is_range[i]:
            i = parent[i]
        return i

    def top_op(i: int) -> int:  # the outermost non-range host event that i sits in (-1: i is a range)
        top = -1
        while i >= 0 and not is_range[i]:
            top, i = i, parent[i]
        return top

    by_id = {e.correlation: i for i, e in enumerate(host) if e.correlation and not _is_runtime_call(e.name)}
    range_device = [0] * len(host)
    op_device = [0] * len(host)
    steps = sorted((e.start_ns, i) for i, e in enumerate(host) if e.name == STEP)
    step_starts = [s for s, _ in steps]
    prefill_start = min((e.start_ns for e in host if e.name == PREFILL), default=None)
    kernels = []
    for k in (e for e in events if e.on_device and e.name not in names):
        launcher = by_id.get(k.linked, -1)
        r = innermost_range(launcher)
        j = r
        while j >= 0:  # inclusive: every enclosing range gets the kernel's time
            if is_range[j]:
                range_device[j] += k.dur_ns
            j = parent[j]
        op = top_op(launcher)
        if op >= 0:
            op_device[op] += k.dur_ns
        launched = host[launcher].start_ns if launcher >= 0 else k.start_ns
        n = bisect.bisect_right(step_starts, launched) - 1
        in_step = n >= 0 and launched < step_starts[n] + host[steps[n][1]].dur_ns
        origin = step_starts[n] if in_step else prefill_start
        if origin is not None:
            kernels.append(KernelEvent(k.name, k.stream, n if in_step else None, host[r].name if r >= 0 else None,
                                       k.start_ns - origin, k.dur_ns))

    ranges: dict[str, RangeTime] = {}
    ops: dict[tuple[str | None, str], OpTime] = {}
    for i, e in enumerate(host):
        if is_range[i]:
            rt = ranges.setdefault(e.name, RangeTime(e.name, 0, 0.0, 0.0))
            rt.count += 1
            rt.cpu_ms += e.dur_ns / 1e6
            rt.device_ms += range_device[i] / 1e6
        elif parent[i] < 0 or is_range[parent[i]]:
            r = parent[i]
            op = ops.setdefault((host[r].name if r >= 0 else None, e.name),
                                OpTime(host[r].name if r >= 0 else None, e.name, 0, 0.0, 0.0))
            op.count += 1
            op.cpu_ms += e.dur_ns / 1e6
            op.device_ms += op_device[i] / 1e6
    ranked = sorted(ops.values(), key=lambda o: -(o.device_ms + o.cpu_ms))
    kernels.sort(key=lambda k: (k.stream, -1 if k.step is None else k.step, k.start_ns))
    return RunCapture(list(ranges.values()), ranked, kernels)


def _profiled(build: Build, cfg: DecodeConfig,
              on_step: Callable[[StepRecord], None] | None) -> tuple[RunRecord, RunCapture]:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cfg.device == "cuda" else [])
    timer = StepTimer(cfg.device, annotate=True)
    with torch.profiler.profile(activities=activities) as prof:
        with torch.profiler.record_function(PREFILL):
            decoder = build(timer)
        run = decoder.run(on_step)
    names = {PREFILL} | {n for s in run.steps for n in s.timings_ns}
    return run, attribute(events_from(prof), names)


def capture_runs(request: DecodeRequest, model: TargetModel | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> tuple[dict[str, RunRecord], Capture]:
    """decode_request under torch.profiler: its warm-up, then AR and each mode on one model (`model`, else loaded
    from the checkpoint), each run in its own capture. `python -m engine run --profile` and the Profile page take
    it so."""
    captures: dict[str, RunCapture] = {}

    def profiled(mode: str, build: Build) -> RunRecord:
        run, captures[mode] = _profiled(build, request.config, on_step)
        return run

    runs = decode_request(request, model, runner=profiled)
    activities = ["cpu"] + (["cuda"] if request.config.device == "cuda" else [])
    return runs, Capture(activities, captures)
