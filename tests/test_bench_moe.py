"""bench_moe at its smallest CPU setting, end to end, and its sizing and floor arithmetic."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from test_benchmarks import REPO, assert_positive, check_header, run_quick

from benchmarks.bench_moe import (
    DRAFTER_TABLE,
    HEADROOM_BYTES,
    LAYER_TOKENS,
    kimi_k2,
    layers_that_fit,
    model_bytes,
    quick_k2,
    uniform_touched,
)
from benchmarks.stage_floors import FLOOR_STAGES, KIMI_K2_LAYERS
from engine.model.read_bytes import TargetBytes
from profiling.stage_floor import LATENCY_BOUND_MS


@pytest.fixture(scope="module")
def moe_run(tmp_path_factory):
    return run_quick(tmp_path_factory, "benchmarks.bench_moe", "moe")


def test_bench_moe_quick_cpu(moe_run):
    stdout, data, md = moe_run
    check_header(stdout, data, "bench_moe")
    cfg, plan, rows = quick_k2(), data["plan"], data["rows"]
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    assert [(r["mode"], r["drafter"], r["budget"], r["noise"]) for r in rows] == [("AR", None, 0, None)] + [
        ("DDTree", "oracle", b, n) for n in plan["noises"] for b in (*plan["budgets"], "auto")] + [
        ("chain", "dflash", None, None)] + [("DDTree", "dflash", b, None) for b in (*plan["budgets"], "auto")]
    assert_positive(data, "prefill_ms", "model_bytes")
    assert data["model_bytes"] == model_bytes(cfg, 4) and data["moe_path"] in ("sparse", "dense")
    for r in rows:
        assert_positive(r, "eager_step_ms", "floor_ms", "eager_over_floor", "eager_tokens_per_s", "touched")
        assert r["graph_step_ms"] is None and r["tokens_match_ar"] is True
        assert 1 <= r["tau_eager"] <= plan["block_size"]
        assert len(r["touched_per_layer"]) == num_moe and r["touched"] == pytest.approx(sum(r["touched_per_layer"]))
        if r["mode"] == "chain":
            assert r["num_nodes"] == plan["dflash_block_size"]
        else:  # auto: the mean tree it verified
            assert r["num_nodes"] == (r["nodes_verified"] if r["budget"] == "auto" else r["budget"] + 1)
        assert all(k <= t <= min(e, r["num_nodes"] * k) for t in r["touched_per_layer"])
        assert r["eager_over_floor"] == pytest.approx(r["eager_step_ms"] / r["floor_ms"])
        assert r["uniform_touched"] == pytest.approx(e * (1 - (1 - k / e) ** r["num_nodes"]))
        assert r["prefix_len"] >= plan["prompt_len"]
    assert rows[0]["touched_per_layer"] == [k] * num_moe and rows[0]["speedup_eager"] == 1
    assert [r["tokens"] for r in data["layer"]] == list(LAYER_TOKENS)
    for r in data["layer"]:
        assert_positive(r, "sparse_us", "dense_us", "sparse_floor_us", "dense_floor_us")
        assert k <= r["touched"] <= min(e, r["tokens"] * k) and r["sparse_floor_us"] <= r["dense_floor_us"]
    for section in ("steps", "speedup vs budget", "experts", "moe layer"):
        assert f"## {section}" in md
    chart = md.split("## speedup vs budget")[1].split("\n## ")[0]
    for r in rows[1:]:  # one bar per speculative row, its value the row's speedup
        where = "chain" if r["mode"] == "chain" else f"B={r['budget']}"
        assert re.search(rf"{where}\s+#+\s+{r['speedup_eager']:.2f}x", chart), (where, chart)


def test_bench_moe_prints_each_stage_against_its_floor(moe_run):
    stdout, data, md = moe_run
    assert "## stages against their floor" in md and "stages against their floor" in stdout
    header = stdout.split("stages against their floor (ms; x: stage time / floor)\n")[1].splitlines()[0]
    assert "verify floor ms" in header and "v.ffn x" in header and "draft floor ms" in header
    for r in data["rows"]:
        stages = [s for s in FLOOR_STAGES if "/" not in s and f"floor_ms_{s}" in r]
        assert r["floor_ms"] == pytest.approx(sum(r[f"floor_ms_{s}"] for s in stages))
        assert r["floor_ms_verify"] == pytest.approx(sum(r[f"floor_ms_verify/{p}"] for p in ("embed", "attn", "ffn",
                                                                                            "lm_head")))
        assert r["over_floor_verify"] > 0 and (r["mode"] == "AR") == ("floor_ms_draft" not in r)
        flops_per_ms = data["ceilings"]["matmul_tflops"] * 1e9  # the roofline: compute-bound parts at the matmul rate
        assert r["roofline_ms"] == pytest.approx(r["floor_ms"] - r["floor_ms_verify"] + sum(
            max(r[f"floor_ms_verify/{p}"], flops / flops_per_ms) for p, flops in r["verify_flops"].items()))
        # never under the bytes floor (up to the rounding of subtracting the verify's floor and adding its parts back)
        assert r["roofline_ms"] >= r["floor_ms"] * (1 - 1e-12) and r["verify_flops"]["lm_head"] > 0
        assert r["graph_over_roofline"] is None  # no CUDA graphs on the CPU
    learned = [r for r in data["rows"] if r["drafter"] == "dflash" and r["budget"] != "auto"]
    assert learned and all(r["floor_ms_draft"] > 0 for r in learned)
    for r in learned:  # no ratio over a floor under the launch-latency bound (over_floor's contract): the quick
        # model's draft floor falls under it where this machine measures a high copy bandwidth
        if r["floor_ms_draft"] < LATENCY_BOUND_MS:
            assert r["over_floor_draft"] is None
        else:
            assert r["over_floor_draft"] > 0


def test_bench_moe_prints_the_drafter_against_its_floor_and_at_kimi_k2_depth(moe_run):
    """The DFlash rows' drafter (forward + context update) time, floor and share of the step, and its share of a
    61-layer step extrapolated from the per-layer stage times, recomputed here from each row's stage times."""
    stdout, data, md = moe_run
    assert DRAFTER_TABLE in stdout and f"## {DRAFTER_TABLE}" in md
    cfg = quick_k2()
    drafting = [r for r in data["rows"] if "drafter_ms" in r]
    assert drafting and all(r["drafter"] == "dflash" for r in drafting)
    for r in drafting:
        t = r["stage_ms"]
        drafter = t["step/draft"] + t.get("step/draft_update", 0.0)
        assert r["drafter_ms"] == pytest.approx(drafter) and r["drafter_share"] == pytest.approx(drafter / t["step"])
        layer_ms = {"attn": t["step/verify/layer*/attn"] / cfg.num_hidden_layers,
                    "mlp": t.get("step/verify/layer*/mlp", 0.0) / cfg.first_k_dense_replace,
                    "moe": t["step/verify/layer*/moe"] / (cfg.num_hidden_layers - cfg.first_k_dense_replace)}
        deeper = (KIMI_K2_LAYERS - cfg.num_hidden_layers) * (layer_ms["attn"] + layer_ms["moe"])
        assert r["full_depth_step_ms"] == pytest.approx(t["step"] + deeper)
        assert r["drafter_share_full_depth"] == pytest.approx(drafter / (t["step"] + deeper))
        assert r["drafter_share_full_depth"] < r["drafter_share"]
        assert r["drafter_floor_ms"] == pytest.approx(r["floor_ms_draft"] + r.get("floor_ms_draft_update", 0.0))


def test_bench_moe_sets_the_chains_drafter_parts_as_graph_replays_beside_their_floors(moe_run):
    """The chain row's drafter forward and context update, each timed alone as CUDA-graph replays: no graphs on the
    CPU, so their times and ratios are None ("-"), their floors the "draft" and "draft_update" stages'."""
    stdout, data, _ = moe_run
    header = stdout.split(f"{DRAFTER_TABLE}\n")[1].splitlines()[0]
    for part in ("forward", "update"):
        assert all(f"{part} {h}" in header for h in ("graph ms", "floor ms", "x"))
    chain = next(r for r in data["rows"] if r["mode"] == "chain")
    for part, stage in (("forward", "draft"), ("update", "draft_update")):
        assert chain[f"drafter_{part}_graph_ms"] is None and chain[f"drafter_{part}_over_floor"] is None
        assert chain[f"drafter_{part}_floor_ms"] == chain[f"floor_ms_{stage}"] > 0
    assert not any("drafter_forward_graph_ms" in r for r in data["rows"] if r["mode"] != "chain")


@pytest.mark.parametrize("gpu_bytes, want", [(150_000_000_000, 4), (85_000_000_000, 2)])  # an H200's, an H100's
def test_kimi_k2_layers_fill_the_budget_and_no_more(gpu_bytes, want):
    budget = gpu_bytes - HEADROOM_BYTES
    layers = layers_that_fit(budget, 2)
    assert layers == want
    assert model_bytes(kimi_k2(layers), 2) <= budget < model_bytes(kimi_k2(layers + 1), 2)
    cfg = kimi_k2(layers)
    assert (cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size,
            cfg.intermediate_size, cfg.vocab_size, cfg.first_k_dense_replace) == (7168, 384, 8, 2048, 18432, 163840, 1)


def test_a_verify_that_reads_everything_reads_the_model_and_its_cache():
    cfg = quick_k2()
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    parts = TargetBytes.of(cfg, 2).verify_bytes(cfg.vocab_size, 0, [cfg.n_routed_experts] * num_moe)
    cache = cfg.num_hidden_layers * cfg.vocab_size * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 2
    routers = num_moe * cfg.n_routed_experts * cfg.hidden_size * 2  # the model holds them twice; routing reads float32
    assert sum(parts.values()) == model_bytes(cfg, 2) - routers + cache
    assert uniform_touched(cfg, 1) == pytest.approx(cfg.num_experts_per_tok)
    assert uniform_touched(cfg, 10**6) == pytest.approx(cfg.n_routed_experts)


def test_the_full_size_run_is_refused_on_the_cpu(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_moe", "--device", "cpu", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "only with --quick" in proc.stderr and not list(tmp_path.iterdir())


def test_under_torchrun_rank_0_writes_the_split_run_with_its_communication_share(moe_run, tmp_path):
    """torchrun --nproc-per-node 2 -m benchmarks.bench_moe --quick: the same tokens and tau as one process, each
    row's share in collectives, one results file."""
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "benchmarks.bench_moe", "--device", "cpu", "--quick", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["moe-cpu-w2.json", "moe-cpu-w2.md"]
    data = json.loads((tmp_path / "moe-cpu-w2.json").read_text())
    alone = moe_run[1]["rows"]
    assert data["world_size"] == 2 and data["parallel"]["experts_per_rank"] == quick_k2().n_routed_experts // 2
    assert data["layer"] == [] and proc.stdout.count("wrote ") == 1
    for row, one in zip(data["rows"], alone, strict=True):
        assert row["tokens_match_ar"] is True and 0 < row["comm_share"] < 1 and "floor_ms" not in row
        if row["budget"] == "auto":  # its choices follow each run's measured costs: the tokens agree, not the trees
            continue
        assert row["tau_eager"] == one["tau_eager"]
        assert row["touched_per_layer"] == one["touched_per_layer"], "the ranks route every token as one process"
