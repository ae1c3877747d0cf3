"""benchmarks/graph_kernels.py: a step's kernels grouped, counted and ranked from profiler events, and (on a GPU) from
a captured graph's replays."""
from __future__ import annotations

import random

import pytest
import torch

from benchmarks.graph_kernels import kernel_rows, kernel_summary, profile_steps
from kernels.graph_capture import capture
from profiling.capture import ProfEvent

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def device_event(name: str, dur_ns: int, on_device: bool = True) -> ProfEvent:
    return ProfEvent(name, 0, dur_ns, 0, on_device, 7 if on_device else 0, 0, 0)


def test_kernel_summary_groups_by_short_name_per_step_and_ranks_by_time():
    rng = random.Random()
    names = [f"void ddtree::cuda::(anonymous namespace)::k{i}<float, 4>(ddtree::cuda::Args<float>)" for i in range(5)]
    num_steps = rng.randint(2, 5)
    events, want = [], {}
    for i, name in enumerate(names):
        durations = [rng.randint(1, 10_000) for _ in range(num_steps * (i + 1))]
        events += [device_event(name, d) for d in durations]
        want[f"k{i}<float, 4>"] = (i + 1, sum(durations) / num_steps / 1e3)
    events.append(device_event("aten::mm", 10**9, on_device=False))  # a host op is no kernel
    rng.shuffle(events)
    rows = kernel_summary(events, num_steps)
    assert {r["kernel"]: (r["launches"], pytest.approx(r["us"])) for r in rows} == want
    assert [r["us"] for r in rows] == sorted((r["us"] for r in rows), reverse=True)


def test_kernel_rows_keep_the_top_sum_the_rest_and_set_the_step_beside_the_kernels():
    kernels = [{"kernel": f"k{i}" + "x" * 100, "launches": 2.0, "us": float(10 - i)} for i in range(6)]
    rows = kernel_rows("AR", kernels, step_ms=0.06, top=3)
    total = sum(k["us"] for k in kernels)
    assert [r["us"] for r in rows[:3]] == [10.0, 9.0, 8.0] and all(len(r["kernel"]) == 72 for r in rows[:3])
    assert rows[3] == {"row": "AR", "kernel": "(3 other kernels)", "launches": 6.0, "us": 7 + 6 + 5,
                       "share": pytest.approx((7 + 6 + 5) / total)}
    assert rows[4]["kernel"] == "all kernels" and rows[4]["us"] == total and rows[4]["launches"] == 12.0
    assert rows[5] == {"row": "AR", "kernel": "the step (graph replay, median)", "us": pytest.approx(60.0)}
    assert sum(r["share"] for r in rows[:4]) == pytest.approx(1.0)
    assert kernel_rows("AR", kernels, step_ms=None, top=6)[-1]["kernel"] == "all kernels"


@pytest.mark.cuda
@needs_cuda
def test_a_captured_graphs_replays_are_profiled_kernel_by_kernel():
    """A replayed step's kernels are the ones its eager calls launch, as many times a step."""
    a = torch.randn(512, 512, device="cuda")
    out = torch.empty_like(a)

    def body():
        torch.mm(a, a, out=out)
        out.add_(1)
        out.mul_(2)

    graph, _ = capture(body, body)
    replayed, eager = profile_steps(graph.replay, 3), profile_steps(body, 3)
    assert {r["kernel"]: r["launches"] for r in replayed} == {r["kernel"]: r["launches"] for r in eager}
    assert sum(r["launches"] for r in replayed) >= 3  # the matmul (cuBLAS may add a kernel), the add, the multiply
    assert all(r["us"] > 0 for r in replayed)
