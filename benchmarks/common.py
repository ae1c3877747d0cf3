"""Shared benchmark machinery: command line, environment header, roofline ceilings, timing, tables, results.

Timing rules:
- Device work is timed with CUDA events around each call (never a host clock around asynchronous work), and
  short device work also as CUDA-graph replays of several calls, which removes the host's launch gaps and
  leaves the device time.
- A measurement rotates among input sets whose total size is several times the L2, so repeated calls read
  device memory, not the cache.
- Work that ends on the host (a reference that reads tensors back, a Python baseline) and all CPU work is
  timed with perf_counter, the device synchronised before and after.
- Every timing warms up, picks its repetition count from a first estimate so that it takes about a fixed
  time, and reports the median with the 10th and 90th percentiles (their spread is the noise).
The two ceilings every roofline fraction refers to, the device-to-device copy bandwidth (bytes read plus
bytes written; profiling/bandwidth.py, which the studio's stage floors share) and the matmul rate on random data,
are measured once per run.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import shlex
import time
import traceback
import unittest.mock
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from kernels.graph_capture import capture
from profiling.bandwidth import measure_copy
from profiling.environment import environment

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"
L2_BYTES = 60 * 10**6  # H200 L2 (60 MB): the largest last-level cache the benchmarks must defeat
ROTATION_FACTOR = 3  # input sets together span this many L2s
MAX_INPUT_SETS = 128
MIN_GRAPH_CALLS = 8  # calls captured per graph, so a replay's launch is amortised


@dataclass(slots=True, frozen=True)
class Budget:
    """How long one measurement runs: warm-up calls, then reps in [min_reps, max_reps] aiming at target_ms."""

    warmup: int
    min_reps: int
    max_reps: int
    target_ms: float

    def num_reps(self, estimate_us: float) -> int:
        if estimate_us <= 0:
            return self.max_reps
        return int(min(self.max_reps, max(self.min_reps, self.target_ms * 1e3 / estimate_us)))


FULL = Budget(warmup=5, min_reps=20, max_reps=1000, target_ms=150.0)
QUICK = Budget(warmup=1, min_reps=3, max_reps=20, target_ms=10.0)


@dataclass(slots=True, frozen=True)
class Timing:
    """Time per call in microseconds: median and 10th/90th percentiles over num_reps calls."""

    median_us: float
    p10_us: float
    p90_us: float
    num_reps: int
    num_sets: int  # input sets rotated through
    method: str  # "graph" (CUDA-graph replays), "events" (CUDA events per call) or "wall" (perf_counter)

    def to_dict(self) -> dict:
        return asdict(self)


def _timing(samples_us: Sequence[float], num_sets: int, method: str) -> Timing:
    p10, p50, p90 = np.percentile(samples_us, [10, 50, 90])
    return Timing(float(p50), float(p10), float(p90), len(samples_us), num_sets, method)


def num_input_sets(set_bytes: int, max_sets: int = MAX_INPUT_SETS) -> int:
    """Input sets to rotate through so that together they span ROTATION_FACTOR L2s (at least 2)."""
    return max(2, min(max_sets, math.ceil(ROTATION_FACTOR * L2_BYTES / max(set_bytes, 1))))


def time_wall(fn: Callable[[Any], object], sets: Sequence[Any], device: torch.device, budget: Budget) -> Timing:
    """perf_counter around each call; on CUDA the device is synchronised before and after every call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def call(i: int) -> float:
        sync()
        start = time.perf_counter_ns()
        fn(sets[i % len(sets)])
        sync()
        return (time.perf_counter_ns() - start) / 1e3

    warm = [call(i) for i in range(max(budget.warmup, 1))]
    return _timing([call(i) for i in range(budget.num_reps(min(warm)))], len(sets), "wall")


def time_events(fn: Callable[[Any], object], sets: Sequence[Any], budget: Budget) -> Timing:
    """CUDA events around each eager call, all read after one final synchronisation."""
    for i in range(budget.warmup):
        fn(sets[i % len(sets)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(3):
        fn(sets[i % len(sets)])
    end.record()
    end.synchronize()
    reps = budget.num_reps(start.elapsed_time(end) * 1e3 / 3)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize()
    for i, (s, e) in enumerate(events):
        s.record()
        fn(sets[i % len(sets)])
        e.record()
    torch.cuda.synchronize()
    return _timing([s.elapsed_time(e) * 1e3 for s, e in events], len(sets), "events")


def time_calls(fn: Callable[[Any], object], sets: Sequence[Any], device: torch.device, budget: Budget) -> Timing:
    """Eager per-call time: CUDA events on a GPU, perf_counter on the CPU."""
    return time_events(fn, sets, budget) if device.type == "cuda" else time_wall(fn, sets, device, budget)


def time_replays(fn: Callable[[Any], object], sets: Sequence[Any], budget: Budget,
                 num_calls: int | None = None) -> Timing | None:
    """Device time per call from CUDA-graph replays (one replay = num_calls calls, by default one per input set and
    at least MIN_GRAPH_CALLS; 1: the call captured alone, its replay's launch included). None, with a note printed,
    if fn cannot be captured."""
    num_calls = num_calls or max(len(sets), MIN_GRAPH_CALLS)

    def calls(count: int) -> None:
        for i in range(count):
            fn(sets[i % len(sets)])

    try:
        graph, _ = capture(lambda: calls(max(budget.warmup, 1)), lambda: calls(num_calls))
    except RuntimeError as exc:
        torch.cuda.synchronize()
        print(f"  note: CUDA-graph capture failed, eager timing only: {str(exc).splitlines()[0]}")
        return None
    per_replay = time_events(lambda _: graph.replay(), [None], budget)
    return Timing(per_replay.median_us / num_calls, per_replay.p10_us / num_calls, per_replay.p90_us / num_calls,
                  per_replay.num_reps * num_calls, len(sets), "graph")


@dataclass(slots=True, frozen=True)
class Ceilings:
    """The two roofline ceilings, measured on this device in the benchmark's dtype."""

    copy_tbps: float  # device-to-device copy: (bytes read + bytes written) / time, in 1e12 B/s
    matmul_tflops: float  # n x n x n matmul on random data, 2 n^3 / time, in 1e12 FLOP/s
    dtype: str
    copy_bytes: int  # size of the copied buffer
    matmul_n: int

    def floor_us(self, num_bytes: float, flops: float) -> float:
        """The roofline's time floor: the larger of bytes over bandwidth and FLOPs over the matmul rate."""
        return max(num_bytes / (self.copy_tbps * 1e12), flops / (self.matmul_tflops * 1e12)) * 1e6

    def to_dict(self) -> dict:
        return asdict(self)


def _copy_tbps(device: torch.device, dtype: torch.dtype, num_bytes: int, budget: Budget) -> float:
    """profiling/bandwidth.py's copy, repeated as the budget asks of its first estimate."""
    estimate = measure_copy(device, dtype, num_bytes, 1, warmup=budget.warmup)
    reps = budget.num_reps(2 * num_bytes / estimate.bytes_per_s * 1e6)
    return measure_copy(device, dtype, num_bytes, reps, warmup=0).tbps


def _matmul_tflops(device: torch.device, dtype: torch.dtype, n: int, budget: Budget) -> float:
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    t = time_calls(lambda _: torch.mm(a, b, out=c), [None], device, budget)
    return 2 * n**3 / (t.median_us * 1e-6) / 1e12


def measure_ceilings(device: torch.device, dtype: torch.dtype, quick: bool) -> Ceilings:
    if device.type == "cuda":
        copy_bytes, n = (2**28, 4096) if quick else (2**30, 8192)
    else:
        copy_bytes, n = (2**27, 1024) if quick else (2**28, 2048)
    budget = Budget(warmup=2, min_reps=3 if quick else 10, max_reps=100, target_ms=20.0 if quick else 300.0)
    return Ceilings(copy_tbps=_copy_tbps(device, dtype, copy_bytes, budget),
                    matmul_tflops=_matmul_tflops(device, dtype, n, budget),
                    dtype=str(dtype).removeprefix("torch."), copy_bytes=copy_bytes, matmul_n=n)


@dataclass(slots=True)
class RunInfo:
    """What every results file starts with: the command, when, where, and the ceilings."""

    benchmark: str
    command: str
    date: str
    quick: bool
    environment: dict
    ceilings: Ceilings

    def to_dict(self) -> dict:
        return {"benchmark": self.benchmark, "command": self.command, "date": self.date, "quick": self.quick,
                "environment": self.environment, "ceilings": self.ceilings.to_dict()}

    def header(self) -> str:
        env, c = self.environment, self.ceilings
        return "\n".join([
            f"{self.benchmark}: {env['device_name']} ({env['device']}) | torch {env['torch']} | "
            f"CUDA {env['cuda'] or 'none'} | python {env['python']} | {self.date}",
            f"ceilings ({c.dtype}): copy {c.copy_tbps:.3f} TB/s (read + write, {c.copy_bytes / 2**20:.0f} MiB) | "
            f"matmul {c.matmul_tflops:.2f} TFLOP/s ({c.matmul_n}^3, random data)",
            f"command: {self.command}",
        ])


def start_run(benchmark: str, module: str, argv: Sequence[str], device: torch.device, dtype: torch.dtype,
              quick: bool) -> RunInfo:
    """Measure the ceilings and print the header (device, versions, ceilings) before any benchmark."""
    info = RunInfo(benchmark=benchmark, command=f"python -m {module} {shlex.join(argv)}".strip(),
                   date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), quick=quick,
                   environment=environment(str(device)), ceilings=measure_ceilings(device, dtype, quick))
    print(info.header(), flush=True)
    return info


def parse_args(description: str, argv: Sequence[str] | None,
               extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    """The options every benchmark takes, plus what extra(parser) adds."""
    p = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(p)
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="where to run (default: cuda when torch sees a GPU, else cpu)")
    p.add_argument("--quick", action="store_true", help="the smallest settings: a smoke run in seconds")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR, help=f"results directory (default {RESULTS_DIR})")
    return p.parse_args(argv)


def op_setting(var: str, value: str) -> contextlib.AbstractContextManager:
    """The CUDA ops read `var` (DDTREE_VERIFY_ATTN_KERNEL, DDTREE_TREE_BUILD, DDTREE_LINEAR_ROWS_KERNEL) at each
    call: inside the block they run `value`, and graphs captured there keep it."""
    return unittest.mock.patch.dict(os.environ, {var: value})


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False); "
                         "run on a GPU machine or pass --device cpu")
    return torch.device(name)


def guarded(key: dict, run: Callable[[], dict]) -> dict:
    """run()'s row, or key plus the error (its traceback printed): in a one-shot run on a lent GPU one failing
    case must not cost the other cases their numbers."""
    try:
        return run()
    except Exception as exc:  # whatever one case raises is recorded; the next case still runs
        traceback.print_exc()
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        print(f"  FAILED {key}: {error}", flush=True)
        return {**key, "error": error}


def num_failed(rows: Sequence[dict]) -> int:
    return sum("error" in r for r in rows)


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


@dataclass(slots=True, frozen=True)
class Column:
    key: str
    header: str
    fmt: str = "{:.3g}"


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return fmt.format(value)


def _failures(rows: Sequence[dict]) -> list[str]:
    """One line per failed row (see guarded), to follow its table."""
    return [f"FAILED {' '.join(f'{k}={v}' for k, v in r.items() if k != 'error')}: {r['error']}"
            for r in rows if "error" in r]


def text_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    """Right-aligned plain-text table for the terminal."""
    cells = [[c.header for c in columns]] + [[_cell(r.get(c.key), c.fmt) for c in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) for line in cells]
    return "\n".join(lines + _failures(rows))


def markdown_table(rows: Sequence[dict], columns: Sequence[Column]) -> str:
    lines = ["| " + " | ".join(c.header for c in columns) + " |", "|" + "---:|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c.key), c.fmt) for c in columns) + " |" for r in rows]
    return "\n".join(lines + [f"\n{line}" for line in _failures(rows)])


def _jsonable(value: Any) -> Any:
    """JSON has no inf or NaN: non-finite floats become null."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def write_results(out_dir: pathlib.Path, stem: str, info: RunInfo, results: dict,
                  tables: dict[str, str]) -> tuple[pathlib.Path, pathlib.Path]:
    """<stem>.json (info + results) and <stem>.md (header + one markdown table per section)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps(_jsonable({**info.to_dict(), **results}), indent=1, allow_nan=False) + "\n")
    sections = [f"## {title}\n\n{table}\n" for title, table in tables.items()]
    md_path.write_text("```\n" + info.header() + "\n```\n\n" + "\n".join(sections))
    return json_path, md_path
