"""Each stage against its bytes floor (profiling/stage_floor.py, engine/model/read_bytes.py): the bytes counted by
hand from a small config's shapes, the floors adding up, the copy bandwidth, and `run --profile`'s table."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from cli.__main__ import main
from engine.config import ModelConfig
from engine.loaders.dflash_config import DFlashConfig
from engine.records import BudgetChoice, ExpertTraffic, StepRecord, TreeRecord
from profiling.bandwidth import Bandwidth, copy_bandwidth, measure_copy
from profiling.stage_floor import LATENCY_BOUND_MS, FloorModel, floor_table, mean_bytes, stage_floors

TINY = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"
CFG = ModelConfig(
    vocab_size=300, hidden_size=48, num_hidden_layers=3, num_attention_heads=2, q_lora_rank=24, kv_lora_rank=20,
    qk_nope_head_dim=12, qk_rope_head_dim=6, v_head_dim=10, intermediate_size=80, moe_intermediate_size=16,
    n_routed_experts=8, n_shared_experts=2, num_experts_per_tok=2, n_group=1, topk_group=1,
    first_k_dense_replace=1, max_position_embeddings=512)
DRAFTER = DFlashConfig(hidden_size=48, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, vocab_size=300, block_size=4, num_target_layers=3,
                       mask_token_id=299, target_layer_ids=(0, 2))


def hand_counted(itemsize: int) -> dict:
    """The config's per-layer weights counted from its shapes, independently of the module."""
    d, h, c = CFG.hidden_size, CFG.num_attention_heads, CFG.kv_lora_rank
    q_head = CFG.qk_nope_head_dim + CFG.qk_rope_head_dim
    attn = (d + d * CFG.q_lora_rank + CFG.q_lora_rank + CFG.q_lora_rank * h * q_head
            + d * (c + CFG.qk_rope_head_dim) + c + c * h * (CFG.qk_nope_head_dim + CFG.v_head_dim)
            + h * CFG.v_head_dim * d)
    dense_ffn = d + 3 * d * CFG.intermediate_size
    expert = 3 * d * CFG.moe_intermediate_size
    moe_ffn = (d + CFG.n_shared_experts * expert + CFG.n_routed_experts) * itemsize + CFG.n_routed_experts * d * 4
    return {"attn": attn * itemsize, "dense_ffn": dense_ffn * itemsize, "moe_ffn": moe_ffn,
            "expert": expert * itemsize, "kv_row": (c + CFG.qk_rope_head_dim) * itemsize,
            "embed_row": d * itemsize, "head": (CFG.vocab_size * d + d) * itemsize}


def step(mode: str, num_nodes: int, prefix_len: int, touched: list[int], path_len: int, timings: dict | None = None,
         budget: BudgetChoice | None = None) -> StepRecord:
    tree = TreeRecord(tokens=[1] * num_nodes, parents=[-1, *range(num_nodes - 1)], depths=list(range(num_nodes)),
                      ranks=[0] * num_nodes, scores=[0.0] * num_nodes, visibility=np.eye(num_nodes, dtype=bool))
    return StepRecord(index=0, mode=mode, prefix_len=prefix_len, tree=tree, target=[1] * num_nodes,
                      logit_gap=[1.0] * num_nodes, path=list(range(path_len)), bonus=1, committed=[1] * path_len,
                      timings_ns=timings or {}, experts=ExpertTraffic(touched, 1), budget=budget)


@pytest.mark.parametrize("dtype,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_the_verify_reads_every_weight_once_the_touched_experts_and_the_attended_rows(dtype, itemsize):
    hand = hand_counted(itemsize)
    model = FloorModel.of(CFG, dtype, block_size=4)
    n, prefix, touched = 7, 50, [5, 3]
    got = model.step_bytes(step("ddtree", n, prefix, touched, path_len=3))
    layers = CFG.num_hidden_layers
    assert got["verify/embed"] == n * hand["embed_row"]
    assert got["verify/attn"] == layers * hand["attn"] + layers * (prefix + n) * hand["kv_row"]
    assert got["verify/ffn"] == hand["dense_ffn"] + 2 * hand["moe_ffn"] + sum(touched) * hand["expert"]
    assert got["verify/lm_head"] == hand["head"]
    assert got["verify"] == sum(got[f"verify/{p}"] for p in ("embed", "attn", "ffn", "lm_head"))
    assert got["kv_compact"] == layers * 3 * hand["kv_row"] + 3 * 8
    assert got["tree_build"] == 3 * CFG.vocab_size * 4  # L = 3 rows of float32 log-probabilities
    assert got["draft"] == 0 and got["draft_update"] == 0  # the oracle reads no weights


def test_a_dflash_drafter_reads_its_layers_the_targets_head_and_its_context():
    itemsize = 2
    hand = hand_counted(itemsize)
    d, q, kv, i = 48, 4 * 8, 2 * 8, 40
    layer = (2 * d + q * d + 2 * kv * d + d * q + 2 * 8 + 3 * i * d) * itemsize
    model = FloorModel.of(CFG, "bfloat16", block_size=4, drafter=DRAFTER)
    got = model.step_bytes(step("ddtree", 5, 30, [2, 2], path_len=2))
    context_row = 2 * 2 * kv * itemsize  # keys and values of both draft layers
    assert got["draft"] == 2 * layer + d * itemsize + 4 * hand["embed_row"] + hand["head"] - d * itemsize \
        + 30 * context_row
    assert got["draft_update"] == (d * 2 * d + d + 2 * (2 * kv * d + 8)) * itemsize


def test_an_ar_step_and_a_draft_free_auto_step_have_no_draft_stages():
    model = FloorModel.of(CFG, "float32", block_size=4, drafter=DRAFTER)
    ar = model.step_bytes(step("ar", 1, 10, [2, 2], path_len=1))
    assert not {"draft", "tree_build", "draft_update"} & set(ar)
    backoff = BudgetChoice(chosen=0, drafted=False, buckets=[0], expected=[0.0], cost_s=[1.0], value=[1.0],
                           confidence=[[1.0, 1.0]], built=0)
    auto = model.step_bytes(step("ddtree", 1, 10, [2, 2], path_len=1, budget=backoff))
    assert "draft" not in auto and "tree_build" not in auto


def test_mean_bytes_count_a_stage_as_zero_in_the_steps_that_did_not_run_it():
    """An auto budget's mix of drafted and draft-free steps: the draft's mean bytes are over all the steps, as the
    benchmarks' stage times are means over all their profiled steps (so time over floor is not inflated)."""
    model = FloorModel.of(CFG, "float32", block_size=4, drafter=DRAFTER)
    backoff = BudgetChoice(chosen=0, drafted=False, buckets=[0, 4], expected=[0.0, 1.0], cost_s=[1.0, 2.0],
                           value=[1.0, 1.0], confidence=[[1.0, 1.0]], built=4)
    drafted = step("ddtree", 5, 10, [3, 3], path_len=2)
    num_undrafted = int(np.random.default_rng().integers(1, 6))
    steps = [drafted] + [step("ddtree", 1, 10, [2, 2], path_len=1, budget=backoff) for _ in range(num_undrafted)]
    got = mean_bytes(model, steps)
    assert got["draft"] == pytest.approx(model.step_bytes(drafted)["draft"] / len(steps))
    want_verify = sum(model.step_bytes(s)["verify"] for s in steps) / len(steps)
    assert got["verify"] == pytest.approx(want_verify)


def test_the_floors_are_the_bytes_at_the_bandwidth_and_the_ratio_is_time_over_floor():
    model = FloorModel.of(CFG, "float32", block_size=4)
    timings = {"step": 9_000_000, "step/draft": 100_000, "step/tree_build": 200_000, "step/verify": 5_000_000,
               "step/verify/embed": 10_000, "step/verify/layer0/attn": 1_000_000, "step/verify/layer1/attn": 1_000_000,
               "step/verify/layer2/attn": 1_000_000, "step/verify/layer0/mlp": 500_000,
               "step/verify/layer1/moe": 600_000, "step/verify/layer2/moe": 700_000, "step/verify/lm_head": 100_000,
               "step/tree_accept": 50_000, "step/kv_compact": 40_000, "step/commit": 30_000}
    steps = [step("ddtree", 5, 20 + i, [3, 4], path_len=2, timings=timings) for i in range(3)]
    bandwidth = Bandwidth(2e9, "cpu", "float32", 1, 1)
    rows = {r.stage: r for r in stage_floors(model, steps, bandwidth)}
    assert "draft_update" not in rows  # not timed: these steps did not run it
    assert rows["verify/attn"].time_ms == pytest.approx(3.0) and rows["verify/ffn"].time_ms == pytest.approx(1.8)
    assert rows["verify"].num_bytes == pytest.approx(sum(rows[f"verify/{p}"].num_bytes
                                                         for p in ("embed", "attn", "ffn", "lm_head")))
    mean_attn = np.mean([model.step_bytes(s)["verify/attn"] for s in steps])
    assert rows["verify/attn"].num_bytes == pytest.approx(mean_attn)
    for r in rows.values():
        if r.num_bytes:
            assert r.floor_ms == pytest.approx(r.num_bytes / 2e9 * 1e3)
            if r.floor_ms >= LATENCY_BOUND_MS:
                assert r.over_floor == pytest.approx(r.time_ms / r.floor_ms)
            else:  # a few KB: bound by launch latency, a ratio to bytes would say nothing
                assert r.over_floor is None, r
    assert rows["verify/attn"].over_floor is not None and rows["tree_accept"].over_floor is None
    assert rows["draft"].over_floor is None  # the oracle's draft reads nothing: no floor to be over
    text = floor_table({"ddtree": list(rows.values())}, {"ddtree": "DDTree"}, bandwidth)
    assert "time/floor" in text and "2.0 GB/s" in text
    assert any(line.split()[:2] == ["DDTree", "attn"] for line in text.splitlines())


def test_the_copy_bandwidth_counts_read_and_written_bytes_and_is_measured_once_per_device():
    one = measure_copy("cpu", __import__("torch").float32, 2**20, 3)
    assert one.copy_bytes == 2**20 and one.bytes_per_s > 0 and one.num_reps == 3
    assert copy_bandwidth("cpu", "float32") is copy_bandwidth("cpu", "float32")
    with pytest.raises(ValueError, match="num_reps"):
        measure_copy("cpu", __import__("torch").float32, 2**20, 0)


def test_run_profile_prints_each_stage_against_its_floor(capsys):
    assert main(["run", "--fixture", str(TINY), "--max-new", "4", "--budget", "4", "--block-size", "3",
                 "--profile"]) == 0
    out = capsys.readouterr().out
    assert "stages against their bytes floor" in out and "copy " in out and "measured in this run" in out
    header = next(line for line in out.splitlines() if line.startswith("run ") and "time/floor" in line)
    assert header.split() == ["run", "stage", "steps", "ms/step", "MB", "read", "floor", "ms", "time/floor"]
    rows = [line.split() for line in out.splitlines() if line.startswith(("AR ", "DDTree "))]
    stages = {(r[0], r[1]) for r in rows}
    assert {("AR", "verify"), ("AR", "attn"), ("DDTree", "draft"), ("DDTree", "verify"), ("DDTree", "ffn")} <= stages
    assert all(r[-1].endswith("x") for r in rows if r[1] == "verify")
