"""What a torch.profiler capture leaves for the reports: per-range and per-op times, and device kernels.

Plain data (no torch), so the exporters read it without importing the engine; profiling/capture.py fills it.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(slots=True)
class RangeTime:
    name: str
    count: int
    cpu_ms: float  # the profiler's host time of the range (record_function), summed over its occurrences
    device_ms: float  # device time of the kernels launched inside it, child ranges included


@dataclass(slots=True)
class OpTime:
    range: str | None  # innermost of our ranges around the op (None: outside every range)
    name: str
    count: int
    cpu_ms: float
    device_ms: float


@dataclass(slots=True)
class KernelEvent:
    """A device kernel on the run's timeline: start_ns from the start of its step's "step" range (from the
    prefill's start when step is None)."""

    name: str
    stream: int
    step: int | None
    range: str | None
    start_ns: int
    dur_ns: int


@dataclass(slots=True)
class RunCapture:
    ranges: list[RangeTime]
    ops: list[OpTime]
    kernels: list[KernelEvent]

    def range_times(self) -> dict[str, RangeTime]:
        return {r.name: r for r in self.ranges}


@dataclass(slots=True)
class Capture:
    activities: list[str]  # "cpu", "cuda"
    runs: dict[str, RunCapture]  # by mode: "ar", "chain", "ddtree"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
