"""trace.json: Chrome Trace Event format (opens in Perfetto and chrome://tracing).

One process per run (AR, chain, DDTree); for a parallel run, one per rank and run, the ranks of a run one above
the other ("rank r/W: ..."), each with its own collective ranges (engine/model/parallel.py). Track 1 holds the stage
ranges as complete ("X") events nested like the StepTimer ranges (profiling/spans.py lays them out); with a
torch.profiler capture of a CUDA run, each CUDA stream gets a track of its kernels. Metadata ("M") events name
every process and track. Timestamps are µs from the start of the run's prefill; args carry the step index and
the op's arguments.
"""
from __future__ import annotations

import json

from engine.records import MODES, RunRecord, StepRecord
from engine.timers import stage_category
from profiling.capture_data import Capture, KernelEvent
from profiling.metrics import num_draft_positions, range_parents
from profiling.spans import PREFILL, TimedSpan, run_spans, step_slots

PIDS = {mode: i + 1 for i, mode in enumerate(MODES)}  # one Perfetto process per run, AR on top
RANK_PID_STRIDE = 1000  # a parallel run's process: PIDS[mode] * stride + rank (ranks of a run stay together)
RANGES_TID = 1
STREAM_TID_BASE = 100


def _us(ns: int) -> float:
    return ns / 1000


def process_label(run: RunRecord) -> str:
    d = run.decode
    if run.mode == "ar":
        return f"AR decode ({d['device']}, {d['dtype']})"
    if run.mode == "chain":
        return f"chain decode (block {d['block_size']}, {d['device']}, {d['dtype']})"
    return f"DDTree decode (budget {d['budget']}, block {d['block_size']}, {d['device']}, {d['dtype']})"


def ranges_track_label(run: RunRecord) -> str:
    if run.decode["device"] == "cuda":
        return "stage ranges (CUDA events on the decode stream)"
    return "host thread: stage ranges (perf_counter_ns)"


def op_args(name: str, step: StepRecord, run: RunRecord) -> dict:
    """What the op of range `name` worked on in this step."""
    op = name.rsplit("/", 1)[-1]
    num_nodes, path_len = step.tree.num_nodes, len(step.path)
    args = {
        "step": {"prefix_len": step.prefix_len, "num_nodes": num_nodes, "num_accepted": step.num_accepted,
                 "committed": list(step.committed), "bonus": step.bonus},
        "draft": {"num_draft_positions": num_draft_positions(run)},
        "tree_build": {"budget": num_nodes - 1, "num_draft_positions": num_draft_positions(run)},
        "verify": {"num_nodes": num_nodes, "prefix_len": step.prefix_len},
        "verify_attn": {"N": num_nodes, "prefix_len": step.prefix_len},
        "tree_accept": {"num_nodes": num_nodes, "path_len": path_len},
        "kv_compact": {"prefix_len": step.prefix_len, "path_len": path_len},
        "commit": {"num_committed": step.num_committed},
    }
    return args.get(op, {})


def _span_event(pid: int, span: TimedSpan, parents: dict[str, str | None], run: RunRecord) -> dict:
    parent = parents.get(span.name)
    short = span.name[len(parent) + 1:] if parent else span.name
    args: dict = {"range": span.name, "mode": run.mode}
    if span.step is None:
        args.update(prompt_len=len(run.prompt), first_token=run.first_token)
    else:
        step = run.steps[span.step]
        args.update(step=span.step, **op_args(span.name, step, run))
    return {"ph": "X", "pid": pid, "tid": RANGES_TID, "name": short, "cat": stage_category(span.name),
            "ts": _us(span.start_ns), "dur": _us(span.dur_ns), "args": args}


def _kernel_events(pid: int, run: RunRecord, kernels: list[KernelEvent]) -> list[dict]:
    """Kernels placed in their step's slot; a kernel that would overlap the previous one on its stream
    (the host and device clocks differ between steps) starts when that one ends."""
    slots = step_slots(run)
    events, track_end = [], {}
    for k in kernels:
        tid = STREAM_TID_BASE + k.stream
        origin = slots[k.step][0] if k.step is not None and k.step < len(slots) else 0
        start = max(origin + k.start_ns, track_end.get(tid, 0))
        track_end[tid] = start + k.dur_ns
        events.append({"ph": "X", "pid": pid, "tid": tid, "name": k.name, "cat": "kernel", "ts": _us(start),
                       "dur": _us(k.dur_ns), "args": {"step": k.step, "range": k.range, "mode": run.mode,
                                                      "shifted_ns": start - origin - k.start_ns}})
    return events


def _meta(pid: int, tid: int | None, what: str, args: dict) -> dict:
    event = {"ph": "M", "pid": pid, "name": what, "args": args}
    if tid is not None:
        event["tid"] = tid
    return event


def run_events(run: RunRecord, capture: Capture | None, rank: int | None = None) -> list[dict]:
    """The run's events; rank (of a parallel run) gives it a process of its own, labelled with the rank."""
    world = run.parallel["world_size"] if run.parallel else 1
    pid = PIDS[run.mode] if rank is None else PIDS[run.mode] * RANK_PID_STRIDE + rank
    label = process_label(run) if rank is None else f"rank {rank}/{world}: {process_label(run)}"
    spans = run_spans(run)
    parents = range_parents(list(dict.fromkeys(s.name for s in spans if s.name != PREFILL)))
    events = [_meta(pid, None, "process_name", {"name": label}),
              _meta(pid, None, "process_sort_index", {"sort_index": pid}),
              _meta(pid, RANGES_TID, "thread_name", {"name": ranges_track_label(run)})]
    events += [_span_event(pid, s, parents, run) for s in spans]
    if capture is not None and run.mode in capture.runs:
        kernels = capture.runs[run.mode].kernels
        for stream in sorted({k.stream for k in kernels}):
            events.append(_meta(pid, STREAM_TID_BASE + stream, "thread_name",
                                {"name": f"CUDA stream {stream}: kernels (torch.profiler)"}))
        events += _kernel_events(pid, run, kernels)
    return events


def build_trace(runs: dict[str, RunRecord], capture: Capture | None = None,
                ranks: list[dict[str, RunRecord]] | None = None) -> dict:
    """The trace of the runs; with ranks (every rank's runs, rank 0's are `runs`), one process per rank and run.
    The capture is rank 0's."""
    if ranks is None:
        events = [event for run in runs.values() for event in run_events(run, capture)]
    else:
        events = [event for rank, rank_runs in enumerate(ranks) for run in rank_runs.values()
                  for event in run_events(run, capture if rank == 0 else None, rank)]
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"generator": "DDTree Studio profiling.export_trace", "time_origin": "each run's prefill start",
                      "layout": "steps back to back in host wall-time slots after the prefill"},
    }


def render(runs: dict[str, RunRecord], capture: Capture | None = None,
           ranks: list[dict[str, RunRecord]] | None = None) -> bytes:
    return json.dumps(build_trace(runs, capture, ranks), allow_nan=False).encode()
