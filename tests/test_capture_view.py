"""profiling/capture_view.py: a capture read range by range, against torch.profiler's own key_averages (CPU here,
device kernels on a GPU), brute-force gap sums over random kernel timelines, and the kernel names that say which
implementation ran against the CUDA sources."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.drafters import DrafterSpec
from engine.records import MODE_LABELS
from kernels.kernel_names import IMPLEMENTATIONS
from profiling import capture, capture_view
from profiling.capture_data import Capture, KernelEvent, RangeTime, RunCapture

CUDA_DIR = Path(__file__).resolve().parents[1] / "kernels" / "csrc" / "cuda"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def profiled(monkeypatch, ckpt, cfg: DecodeConfig, modes=("ddtree",)):
    """capture_runs as the CLI and the page call it, keeping each torch.profiler.profile it made (AR's first)."""
    made = []

    class Keep(torch.profiler.profile):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(torch.profiler, "profile", Keep)
    runs, cap = capture.capture_runs(DecodeRequest(ckpt, ckpt.prompt.tolist(), cfg, DrafterSpec(noise=0.3), modes))
    assert len(made) == len(cap.runs)
    return runs, cap, dict(zip(cap.runs, made, strict=True))


def test_short_names_drop_the_signature_and_name_the_implementation():
    cases = {
        "void ddtree::cuda::(anonymous namespace)::verify_attn_partial_kernel<float, 4>(ddtree::cuda::"
        "VerifyAttnArgs<float>)": "verify_attn_partial_kernel<float, 4>",
        "void ddtree::cuda::tc_sm90::(anonymous namespace)::verify_attn_wgmma_kernel(ddtree::cuda::VerifyAttnArgs"
        "<__nv_bfloat16>)": "verify_attn_wgmma_kernel",
        "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::AddFunctor<float> >"
        "(at::TensorIteratorBase&, at::native::AddFunctor<float> const&)::{lambda(int)#1}>(int, float)":
            "elementwise_kernel<128, 2, at::native::gpu_kernel_impl<at::native::AddFunctor<float> >"
            "(at::TensorIteratorBase&, at::native::AddFunctor<float> const&)::{lambda(int)#1}>",
        "Memset (Device)": "Memset (Device)",
        "ampere_sgemm_128x64_tn": "ampere_sgemm_128x64_tn",
    }
    for name, short in cases.items():
        assert capture_view.short_name(name) == short
    assert capture_view.kernel_implementation(next(iter(cases))) == ("verify_attn", "cuda-core")
    assert capture_view.kernel_implementation(
        "void ddtree::cuda::(anonymous namespace)::tree_build_threshold_kernel(ddtree::cuda::(anonymous "
        "namespace)::SelectArgs)") == ("tree_build", "threshold")
    assert capture_view.kernel_implementation("void ddtree::cuda::verify_attn_combine_kernel<float, 4>(x)") is None


def test_the_implementation_table_names_the_kernels_the_sources_define():
    """Every listed name is a __global__ function in kernels/csrc/cuda, and every verify_attn or tree_build
    kernel there is listed except the ones that run whatever the choice (the combine step, the top-k)."""
    text = "\n".join(p.read_text() for p in CUDA_DIR.glob("*.cu"))
    defined = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", text))
    assert set(IMPLEMENTATIONS) <= defined
    ours = {n for n in defined if n.startswith(("verify_attn", "tree_build"))}
    assert ours - set(IMPLEMENTATIONS) == {"verify_attn_combine_kernel"}
    binding = (CUDA_DIR / "binding.cpp").read_text()
    for op, impl in IMPLEMENTATIONS.values():  # the variant names are the DDTREE_* environment choices
        assert impl == "batch-invariant" or f'{{"{impl}",' in binding, (op, impl)


def random_run_capture(rng: random.Random) -> RunCapture:
    """Kernels on two streams across a few steps and ranges; on one stream kernels never overlap."""
    names = ["prefill", "step", "step/verify", "step/verify/layer0/attn", "step/tree_build"]
    kernels = []
    for step in [None, *range(rng.randint(1, 4))]:
        for stream in (7, 8):
            t = rng.randrange(100)
            for _ in range(rng.randint(0, 30)):
                t += rng.choice([0, 0, rng.randrange(1, 500)])
                dur = rng.randrange(1, 300)
                rng_name = "prefill" if step is None else rng.choice(names[1:] + [None])
                kernels.append(KernelEvent(rng.choice(["k_a", "k_b", "void ns::tree_build_heap_kernel(x)"]), stream,
                                           step, rng_name, t, dur))
                t += dur
    rng.shuffle(kernels)
    return RunCapture([RangeTime(n, 1, 1.0, 1.0) for n in names], [], kernels)


@pytest.mark.parametrize("seed", [random.randrange(2**31) for _ in range(20)])
def test_gaps_and_device_time_equal_a_brute_force_count(seed):
    rng = random.Random(seed)
    rc = random_run_capture(rng)
    fake_run = type("Run", (), {"steps": [], "mode": "ddtree", "num_steps": 3})()
    rows = {r["range"]: r for r in capture_view.range_rows(fake_run, rc, on_device=True)}
    groups: dict = {}
    for k in rc.kernels:
        groups.setdefault((k.range or capture_view.NO_RANGE, k.step, k.stream), []).append(k)
    for name, row in rows.items():
        mine = [ks for (r, _, _), ks in groups.items() if r == name]
        # one stream runs kernels back to back: the idle time is the span minus the busy time
        idle = sum(max(k.start_ns + k.dur_ns for k in ks) - min(k.start_ns for k in ks) - sum(k.dur_ns for k in ks)
                   for ks in mine)
        assert row["gap_ms"] == pytest.approx(idle / 1e6), seed
        assert row["kernels"] == sum(len(ks) for ks in mine)
        assert row["device_ms"] == pytest.approx(sum(k.dur_ns for ks in mine for k in ks) / 1e6)
        totals: dict[str, int] = {}
        for k in (k for ks in mine for k in ks):
            totals[k.name] = totals.get(k.name, 0) + k.dur_ns
        assert (row["top_kernel"] is None) == (not totals)
        if totals:
            top = [v for n, v in totals.items() if capture_view.short_name(n) == row["top_kernel"]]
            assert top == [max(totals.values())]
        kernel_rows = capture_view.kernel_rows(rc, name)
        assert sum(r["launches"] for r in kernel_rows) == row["kernels"]
        assert sum(r["share"] for r in kernel_rows) == pytest.approx(1.0 if row["kernels"] else 0.0)
    summary = capture_view.run_summary(fake_run, rc, on_device=True)
    steps = [ks for (_, s, _), ks in groups.items() if s is not None]
    by_step: dict = {}
    for ks in steps:
        for k in ks:
            by_step.setdefault((k.step, k.stream), []).append(k)
    idle = sum(max(k.start_ns + k.dur_ns for k in ks) - min(k.start_ns for k in ks) - sum(k.dur_ns for k in ks)
               for ks in by_step.values())
    assert summary["gap_ms"] == pytest.approx(idle / 1e6)
    heap = sum(k.name.endswith("tree_build_heap_kernel(x)") for k in rc.kernels)
    assert summary["tree_build"] == (f"heap x{heap}" if heap else "not launched")


def test_a_cpu_capture_per_range_equals_key_averages(monkeypatch, tiny_checkpoint):
    """Each range's calls and host time, and the ddtree ops' calls and host time summed over the ranges'
    op tables, equal what torch.profiler's key_averages counts in the same profile."""
    cfg = DecodeConfig(budget=random.randint(4, 24), block_size=4, max_new_tokens=8)
    runs, cap, profiles = profiled(monkeypatch, tiny_checkpoint, cfg)
    assert cap.activities == ["cpu"]
    for mode, rc in cap.runs.items():
        averages = {e.key: e for e in profiles[mode].key_averages()}
        rows = capture_view.range_rows(runs[mode], rc, on_device=False)
        assert {r["range"] for r in rows} >= {"prefill", "step", "step/verify"}
        calls: dict[str, int] = {}
        host: dict[str, float] = {}
        for r in rows:
            ops = capture_view.op_rows(rc, r["range"], top=None)
            assert r["op_calls"] == sum(o["calls"] for o in ops)
            for o in ops:
                calls[o["op"]] = calls.get(o["op"], 0) + o["calls"]
                host[o["op"]] = host.get(o["op"], 0.0) + o["cpu_ms"]
            if r["range"] == capture_view.NO_RANGE:
                continue
            assert r["calls"] == averages[r["range"]].count, r["range"]
            assert r["host_ms"] == pytest.approx(averages[r["range"]].cpu_time_total / 1e3), r["range"]
        ours = [k for k in averages if k.startswith("ddtree::")]
        assert "ddtree::verify_attn" in ours and ("ddtree::tree_build" in ours) == (mode != "ar")
        for op in ours:  # called directly in a range, never inside another op
            assert calls[op] == averages[op].count, op
            assert host[op] == pytest.approx(averages[op].cpu_time_total / 1e3), op
        for op, n in calls.items():  # top-level calls only: never more than every call
            assert n <= averages[op].count, op
        assert len(capture_view.op_rows(rc, "step/verify", top=3)) <= 3
    lines = capture_view.summary_lines(runs, cap)
    assert len(lines) == len(cap.runs)
    for line, (mode, rc) in zip(lines, cap.runs.items(), strict=True):
        s = capture_view.run_summary(runs[mode], rc, on_device=False)
        assert line.startswith(f"{MODE_LABELS[mode]} capture (cpu), {runs[mode].num_steps} steps: no device kernels")
        assert f"{s['ops']} top-level CPU ops, {s['op_ms']:.3f} ms" in line


def test_the_cli_prints_the_capture_summary(tiny_checkpoint, capsys, monkeypatch):
    from cli.__main__ import main

    seen = []
    real = capture_view.summary_lines
    monkeypatch.setattr("cli.run.summary_lines", lambda runs, cap: seen.append(real(runs, cap)) or seen[-1])
    fixture = str(Path(__file__).parents[1] / "models" / "model_tiny.kdtr")
    assert main(["run", "--fixture", fixture, "--budget", "6", "--block-size", "3", "--max-new", "6", "--profile"]) == 0
    out = capsys.readouterr().out
    assert seen and all(line in out.splitlines() for line in seen[0])
    assert out.count("capture (cpu)") == 2, "AR and DDTree"


# -- on the GPU ---------------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.cuda
def test_a_cuda_capture_per_kernel_equals_key_averages(monkeypatch, tiny_checkpoint):
    """Each kernel's launches and device time, summed over every range's kernel table (the prefill's and those
    outside the ranges included), equal key_averages' count and self device time of that kernel; float32 runs
    verify_attn's CUDA-core kernel, B = 8 tree_build's heap and B = 64 its threshold build."""
    for budget, path in ((8, "heap"), (64, "threshold")):
        cfg = DecodeConfig(budget=budget, block_size=4, max_new_tokens=8, device="cuda")
        runs, cap, profiles = profiled(monkeypatch, tiny_checkpoint, cfg)
        assert cap.activities == ["cpu", "cuda"]
        for mode, rc in cap.runs.items():
            averages = {e.key: e for e in profiles[mode].key_averages()}
            rows = capture_view.range_rows(runs[mode], rc, on_device=True)
            launches: dict[str, int] = {}
            device: dict[str, float] = {}
            for r in rows:
                for k in capture_view.kernel_rows(rc, r["range"]):
                    launches[k["name"]] = launches.get(k["name"], 0) + k["launches"]
                    device[k["name"]] = device.get(k["name"], 0.0) + k["device_ms"]
            assert launches
            for name, n in launches.items():
                assert n == averages[name].count, name
                assert device[name] == pytest.approx(averages[name].self_device_time_total / 1e3, rel=1e-3), name
            impl = capture_view.implementations(rc)
            assert set(impl["verify_attn"]) == {"cuda-core"}
            assert set(impl["tree_build"]) == (set() if mode == "ar" else {path})
            summary = capture_view.run_summary(runs[mode], rc, on_device=True)
            assert 0 < summary["busy"] <= 1 and summary["kernels"] > 0


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["wgmma", "mma", "cuda-core"])
def test_a_forced_verify_attn_kernel_is_the_one_the_capture_names(monkeypatch, kernel):
    from kernels import ops

    major, _ = torch.cuda.get_device_capability()
    if (kernel == "wgmma" and major != 9) or (kernel == "mma" and major < 8):
        pytest.skip(f"{kernel} does not run on compute capability {major}.x")
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_KERNEL", kernel)
    n, h, s = 17, 8, 256
    dev = {"device": "cuda", "dtype": torch.bfloat16}
    args = (torch.randn(n, h, 512, **dev), torch.randn(n, h, 64, **dev), torch.randn(s, 512, **dev),
            torch.randn(s, 64, **dev), torch.tensor(64, device="cuda"),
            torch.ones(n, n, dtype=torch.bool, device="cuda").tril(), 0.05)
    ops.verify_attn(*args)  # built and warm
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("step"), torch.profiler.record_function("step/verify_attn"):
            ops.verify_attn(*args)
        torch.cuda.synchronize()
    rc = capture.attribute(capture.events_from(prof), {"step", "step/verify_attn"})
    assert capture_view.implementations(rc)["verify_attn"] == {kernel: 1}
    rows = capture_view.kernel_rows(rc, "step/verify_attn")
    assert any(r["implementation"] == f"verify_attn: {kernel}" for r in rows)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize("method, budget, path", [("auto", 16, "heap"), ("auto", 256, "threshold"),
                                                  ("heap", 256, "heap"), ("threshold", 16, "threshold")])
def test_tree_builds_path_is_the_one_the_capture_names(monkeypatch, method, budget, path):
    from kernels import ops

    monkeypatch.setenv("DDTREE_TREE_BUILD", method)
    draft = torch.log_softmax(torch.randn(7, 4096, device="cuda"), -1)
    root = torch.tensor(3, device="cuda")
    ops.tree_build(draft, root, budget)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function("step"), torch.profiler.record_function("step/tree_build"):
            ops.tree_build(draft, root, budget)
        torch.cuda.synchronize()
    rc = capture.attribute(capture.events_from(prof), {"step", "step/tree_build"})
    assert capture_view.implementations(rc)["tree_build"] == {path: 1}
    summary = capture_view.summary_lines({"ddtree": type("Run", (), {"mode": "ddtree", "num_steps": 1, "steps": []})()},
                                         Capture(["cpu", "cuda"], {"ddtree": rc}))
    assert f"tree_build: {path} x1" in summary[0]
