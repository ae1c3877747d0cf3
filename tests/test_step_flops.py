"""A verify's FLOPs (engine/model/step_flops.py) against a count written out from the config's widths, and the
roofline floor bench_moe builds from them."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks.bench_moe import kimi_k2, quick_k2
from benchmarks.stage_floors import add_rooflines
from engine.config import ModelConfig
from engine.model.step_flops import TargetFlops


def by_hand(cfg: ModelConfig, nodes: int, pairs: int) -> dict[str, int]:
    """Each matmul's 2 x rows x (in x out), named one by one from the MLA and MoE shapes."""
    h, heads, r, p = cfg.hidden_size, cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    qk = cfg.qk_nope_head_dim + p
    q = h * cfg.q_lora_rank + cfg.q_lora_rank * heads * qk if cfg.q_lora_rank else h * heads * qk
    kv = h * (r + p) + r * heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)  # kv_a, then kv_b (absorbed or not)
    attn = q + kv + heads * cfg.v_head_dim * h  # and o_proj
    moe = [cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers)]
    expert = 3 * h * cfg.moe_intermediate_size
    ffn = sum(expert * (cfg.n_shared_experts + cfg.num_experts_per_tok) + cfg.n_routed_experts * h if m
              else 3 * h * cfg.intermediate_size for m in moe)
    layers = cfg.num_hidden_layers
    return {"embed": 0, "attn": 2 * nodes * layers * attn + pairs * layers * (2 * heads * (r + p) + 2 * heads * r),
            "ffn": 2 * nodes * ffn, "lm_head": 2 * nodes * h * cfg.vocab_size}


@pytest.mark.parametrize("cfg", [quick_k2(), kimi_k2(3)], ids=["quick", "kimi-k2-3-layers"])
def test_verify_flops_count_every_matmul_a_row_passes(cfg):
    rng = np.random.default_rng()
    nodes = int(rng.integers(1, 300))
    pairs = nodes * int(rng.integers(0, 5000)) + int(rng.integers(nodes, nodes * 16))
    assert TargetFlops.of(cfg).verify_flops(nodes, pairs) == pytest.approx(by_hand(cfg, nodes, pairs), rel=0)


def test_the_roofline_raises_only_the_verify_parts_that_are_compute_bound():
    rng = np.random.default_rng()
    parts = {p: float(rng.uniform(0.1, 1.0)) for p in ("embed", "attn", "ffn", "lm_head")}
    draft = float(rng.uniform(0.1, 1.0))
    row = {"floor_ms": draft + sum(parts.values()), "floor_ms_draft": draft, "floor_ms_verify": sum(parts.values()),
           **{f"floor_ms_verify/{p}": v for p, v in parts.items()},
           # at 1e12 FLOP/s: attn and lm_head take twice their bytes' time, ffn half of it, embed none
           "verify_flops": {"embed": 0.0, "attn": 2 * parts["attn"] * 1e9, "ffn": 0.5 * parts["ffn"] * 1e9,
                            "lm_head": 2 * parts["lm_head"] * 1e9}}
    add_rooflines([row, {"error": "skipped"}], 1e12, 1e12)
    want = draft + parts["embed"] + 2 * parts["attn"] + parts["ffn"] + 2 * parts["lm_head"]
    assert row["roofline_ms"] == pytest.approx(want)
