"""The benchmark scripts at their smallest CPU setting, end to end, and their shared pieces."""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

from benchmarks.baselines import heapq_tree_build, random_parents, visibility_of
from benchmarks.common import (
    L2_BYTES,
    QUICK,
    ROTATION_FACTOR,
    Ceilings,
    Column,
    markdown_table,
    num_input_sets,
    time_wall,
)
from profiling.stage_floor import LATENCY_BOUND_MS

REPO = pathlib.Path(__file__).resolve().parent.parent


def run_quick(tmp_path_factory, module: str, name: str) -> tuple[str, dict, str]:
    """One --quick CPU run of a benchmark script: its stdout, its JSON and its markdown tables."""
    out = tmp_path_factory.mktemp(name)
    proc = subprocess.run([sys.executable, "-m", module, "--device", "cpu", "--quick", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out / f"{name}-cpu.json").read_text()), (out / f"{name}-cpu.md").read_text()


@pytest.fixture(scope="module")
def kernels_run(tmp_path_factory):
    return run_quick(tmp_path_factory, "benchmarks.bench_kernels", "kernels")


@pytest.fixture(scope="module")
def decode_run(tmp_path_factory):
    return run_quick(tmp_path_factory, "benchmarks.bench_decode", "decode")


def assert_positive(row: dict, *keys: str) -> None:
    for key in keys:
        value = row[key]
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0, (key, value, row)


def check_header(stdout: str, data: dict, benchmark: str) -> None:
    assert data["benchmark"] == benchmark and data["quick"] is True
    assert data["environment"]["device"] == "cpu" and data["environment"]["torch"] == torch.__version__
    assert_positive(data["ceilings"], "copy_tbps", "matmul_tflops")
    first = stdout.splitlines()[:3]
    assert "torch " + torch.__version__ in first[0] and "TB/s" in first[1] and "TFLOP/s" in first[1]


def test_bench_kernels_quick_cpu(kernels_run):
    stdout, data, md = kernels_run
    check_header(stdout, data, "bench_kernels")
    grid = data["grid"]
    attn = data["verify_attn"]
    assert {(r["N"], r["S"]) for r in attn} == {(n, s) for n in grid["attn_nodes"] for s in grid["attn_rows"]}
    for r in attn:
        assert_positive(r, "ours_us", "torch_us", "speedup", "ours_tbps", "ours_tflops", "torch_tflops",
                        "ours_roofline", "torch_roofline", "floor_us", "bytes", "flops")
        assert r["prefix_len"] == r["S"] - r["N"]
        assert r["err_ours"] < 1e-4 and r["err_torch"] < 1e-4 and r["err_exact"] < 1e-4, r  # float32 vs float64
        assert r["speedup"] == pytest.approx(r["torch_us"] / r["ours_us"])
        assert r["exact_over_ours"] == pytest.approx(r["exact_us"] / r["ours_us"])
    splits = data["verify_attn_splits"]  # on the CPU: the fast and the batch-invariant kernel, no split targets
    assert [(r["N"], r["S"]) for r in splits] == [(r["N"], r["S"]) for r in attn]
    for r in splits:
        assert_positive(r, "ours_us", "exact_us")
        assert r["exact_over_ours"] == pytest.approx(r["exact_us"] / r["ours_us"]) and "exact_32_us" not in r
    assert [r["B"] for r in data["tree_build"]] == grid["build_budgets"]
    for r in data["tree_build"]:
        assert_positive(r, "ours_us", "topk_us", "heapq_us", "heapq_over_ours", "floor_us", "ours_roofline")
        assert r["match_heapq"] is True  # the heapq baseline builds the op's tree, element for element
    for name in ("tree_accept", "kv_compact"):
        assert [r["B"] for r in data[name]] == grid["accept_budgets"]
        for r in data[name]:
            assert_positive(r, "ours_us", "ref_us", "ref_over_ours")
            assert r["match_ref"] is True and 1 <= r["path_len"] <= grid["draft_depths"] + 1
    assert_positive(data["kv_compact"][0], "bytes", "ours_tbps")
    for section in ("verify_attn", "verify_attn_splits", "tree_build", "tree_accept", "kv_compact"):
        assert f"## {section}" in md and section in stdout


def test_bench_decode_quick_cpu(decode_run):
    stdout, data, md = decode_run
    check_header(stdout, data, "bench_decode")
    plan, rows = data["plan"], data["rows"]
    assert [(r["mode"], r["drafter"], r["budget"], r["noise"]) for r in rows] == [("AR", None, 0, None)] + [
        ("DDTree", "oracle", b, n) for n in plan["noises"] for b in plan["budgets"]] + [
        ("chain", "dflash", None, None)] + [("DDTree", "dflash", b, None) for b in (*plan["budgets"], "auto")] + [
        ("AR", None, 0, None), ("DDTree", "oracle", plan["budgets"][len(plan["budgets"]) // 2], 0.0)]
    assert [r["batch_invariant"] for r in rows] == [False] * (len(rows) - 2) + [True, True]
    for r in rows[-2:]:  # the batch-invariant mode beside its fast twin, in the same run
        twin = next(f for f in rows if not f["batch_invariant"] and (f["mode"], f["budget"], f["noise"]) ==
                    (r["mode"], r["budget"], r["noise"]))
        assert r["over_fast_eager"] == pytest.approx(r["eager_step_ms"] / twin["eager_step_ms"])
    assert_positive(data, "prefill_ms", "ar_floor_ms")
    assert data["ar_floor_ms"] == rows[0]["floor_ms"]
    for r in rows:
        assert_positive(r, "eager_step_ms", "eager_tokens_per_s", "speedup_eager", "step_over_ar_eager",
                        "tau_eager", "profiled_step_ms")
        assert r["graph_step_ms"] is None  # no CUDA graphs on the CPU
        assert r["tokens_match_ar"] is True  # greedy-exact: every drafter's decode commits the AR tokens
        block_size = plan["dflash_block_size"] if r["drafter"] == "dflash" else plan["block_size"]
        assert 1 <= r["tau_eager"] <= block_size
        eager = r["eager"]  # tokens over the timed steps' whole time (an auto budget's steps differ)
        assert r["eager_tokens_per_s"] == pytest.approx(eager["tau"] * eager["num_steps"] / eager["total_ms"] * 1e3)
        assert eager["p10_ms"] <= eager["median_ms"] <= eager["p90_ms"] and eager["total_ms"] > 0
        share = r["stage_share"]
        assert 0 < share["verify"] <= 1 and share["verify_attn"] > 0
        top_level = ("draft", "draft_update", "tree_build", "verify", "tree_accept", "kv_compact", "commit")
        assert sum(share[k] for k in top_level) <= 1 + 1e-6  # disjoint parts of the step
        assert share["drafter"] == pytest.approx(share["draft"] + share["draft_update"])
    assert rows[0]["tau_eager"] == 1 and rows[0]["stage_share"]["tree_build"] == 0
    assert rows[0]["stage_share"]["drafter"] == 0, "AR has no drafter"
    exact = [r for r in rows if r["noise"] == 0.0]
    assert all(r["tau_eager"] == plan["block_size"] for r in exact)  # the exact oracle is accepted in full
    # every step of the learned drafter's fixed rows drafts and commits to it; the auto row's profiled steps may all
    # be a back-off's draft-free AR steps, which leave the drafter alone
    learned = [r for r in rows if r["drafter"] == "dflash" and r["budget"] != "auto"]
    assert all(r["stage_share"]["draft"] > 0 and r["stage_share"]["draft_update"] > 0 for r in learned)
    chain = next(r for r in rows if r["mode"] == "chain")  # its drafter's parts as graph replays: none on the CPU
    assert chain["drafter_forward_graph_ms"] is None and chain["drafter_update_over_floor"] is None
    assert chain["drafter_forward_floor_ms"] == chain["floor_ms_draft"] > 0
    layout = data["dflash"]
    assert layout["num_hidden_layers"] == plan["dflash_layers"] and layout["block_size"] == plan["dflash_block_size"]
    assert layout["target_layer_ids"] == list(range(data["model"]["num_hidden_layers"]))
    assert layout["hidden_size"] == data["model"]["hidden_size"] and layout["mask_token_id"] == 510
    assert "## steps" in md and "DDTree" in stdout and "dflash chain:" in stdout
    assert "## stages against their floor" in md and "stages against their floor (ms; x: stage time / floor)" in stdout
    for r in rows:  # every stage's floor beside its share, the step's floor their sum
        assert r["floor_ms"] == pytest.approx(sum(r[f"floor_ms_{s}"] or 0 for s in top_level if f"floor_ms_{s}" in r))
        assert r["floor_ms_verify/ffn"] > 0
        for stage in ("verify", "verify/attn"):  # no ratio over a floor under the launch-latency bound
            floor, over = r[f"floor_ms_{stage}"], r[f"over_floor_{stage}"]
            assert floor > 0 and (over is None) == (floor < LATENCY_BOUND_MS), (stage, floor, over)
            assert over is None or over > 0
    assert all(r["floor_ms_draft"] > 0 and r["over_floor_draft"] > 0 for r in learned)


def test_cuda_request_without_gpu_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_decode", "--device", "cuda", "--out",
                           str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "torch sees no CUDA GPU" in proc.stderr and "--device cpu" in proc.stderr


def test_heapq_baseline_matches_the_reference_op():
    from kernels import reference

    draft = torch.log_softmax(3.0 * torch.randn(5, 300), dim=-1)
    root = int(torch.randint(300, ()))
    for budget in (0, 1, 17, 400):
        got = heapq_tree_build(draft, root, budget)
        want = reference.tree_build(draft, torch.tensor(root), budget)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w.numpy())


def test_random_tree_visibility_is_ancestor_closure():
    rng = np.random.default_rng()
    parents = random_parents(40, rng)
    assert parents[0] == -1 and all(0 <= parents[i] < i for i in range(1, 40))
    vis = visibility_of(parents)
    for i in range(40):
        ancestors, j = set(), i
        while j != -1:
            ancestors.add(j)
            j = parents[j]
        assert set(np.flatnonzero(vis[i])) == ancestors


def test_rotation_spans_several_l2s_and_floor_is_the_binding_limit():
    set_bytes = int(np.random.default_rng().integers(10**5, 10**8))
    n = num_input_sets(set_bytes)
    assert n >= 2 and (n * set_bytes >= ROTATION_FACTOR * L2_BYTES or n == 128)
    c = Ceilings(copy_tbps=4.0, matmul_tflops=800.0, dtype="bfloat16", copy_bytes=1, matmul_n=1)
    assert c.floor_us(4e6, 0) == pytest.approx(1.0) and c.floor_us(4e6, 8e8 * 10) == pytest.approx(10.0)


def test_time_wall_and_tables():
    t = time_wall(lambda x: sum(range(x)), [1000, 2000], torch.device("cpu"), QUICK)
    assert 0 < t.p10_us <= t.median_us <= t.p90_us and t.method == "wall" and t.num_sets == 2
    table = markdown_table([{"a": 1.23456, "b": None}], [Column("a", "A", "{:.2f}"), Column("b", "B")])
    assert table.splitlines() == ["| A | B |", "|---:|---:|", "| 1.23 | - |"]


def test_the_benchmarks_learned_drafter_has_kimi_k25_widths_on_k2_mini():
    from benchmarks.bench_decode import dflash_layout, k2_mini
    from benchmarks.decode_steps import Plan
    from engine.loaders.dflash_tensors import tensor_shapes
    from engine.model.dflash_fixtures import kimi_k25_layout

    layers = int(np.random.default_rng().integers(1, 7))
    layout = dflash_layout(k2_mini(), Plan(256, (16,), (0.0,), 16, 1, 1, 1, dflash_layers=layers, dflash_block_size=8))
    kimi = kimi_k25_layout()
    shapes, kimi_shapes = tensor_shapes(layout), tensor_shapes(kimi)
    assert all(shapes[f"layers.0.{n}"] == kimi_shapes[f"layers.0.{n}"] for n in ("self_attn.q_proj.weight",
               "self_attn.k_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.down_proj.weight"))
    assert layout.num_hidden_layers == layers and layout.block_size == 8 and layout.target_layer_ids == (0, 1)
    assert layout.mask_token_id == kimi.mask_token_id and layout.vocab_size == kimi.vocab_size


def test_bench_exact_quick_cpu(tmp_path_factory):
    """Both modes' steps timed side by side on the shipped pair; the batch-invariant decodes commit AR's tokens."""
    stdout, data, md = run_quick(tmp_path_factory, "benchmarks.bench_exact", "exact")
    check_header(stdout, data, "bench_exact")
    assert [(r["mode"], r["budget"]) for r in data["rows"]] == [("AR", None), ("DDTree", 16)]
    for row in data["rows"]:
        assert_positive(row, "fast_ms", "exact_ms", "ratio")
        assert row["ratio"] == pytest.approx(row["exact_ms"] / row["fast_ms"])
        assert row["exact_tokens_match_ar"] is True
    assert "batch-inv. / fast" in md and "batch-invariant ms/step" in stdout
