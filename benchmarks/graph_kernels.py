"""The kernels of a decoder's CUDA-graph step, from torch.profiler: which kernels a replayed step runs, how many
launches of each and their device time per step, largest first, and what the step's wall time holds beyond them
(Nsight Systems' kernel summary, for one step). bench_moe prints it for the AR row and the largest exact-oracle tree,
where a step's time over its floor has to be found kernel by kernel."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import Column
from profiling.capture import ProfEvent, events_from
from profiling.capture_view import short_name

TOP_KERNELS = 12  # kernels listed per step; the rest are summed in one line
NAME_CHARS = 72  # a kernel's short name is cut here in the tables (cuBLAS's names run to 100 characters)
KERNEL_COLUMNS = [
    Column("row", "step"), Column("kernel", "kernel"), Column("launches", "launches / step", "{:g}"),
    Column("us", "us / step", "{:.1f}"), Column("share", "share of kernel time", "{:.1%}"),
]


def kernel_summary(events: Iterable[ProfEvent], num_steps: int) -> list[dict]:
    """The device events of num_steps steps grouped by short name: launches and us per step, largest first."""
    launches: dict[str, int] = defaultdict(int)
    total_ns: dict[str, int] = defaultdict(int)
    for e in events:
        if e.on_device:
            name = short_name(e.name)
            launches[name] += 1
            total_ns[name] += e.dur_ns
    rows = [{"kernel": name, "launches": launches[name] / num_steps, "us": total_ns[name] / num_steps / 1e3}
            for name in total_ns]
    return sorted(rows, key=lambda r: -r["us"])


def profile_steps(step: Callable[[], object], num_steps: int) -> list[dict]:
    """kernel_summary of num_steps calls of step (a graph decoder's advance), profiled on the device."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            step()
        torch.cuda.synchronize()
    return kernel_summary(events_from(prof), num_steps)


def kernel_rows(label: str, kernels: list[dict], step_ms: float | None, top: int = TOP_KERNELS) -> list[dict]:
    """One step's table rows: its top kernels with their share of the step's kernel time, the rest in one row, then
    the total against the step's measured time (what is left is the device idling between kernels)."""
    total_us = sum(k["us"] for k in kernels)
    rows = [{"row": label, **k, "kernel": k["kernel"][:NAME_CHARS], "share": k["us"] / total_us}
            for k in kernels[:top]]
    rest = kernels[top:]
    if rest:
        rows.append({"row": label, "kernel": f"({len(rest)} other kernels)",
                     "launches": sum(k["launches"] for k in rest), "us": sum(k["us"] for k in rest),
                     "share": sum(k["us"] for k in rest) / total_us})
    rows.append({"row": label, "kernel": "all kernels", "launches": sum(k["launches"] for k in kernels),
                 "us": total_us, "share": 1.0})
    if step_ms:
        rows.append({"row": label, "kernel": "the step (graph replay, median)", "us": step_ms * 1e3})
    return rows
