"""A torch.profiler capture (profiling/capture.py) read range by range: the device kernels each range launched
(names, launches, device time, the idle gaps between consecutive launches), which verify_attn kernel and which
tree_build path ran (kernels/kernel_names.py), and on a CPU capture the top CPU ops per range. The Profile page
and `python -m engine run --profile` both show these.

A kernel belongs to the innermost range open when its launching op ran ("own" kernels); a range's device time
with its child ranges' is RangeTime.device_ms. A gap is the time the device sat idle between one kernel's end and
the next one's start, both launched in the same occurrence of a range (one step) on one stream: time the GPU
waited for the host to launch the next kernel (Python, op dispatch, launch overhead).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from itertools import pairwise

from engine.records import MODE_LABELS, RunRecord
from kernels.kernel_names import implementation
from profiling.capture_data import Capture, KernelEvent, OpTime, RunCapture
from profiling.metrics import STEP, range_names, range_parents
from profiling.spans import PREFILL

NO_RANGE = "(outside the ranges)"
TOP_OPS = 10
IMPLEMENTED_OPS = ("verify_attn", "tree_build")


def short_name(name: str) -> str:
    """A kernel's name without its return type, namespaces and argument list: "void ddtree::cuda::(anonymous
    namespace)::verify_attn_partial_kernel<float, 4>(ddtree::cuda::VerifyAttnArgs<float>)" ->
    "verify_attn_partial_kernel<float, 4>". Names that are not C++ signatures ("Memset (Device)") stay whole."""
    if "::" not in name and not name.startswith("void "):
        return name
    text = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    depth, start, end = 0, 0, len(text)
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0 and ch == "(":
            end = i
            break
        elif depth == 0 and text.startswith("::", i):
            start = i + 2
    return text[start:end].strip()


def kernel_implementation(name: str) -> tuple[str, str] | None:
    """(op, implementation) when the kernel tells which implementation of one of our ops ran."""
    return implementation(short_name(name).split("<", 1)[0])


def range_order(run: RunRecord, rc: RunCapture) -> list[str]:
    """The captured ranges in tree order: the prefill, then the step's ranges as the timers list them."""
    known = {r.name for r in rc.ranges}
    names = [n for n in [PREFILL, *range_names(run.steps)] if n in known]
    return names + sorted(known - set(names))


def _gaps(kernels: Iterable[KernelEvent], key) -> dict:
    """Idle ns between consecutive kernels of each group (key(kernel), plus its step and stream)."""
    groups: dict[tuple, list[KernelEvent]] = defaultdict(list)
    for k in kernels:
        groups[(key(k), k.step, k.stream)].append(k)
    gaps: dict = defaultdict(list)
    for (group, _, _), ks in groups.items():
        ks.sort(key=lambda k: k.start_ns)
        gaps[group] += [max(0, b.start_ns - (a.start_ns + a.dur_ns)) for a, b in pairwise(ks)]
    return gaps


def _by_range(items: Iterable) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for x in items:
        out[x.range or NO_RANGE].append(x)
    return out


def _top_op(ops: list[OpTime]) -> str | None:
    return max(ops, key=lambda o: o.cpu_ms).name if ops else None


def _top_kernel(kernels: list[KernelEvent]) -> str | None:
    """The short name of the kernel with the most device time in total."""
    totals: dict[str, int] = defaultdict(int)
    for k in kernels:
        totals[k.name] += k.dur_ns
    return short_name(max(totals, key=totals.__getitem__)) if totals else None


def range_rows(run: RunRecord, rc: RunCapture, on_device: bool) -> list[dict]:
    """One row per captured range, parents first (depth: its nesting). On a CUDA capture: its own kernels'
    launches, device time and gaps, and its device time with its child ranges'; on the CPU: the top-level CPU
    ops called directly in it. Both: calls (occurrences) and the profiler's host ms of the range."""
    times = rc.range_times()
    order = range_order(run, rc)
    parents = range_parents(order)
    depth: dict[str, int] = {}
    kernels, gaps, ops = _by_range(rc.kernels), _gaps(rc.kernels, lambda k: k.range or NO_RANGE), _by_range(rc.ops)
    rows = []
    for name in order + ([NO_RANGE] if NO_RANGE in (kernels if on_device else ops) else []):
        depth[name] = 0 if parents.get(name) is None else depth[parents[name]] + 1
        r = times.get(name)
        row = {"range": name, "depth": depth[name], "calls": r.count if r else None, "host_ms": r.cpu_ms if r else None}
        if on_device:
            own, idle = kernels.get(name, []), gaps.get(name, [])
            row |= {"kernels": len(own), "device_ms": sum(k.dur_ns for k in own) / 1e6,
                    "device_ms_with_children": r.device_ms if r else None, "gap_ms": sum(idle) / 1e6,
                    "mean_gap_us": sum(idle) / len(idle) / 1e3 if idle else None,
                    "top_kernel": _top_kernel(own)}
        else:
            own_ops = ops.get(name, [])
            row |= {"op_calls": sum(o.count for o in own_ops), "op_ms": sum(o.cpu_ms for o in own_ops),
                    "top_op": _top_op(own_ops)}
        rows.append(row)
    return rows


def kernel_rows(rc: RunCapture, range_name: str) -> list[dict]:
    """The range's own kernels grouped by name, most device time first: launches, device ms, mean µs, share of
    the range's own device time, the implementation it names (e.g. "verify_attn: wgmma") and the full name."""
    groups: dict[str, list[KernelEvent]] = defaultdict(list)
    for k in _by_range(rc.kernels).get(range_name, []):
        groups[k.name].append(k)
    total = sum(k.dur_ns for ks in groups.values() for k in ks)
    rows = []
    for name, ks in groups.items():
        ns = sum(k.dur_ns for k in ks)
        impl = kernel_implementation(name)
        rows.append({"kernel": short_name(name), "implementation": f"{impl[0]}: {impl[1]}" if impl else "",
                     "launches": len(ks), "device_ms": ns / 1e6, "mean_us": ns / len(ks) / 1e3,
                     "share": ns / total if total else 0.0, "name": name})
    return sorted(rows, key=lambda r: -r["device_ms"])


def op_rows(rc: RunCapture, range_name: str, top: int | None = TOP_OPS) -> list[dict]:
    """The top-level CPU ops called directly in the range, most host time first (the first `top`; None: all):
    calls, host ms, mean µs per call and share of the range's op time."""
    ops: list[OpTime] = sorted(_by_range(rc.ops).get(range_name, []), key=lambda o: -o.cpu_ms)
    total = sum(o.cpu_ms for o in ops)
    return [{"op": o.name, "calls": o.count, "cpu_ms": o.cpu_ms, "mean_us": o.cpu_ms / o.count * 1e3,
             "share": o.cpu_ms / total if total else 0.0} for o in ops[:top]]


def implementations(rc: RunCapture) -> dict[str, dict[str, int]]:
    """Per op of ours, the launches of each implementation in the run ({"verify_attn": {"wgmma": 48}})."""
    out: dict[str, dict[str, int]] = {op: {} for op in IMPLEMENTED_OPS}
    for k in rc.kernels:
        impl = kernel_implementation(k.name)
        if impl is not None:
            out[impl[0]][impl[1]] = out[impl[0]].get(impl[1], 0) + 1
    return out


def implementation_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{impl} x{n}" for impl, n in sorted(counts.items(), key=lambda x: -x[1])) or "not launched"


def _in_step(name: str | None) -> bool:
    return name is not None and (name == STEP or name.startswith(STEP + "/"))


def run_summary(run: RunRecord, rc: RunCapture, on_device: bool) -> dict:
    """The run's steps at a glance. CUDA: kernels launched in steps, their device ms, the idle gaps between
    consecutive kernels within a step (per stream, whatever their range), the device's busy share of kernels
    plus gaps, and each op's implementations over the whole run (the prefill's included). CPU: the top-level ops
    called in steps and their host ms, against the profiler's host ms of the steps."""
    times = rc.range_times()
    out = {"run": MODE_LABELS[run.mode], "steps": run.num_steps,
           "step_host_ms": times[STEP].cpu_ms if STEP in times else 0.0}
    if on_device:
        in_steps = [k for k in rc.kernels if k.step is not None]
        busy_ns = sum(k.dur_ns for k in in_steps)
        idle_ns = sum(sum(g) for g in _gaps(in_steps, lambda k: None).values())
        return out | {"kernels": len(in_steps), "device_ms": busy_ns / 1e6, "gap_ms": idle_ns / 1e6,
                      "busy": busy_ns / (busy_ns + idle_ns) if busy_ns + idle_ns else None,
                      **{op: implementation_text(c) for op, c in implementations(rc).items()}}
    ops = [o for o in rc.ops if _in_step(o.range)]
    totals: dict[str, float] = defaultdict(float)
    for o in ops:
        totals[o.name] += o.cpu_ms
    return out | {"ops": sum(o.count for o in ops), "op_ms": sum(o.cpu_ms for o in ops),
                  "top_ops": ", ".join(f"{n} {ms:.2f} ms" for n, ms in sorted(totals.items(), key=lambda x: -x[1])[:3])}


def summary_lines(runs: dict[str, RunRecord], capture: Capture) -> list[str]:
    """The capture's summary as the CLI prints it, one line per run."""
    on_device = "cuda" in capture.activities
    lines = []
    for mode, rc in capture.runs.items():
        s = run_summary(runs[mode], rc, on_device)
        head = f"{s['run']} capture ({', '.join(capture.activities)}), {s['steps']} steps: "
        if on_device:
            busy = "-" if s["busy"] is None else f"{s['busy']:.0%}"
            lines.append(head + f"{s['kernels']} kernels, {s['device_ms']:.3f} ms on the device, {s['gap_ms']:.3f} "
                         f"ms idle between consecutive kernels (busy {busy}); verify_attn: {s['verify_attn']}; "
                         f"tree_build: {s['tree_build']}")
        else:
            lines.append(head + f"no device kernels (a CPU run); {s['ops']} top-level CPU ops, {s['op_ms']:.3f} ms "
                         f"of {s['step_host_ms']:.3f} ms profiled step time; top: {s['top_ops'] or '-'}")
    return lines
