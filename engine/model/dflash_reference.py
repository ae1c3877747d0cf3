"""The DFlash golden model: the drafter's forward in numpy float64, written the plain way.

It recomputes everything from the whole context every call (no cache): context features -> fc -> hidden_norm;
per layer, keys and values of every context row and every block row through the same projections, the block's
queries attending to all of them, each query head reading its own expanded key/value head. It shares no code
with engine/model/dflash.py; its RoPE is the target golden model's (engine/model/reference.py, checked against
transformers in tests/test_hf.py), here over the drafter's head_dim.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import tensor_shapes
from engine.model import reference as golden


@dataclass(frozen=True, slots=True)
class _RopeFields:
    """The three fields engine.model.reference's RoPE reads, for the drafter: rotary width = head_dim."""

    qk_rope_head_dim: int
    rope_theta: float
    rope_scaling: dict | None


def rope_tables(cfg: DFlashConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, head_dim / 2] float64 for positions 0..T-1, YaRN's attention factor folded in."""
    return golden.rope_tables(_RopeFields(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), num_positions)


def _heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """[T, heads * D] -> [heads, T, D]."""
    return x.reshape(x.shape[0], num_heads, -1).transpose(1, 0, 2)


def draft_logprobs(cfg: DFlashConfig, weights: dict[str, np.ndarray], embed: np.ndarray, lm_head: np.ndarray,
                   context_hidden: np.ndarray, root: int, block_size: int | None = None) -> np.ndarray:
    """Log-probabilities [L, V] (L = block_size - 1, block_size defaulting to the checkpoint's) of the tokens
    after `root`, given the target's embedding and lm_head [V, d] and the hidden states of the chosen target
    layers (concatenated in target_layer_ids order) for every context token [T, len(ids) * d], the context at
    positions 0..T-1 and the block [root, MASK x L] at T..T+L."""
    block_size = cfg.block_size if block_size is None else block_size
    for name, shape in tensor_shapes(cfg).items():
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"weight {name} has shape {tuple(weights[name].shape)}, expected {shape}")
    w = {name: np.asarray(weights[name], dtype=np.float64) for name in tensor_shapes(cfg)}
    eps, nh, nkv = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads
    ctx = np.asarray(context_hidden, dtype=np.float64) @ w["fc.weight"].T
    ctx = golden.rms_norm(ctx, w["hidden_norm.weight"], eps)  # [T, d]
    num_ctx = ctx.shape[0]
    x = np.asarray(embed, dtype=np.float64)[[root] + [cfg.mask_token_id] * (block_size - 1)]  # [B, d]
    cos, sin = rope_tables(cfg, num_ctx + block_size)
    block_cos, block_sin = cos[num_ctx:], sin[num_ctx:]
    for layer in range(cfg.num_hidden_layers):
        p = f"layers.{layer}."
        h = golden.rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = golden.rms_norm(_heads(h @ w[p + "self_attn.q_proj.weight"].T, nh), w[p + "self_attn.q_norm.weight"],
                            eps)
        q = golden.apply_rope(q, block_cos, block_sin, interleave=False)  # [H, B, D]
        both = np.concatenate([ctx, h])  # [T + B, d]: the context rows, then the block's
        k = golden.rms_norm(_heads(both @ w[p + "self_attn.k_proj.weight"].T, nkv), w[p + "self_attn.k_norm.weight"],
                            eps)
        k = golden.apply_rope(k, cos, sin, interleave=False)  # [Hkv, T + B, D]
        v = _heads(both @ w[p + "self_attn.v_proj.weight"].T, nkv)
        expand = np.arange(nh) // (nh // nkv)  # query head -> its key/value head
        scores = q @ k[expand].transpose(0, 2, 1) / np.sqrt(cfg.head_dim)  # [H, B, T + B]: no mask
        out = (golden.softmax(scores) @ v[expand]).transpose(1, 0, 2).reshape(block_size, -1)  # [B, H * D]
        x = x + out @ w[p + "self_attn.o_proj.weight"].T
        h = golden.rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate * golden.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    logits = golden.rms_norm(x[1:], w["norm.weight"], eps) @ np.asarray(lm_head, dtype=np.float64).T  # [L, V]
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
