"""The bytes each part of a decode step must read, from the model's shapes: the floor a bandwidth-bound step cannot
beat (DESIGN.md, "Cost against the floor"). Weights count once per step whatever the rows (the routed experts as
touched x one expert's bytes, the embedding's rows only, the routers in float32 as the target holds them), plus the
cache rows an attention reads. Activations are left out: at decode widths they are a rounding error beside the
weights. profiling/stage_floor.py maps a step record's stages onto these counts; the benchmarks read them too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import tensor_shapes
from engine.model.weights import lm_head_name, weight_shapes

ROUTER_ITEMSIZE = 4  # the target routes in float32 (engine/model/target.py keeps a float32 copy of each router)
INDEX_ITEMSIZE = 8  # int64 tokens, parents, picks and paths


def expert_bytes(cfg: ModelConfig, itemsize: int) -> int:
    """One routed expert's gate, up and down weights: what each expert a verify touches costs it to read."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size * itemsize


@dataclass(frozen=True, slots=True)
class LayerBytes:
    """One target layer's weight bytes, split by the range that reads them."""

    attn: int  # input norm and the attention's projections and norms
    ffn: int  # post-attention norm and the dense MLP, or the shared experts, router and correction bias of an MoE
    expert: int  # one routed expert's gate, up and down (0: a dense layer)


@dataclass(frozen=True, slots=True)
class TargetBytes:
    """The target's weight bytes in the run's dtype, by what reads them."""

    layers: tuple[LayerBytes, ...]
    embed_row: int  # one embedding row (a verify reads one per node)
    final_norm: int
    lm_head: int  # the whole lm_head (the embedding when tied)
    kv_row: int  # one latent cache row of one layer: c_kv and k_pe
    vocab_size: int

    @classmethod
    def of(cls, cfg: ModelConfig, itemsize: int) -> TargetBytes:
        """Counted in one pass over the weights' shapes (the routed experts by expert_bytes, not one by one)."""
        shapes = weight_shapes(cfg)
        attn = [0] * cfg.num_hidden_layers
        ffn = [0] * cfg.num_hidden_layers
        for name, shape in shapes.items():
            if not name.startswith("model.layers.") or ".mlp.experts." in name:
                continue
            i = int(name.split(".", 3)[2])
            if name.endswith(".mlp.gate.weight"):
                ffn[i] += math.prod(shape) * ROUTER_ITEMSIZE
            elif ".self_attn." in name or name.endswith("input_layernorm.weight"):
                attn[i] += math.prod(shape) * itemsize
            else:
                ffn[i] += math.prod(shape) * itemsize
        layers = [LayerBytes(attn[i], ffn[i], expert_bytes(cfg, itemsize) if cfg.is_moe_layer(i) else 0)
                  for i in range(cfg.num_hidden_layers)]
        head = shapes[lm_head_name(cfg)]
        return cls(tuple(layers), cfg.hidden_size * itemsize, cfg.hidden_size * itemsize, math.prod(head) * itemsize,
                   (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * itemsize, cfg.vocab_size)

    def attn_bytes(self, num_nodes: int, prefix_len: float) -> float:
        """Every layer's attention weights and the prefix_len + num_nodes cache rows verify_attn reads."""
        rows = prefix_len + num_nodes
        return sum(la.attn for la in self.layers) + len(self.layers) * rows * self.kv_row

    def ffn_bytes(self, touched: list[float] | None) -> float:
        """Dense MLPs, shared experts and routers, plus the routed experts touched per MoE layer (None: every
        expert, the dense reference's reads)."""
        moe = [la for la in self.layers if la.expert]
        if touched is not None and len(touched) != len(moe):
            raise ValueError(f"touched experts for {len(touched)} MoE layers; the model has {len(moe)}")
        routed = sum(t * la.expert for t, la in zip(touched, moe, strict=True)) if touched is not None else 0
        return sum(la.ffn for la in self.layers) + routed

    def verify_bytes(self, num_nodes: int, prefix_len: float, touched: list[float] | None) -> dict[str, float]:
        """A verify of num_nodes at prefix_len, by its ranges: embed (num_nodes rows), attn, ffn, lm_head."""
        return {"embed": num_nodes * self.embed_row, "attn": self.attn_bytes(num_nodes, prefix_len),
                "ffn": self.ffn_bytes(touched), "lm_head": self.final_norm + self.lm_head}

    def kv_compact_bytes(self, path_len: int) -> int:
        """kv_compact reads the accepted path's cache rows of every layer (and the path)."""
        return len(self.layers) * path_len * self.kv_row + path_len * INDEX_ITEMSIZE

    def tree_build_bytes(self, num_positions: int) -> int:
        """tree_build reads the [L, V] float32 draft log-probabilities."""
        return num_positions * self.vocab_size * 4


def tree_accept_bytes(num_nodes: int) -> int:
    """tree_accept reads the tree's tokens, parents and the target's picks."""
    return 3 * num_nodes * INDEX_ITEMSIZE


def commit_bytes(num_committed: int) -> int:
    """commit reads the accepted path and its tokens."""
    return 2 * num_committed * INDEX_ITEMSIZE


@dataclass(frozen=True, slots=True)
class DrafterBytes:
    """A DFlash drafter's reads (engine/model/dflash.py): propose runs every draft layer over the block against its
    context cache and the target's lm_head; the context update projects the committed rows through fc and every
    layer's k/v projections."""

    layers: int  # every draft layer's weights
    final_norm: int
    context: int  # fc and hidden_norm, and each layer's k_proj, v_proj and k_norm
    kv_row: int  # one context row of all layers: keys and values

    @classmethod
    def of(cls, cfg: DFlashConfig, itemsize: int) -> DrafterBytes:
        shapes = {n: math.prod(s) * itemsize for n, s in tensor_shapes(cfg).items()}
        layers = sum(size for n, size in shapes.items() if n.startswith("layers."))
        context = shapes["fc.weight"] + shapes["hidden_norm.weight"] + sum(
            size for n, size in shapes.items()
            if n.startswith("layers.") and n.split(".", 2)[2] in ("self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                                                 "self_attn.k_norm.weight"))
        kv_row = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * itemsize
        return cls(layers, shapes["norm.weight"], context, kv_row)

    def propose_bytes(self, target: TargetBytes, block: int, context_len: float) -> float:
        """One forward of the block (root + L masks: `block` embedding rows) over context_len context rows."""
        return self.layers + self.final_norm + block * target.embed_row + target.lm_head + context_len * self.kv_row

    def update_bytes(self) -> int:
        return self.context
