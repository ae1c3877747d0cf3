"""One DFlash draft layer as plain functions over a layer's tensors: the drafter trainer's (draft_layer: many blocks
per sequence through autograd, engine/training/drafter_model.py) and the engine's (cached_draft_layer: one block
over its cache, engine/model/dflash.py). The two share the projections and all that follows the attention
(attention_out), and the tests check one against the other, so they cannot drift apart.

Shapes: a batch of B sequences; the block rows x [B, N, d] at their positions (cos, sin [B, N, D/2]); the
context's keys and values [B, S, Hkv, D] (k_norm and RoPE applied); mask [B, N, S + N]: which context rows and
which block rows each block row sees. The engine's one block runs cached_draft_layer: the same layer over its
cache through the fused ops (kernels/ops.py head_norm_rope, cache_attn), checked against draft_layer by the tests.

A layer's tensors come as fused_layer makes them: q, k and v stacked into one projection, gate and up into another
(the engine once at load, the trainer on every forward through autograd), so each is one matmul.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.loaders.dflash_config import DFlashConfig
from engine.model.layers import add_rms_norm, apply_rope, fused_rows, rms_norm, swiglu
from kernels import ops

QKV = "self_attn.qkv_proj.weight"  # [(Hq + 2 Hkv) D, d]: q_proj, k_proj, v_proj
GATE_UP = "mlp.gate_up_proj.weight"  # [2 I, d]: gate_proj, up_proj
QK_NORM = "self_attn.qk_norm.weight"  # [Hq + Hkv, D]: head_norms, the engine's (cached_draft_layer)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., n, H, D] with cos, sin [..., n, D/2]: the rotate-half RoPE of every row (Qwen3's layout)."""
    shape = x.shape
    return apply_rope(x.reshape(-1, *shape[-2:]), cos.reshape(-1, cos.shape[-1]), sin.reshape(-1, sin.shape[-1]),
                      False).view(shape)


def fused_layer(layer: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A layer's tensors by their checkpoint names (engine/loaders/dflash_tensors.py) -> the ones the functions here
    read: q/k/v as QKV, gate/up as GATE_UP, the rest as they are."""
    parts = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "mlp.gate_proj.weight",
             "mlp.up_proj.weight")
    out = {name: t for name, t in layer.items() if name not in parts}
    out[QKV] = fused_rows(*(layer[name] for name in parts[:3]))
    out[GATE_UP] = fused_rows(*(layer[name] for name in parts[3:]))
    return out


def _kv_rows(cfg: DFlashConfig) -> int:
    """Where QKV's k and v rows start (after the q rows)."""
    return cfg.num_attention_heads * cfg.head_dim


def _keys_values_of(cfg: DFlashConfig, layer: dict[str, torch.Tensor], kv: torch.Tensor, cos: torch.Tensor,
                    sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The k | v projections [..., n, 2 Hkv D] -> keys (k_norm, then RoPE) and values [..., n, Hkv, D]."""
    shape = (*kv.shape[:-1], cfg.num_key_value_heads, cfg.head_dim)
    k, v = kv.chunk(2, dim=-1)
    k = rms_norm(k.reshape(shape), layer["self_attn.k_norm.weight"], cfg.rms_norm_eps)
    return _rope(k, cos, sin), v.reshape(shape)


def keys_values(cfg: DFlashConfig, layer: dict[str, torch.Tensor], x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n, d] -> keys (k_norm, then RoPE) and values [..., n, Hkv, D]: the same projections serve the
    context features and the block (QKV's k and v rows: a contiguous slice, no copy)."""
    return _keys_values_of(cfg, layer, F.linear(x, layer[QKV][_kv_rows(cfg):]), cos, sin)


def grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float) -> torch.Tensor:
    """q [B, N, Hq, D]; k, v [B, S, Hkv, D]; mask [B, N, S] bool -> [B, N, Hq * D]. Query head h reads key/value
    head h // (Hq / Hkv) (transformers' repeat_kv) without repeating the keys: the G query heads of a key/value
    head attend as G * N rows of one head."""
    b, n, num_heads, dim = q.shape
    num_kv = k.shape[2]
    groups = num_heads // num_kv
    q = q.view(b, n, num_kv, groups, dim).permute(0, 2, 3, 1, 4).reshape(b, num_kv, groups * n, dim)
    rows_mask = mask[:, None].expand(b, groups, n, mask.shape[-1]).reshape(b, 1, groups * n, mask.shape[-1])
    out = F.scaled_dot_product_attention(q, k.transpose(1, 2), v.transpose(1, 2), attn_mask=rows_mask,
                                         scale=scale)  # [B, Hkv, G * N, D]
    return out.view(b, num_kv, groups, n, dim).permute(0, 3, 1, 2, 4).reshape(b, n, num_heads * dim)


def draft_layer(cfg: DFlashConfig, layer: dict[str, torch.Tensor], x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, ctx_keys: torch.Tensor, ctx_values: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
    """One layer over the block rows (the trainer's: plain torch, through autograd): RMSNorm; queries from the block
    (q_norm, RoPE), keys and values from the context joined with the block's own (mask [B, N, S + N]); attention as
    the mask allows; then attention_out."""
    b, n = x.shape[:2]
    h = rms_norm(x, layer["input_layernorm.weight"], cfg.rms_norm_eps)
    q, kv = F.linear(h, layer[QKV]).split([_kv_rows(cfg), 2 * cfg.num_key_value_heads * cfg.head_dim], dim=-1)
    q = q.reshape(b, n, cfg.num_attention_heads, cfg.head_dim)
    q = _rope(rms_norm(q, layer["self_attn.q_norm.weight"], cfg.rms_norm_eps), cos, sin)
    k_block, v_block = _keys_values_of(cfg, layer, kv, cos, sin)
    keys, values = torch.cat([ctx_keys, k_block], 1), torch.cat([ctx_values, v_block], 1)
    return attention_out(cfg, layer, x, grouped_attention(q, keys, values, mask, cfg.head_dim ** -0.5))


def cached_draft_layer(cfg: DFlashConfig, layer: dict[str, torch.Tensor], x: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_rows: torch.Tensor,
                       num_visible: torch.Tensor) -> torch.Tensor:
    """One layer over one block's rows x [N, d] at cos, sin [N, D/2] (the engine's drafter, no autograd): the same
    arithmetic as draft_layer through the ops that fuse it. q_norm / k_norm and RoPE in one ops.head_norm_rope
    (layer[QK_NORM]: each query head's and key head's norm weights); the block's keys and values written into the
    cache rows block_rows of keys, values [S, Hkv, D] (rows past the valid context, which a commit rewrites: no
    context row is copied); ops.cache_attn over the first num_visible rows."""
    n, num_heads, num_kv, dim = x.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    h = rms_norm(x, layer["input_layernorm.weight"], cfg.rms_norm_eps)
    qkv = F.linear(h, layer[QKV])  # [N, (Hq + 2 Hkv) D]
    qk = ops.head_norm_rope(qkv[:, :(num_heads + num_kv) * dim].view(n, num_heads + num_kv, dim), layer[QK_NORM],
                            cos, sin, cfg.rms_norm_eps)
    keys.index_copy_(0, block_rows, qk[:, num_heads:])
    values.index_copy_(0, block_rows, qkv[:, (num_heads + num_kv) * dim:].view(n, num_kv, dim))
    attn = ops.cache_attn(qk[:, :num_heads], keys, values, num_visible, dim ** -0.5)
    return attention_out(cfg, layer, x, attn.view(n, num_heads * dim))


def attention_out(cfg: DFlashConfig, layer: dict[str, torch.Tensor], x: torch.Tensor,
                  attn: torch.Tensor) -> torch.Tensor:
    """The layer after its attention [..., Hq D]: o_proj; residual; RMSNorm; SwiGLU; residual."""
    x, h = add_rms_norm(x, F.linear(attn, layer["self_attn.o_proj.weight"]), layer["post_attention_layernorm.weight"],
                        cfg.rms_norm_eps)
    return x + swiglu(h, layer[GATE_UP], layer["mlp.down_proj.weight"])


def head_norms(cfg: DFlashConfig, layer: dict[str, torch.Tensor]) -> torch.Tensor:
    """[Hq + Hkv, D]: each query head's q_norm weights, then each key head's k_norm weights (QK_NORM)."""
    return torch.cat([layer["self_attn.q_norm.weight"].expand(cfg.num_attention_heads, -1),
                      layer["self_attn.k_norm.weight"].expand(cfg.num_key_value_heads, -1)])


def context_features(cfg: DFlashConfig, fc: torch.Tensor, hidden_norm: torch.Tensor,
                     hidden: torch.Tensor) -> torch.Tensor:
    """The target's hidden states [..., len(target_layer_ids) * d_target] -> the drafter's context [..., d]."""
    return rms_norm(F.linear(hidden.to(fc.dtype), fc), hidden_norm, cfg.rms_norm_eps)
