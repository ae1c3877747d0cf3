"""The arithmetic of a verify's parts, from the model's shapes: the other side of a step's roofline beside
read_bytes.py's bytes. A few rows read every weight and do little with each (bandwidth-bound); every row a tree adds
does 2 FLOPs per weight it passes, so past some budget a verify's lm_head and attention take longer at the matmul
rate than their bytes take at the copy bandwidth, and the bytes floor alone is out of reach (benchmarks/bench_moe.py
prints both floors).

Counted: 2 x rows x weights for every matmul a row passes (the attention's projections with the absorbed kv_b, the
dense MLPs, the shared experts and routers, the top-k routed experts, the lm_head) and the absorbed attention's
2 H (R + P) for the scores and 2 H R for the values per (node, visible cache row) pair of each layer. Norms, RoPE,
softmax and the routing are left out: a few FLOPs per element beside thousands per row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.model.weights import lm_head_name, weight_shapes


@dataclass(frozen=True, slots=True)
class TargetFlops:
    """A verify's FLOPs per row and per attended pair, summed over the target's layers."""

    attn_row: int  # 2 x every layer's attention weights
    attn_pair: int  # every layer's scores and values of one (node, visible cache row) pair
    ffn_row: int  # 2 x the FFN weights a row passes: dense MLPs, or shared experts, router and its top-k experts
    lm_head_row: int

    @classmethod
    def of(cls, cfg: ModelConfig) -> TargetFlops:
        attn = ffn = 0
        for name, shape in weight_shapes(cfg).items():
            if not name.startswith("model.layers.") or len(shape) < 2 or ".mlp.experts." in name:
                continue  # the norms' vectors, and the routed experts (counted by top-k below)
            if ".self_attn." in name:
                attn += math.prod(shape)
            else:
                ffn += math.prod(shape)
        moe_layers = sum(1 for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i))
        routed = moe_layers * cfg.num_experts_per_tok * 3 * cfg.hidden_size * cfg.moe_intermediate_size
        heads, lat = cfg.num_attention_heads, cfg.kv_lora_rank
        pair = cfg.num_hidden_layers * (2 * heads * (lat + cfg.qk_rope_head_dim) + 2 * heads * lat)
        return cls(2 * attn, pair, 2 * (ffn + routed), 2 * math.prod(weight_shapes(cfg)[lm_head_name(cfg)]))

    def verify_flops(self, num_nodes: int, visible_pairs: float) -> dict[str, float]:
        """A verify of num_nodes rows attending visible_pairs (node, cache row) pairs in each layer (the prefix for
        every node, then the node's own visible tree rows), by its ranges as read_bytes.TargetBytes.verify_bytes."""
        return {"embed": 0.0, "attn": num_nodes * self.attn_row + visible_pairs * self.attn_pair,
                "ffn": num_nodes * self.ffn_row, "lm_head": num_nodes * self.lm_head_row}
