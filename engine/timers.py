"""Hierarchical stage timers: each range is an NVTX range and a timed interval.

Names nest with "/" (step/verify/layer0/attn/verify_attn). On CUDA the interval is a pair of CUDA events,
resolved only in results_ns() after the step, so timing never stalls the step; on the CPU it is
perf_counter_ns. With annotate=True every range is also a torch.profiler record_function of the same full
name, so a torch.profiler capture of the decode carries our stage names (profiling/capture.py).
"""
from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple

import torch

NvtxHooks = tuple[Callable[[str], None], Callable[[], None]]  # push(full name), pop()


def nvtx_hooks() -> NvtxHooks | None:
    """Push/pop of NVTX ranges: the nvtx package (domain "ddtree", a category per stage), else torch.cuda.nvtx
    on a CUDA machine. None when nothing would record them (the package returns a no-op domain when no NVTX
    tool such as Nsight Systems is attached), so ranges then cost nothing for NVTX."""
    try:
        import nvtx
    except ImportError:  # pragma: no cover - exercised on machines without the nvtx package
        return (torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop) if torch.cuda.is_available() else None
    domain = nvtx.get_domain("ddtree")
    if domain.get_event_attributes(message="ddtree") is None:
        return None
    attributes: dict[str, object] = {}

    def push(name: str) -> None:
        if name not in attributes:
            attributes[name] = domain.get_event_attributes(message=name, category=stage_category(name))
        domain.push_range(attributes[name])

    return push, domain.pop_range


def stage_category(name: str) -> str:
    """NVTX category of a range: its top-level stage ("step/verify/layer0/attn" -> "verify")."""
    parts = name.split("/")
    return parts[1] if len(parts) > 1 else parts[0]


class Span(NamedTuple):
    """One timed range of one step: full name, start offset from the step's first range, duration (ns)."""

    name: str
    start_ns: int
    dur_ns: int


_NULL_RANGE = contextlib.nullcontext()
_NVTX = nvtx_hooks()


class _Range:
    """The context manager StepTimer.range returns when enabled (a class: cheaper than a generator)."""

    __slots__ = ("_timer", "_name", "_full", "_seq", "_start", "_record")

    def __init__(self, timer: StepTimer, name: str) -> None:
        self._timer = timer
        self._name = name

    def __enter__(self) -> None:
        timer = self._timer
        stack = timer._stack
        full = self._full = f"{stack[-1]}/{self._name}" if stack else self._name
        stack.append(full)
        self._seq = timer._num_opened
        timer._num_opened += 1
        if _NVTX is not None:
            _NVTX[0](full)
        self._record = None
        if timer.annotate:
            self._record = torch.profiler.record_function(full)
            self._record.__enter__()
        self._start = timer._mark()

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        end = timer._mark()
        if self._record is not None:
            self._record.__exit__(None, None, None)
        timer._pending.append((self._seq, self._full, self._start, end))
        if _NVTX is not None:
            _NVTX[1]()
        timer._stack.pop()


class StepTimer:
    """Collects named, nested intervals for one step at a time. A disabled timer's range() is a shared
    no-op context manager."""

    def __init__(self, device: torch.device | str = "cpu", enabled: bool = True, *, annotate: bool = False) -> None:
        self.device = torch.device(device)
        self._on_cuda = self.device.type == "cuda"  # cached: reading torch.device.type costs per range
        self.enabled = enabled
        self.annotate = annotate
        self._stack: list[str] = []  # full names of the open ranges
        self._num_opened = 0
        self._pending: list[tuple[int, str, object, object]] = []  # (open order, full name, start, end)
        self._resolved: list[tuple[int, str, object, object]] = []  # the intervals results_ns() last returned

    def range(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time the enclosed block as `name`, nested under the ranges open around it."""
        if not self.enabled:
            return _NULL_RANGE
        return _Range(self, name)

    def _mark(self) -> object:
        if self._on_cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter_ns()

    def _elapsed_ns(self, start: object, end: object) -> int:
        if self._on_cuda:
            end.synchronize()
            return round(start.elapsed_time(end) * 1e6)
        return end - start

    def results_ns(self) -> dict[str, int]:
        """Elapsed ns per range name since the last call (repeated names add up). Waits for CUDA events.

        The intervals stay available to last_spans() until the next call."""
        out: dict[str, int] = {}
        for _, name, start, end in self._pending:
            out[name] = out.get(name, 0) + self._elapsed_ns(start, end)
        self._resolved, self._pending = self._pending, []
        self._num_opened = 0
        return out

    def last_spans(self) -> list[Span]:
        """The intervals of the latest results_ns() call, in the order they were opened (a parent before its
        children), with start offsets from the first range opened (the step)."""
        ordered = sorted(self._resolved, key=lambda p: p[0])
        if not ordered:
            return []
        origin = ordered[0][2]
        return [Span(name, self._elapsed_ns(origin, start), self._elapsed_ns(start, end))
                for _, name, start, end in ordered]
