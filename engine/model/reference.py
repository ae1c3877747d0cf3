"""The golden model: a numpy float64 forward of the whole DeepSeek-V3 / Kimi-K2 model, written the naive way.

Attention expands kv_b_proj into full per-head K and V (no absorption) and attends causally over the whole
sequence at positions 0..T-1, so nothing here depends on the latent cache, the custom ops or engine/model/target.py.
The formulas follow Hugging Face transformers' DeepseekV3 code, computed in float64 throughout (HF builds its
RoPE tables in float32; the differences are at the float32 rounding level).

Ties in every top-k selection (expert groups, experts, greedy tokens) break toward the lower index.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.config import LATENT_NORM_EPS, ModelConfig
from engine.model.weights import lm_head_name, weight_shapes


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # the same function as 1/(1+e^-x), without overflow warnings


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def swiglu_mlp(weights: dict[str, np.ndarray], prefix: str, x: np.ndarray) -> np.ndarray:
    gate = x @ weights[f"{prefix}.gate_proj.weight"].T
    up = x @ weights[f"{prefix}.up_proj.weight"].T
    return (gate * sigmoid(gate) * up) @ weights[f"{prefix}.down_proj.weight"].T


# ---- RoPE ----------------------------------------------------------------------------------------------------

def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope_frequencies(cfg: ModelConfig) -> tuple[np.ndarray, float]:
    """inv_freq [P/2] and the factor cos/sin are multiplied by (1 without YaRN), as transformers'
    _compute_yarn_parameters defines them (truncate=True, beta_fast=32, beta_slow=1 by default)."""
    dim, base = cfg.qk_rope_head_dim, float(cfg.rope_theta)
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # [P/2]
    if cfg.rope_scaling is None:
        return 1.0 / pos_freqs, 1.0
    rs = cfg.rope_scaling
    factor = float(rs["factor"])
    attention_factor = rs.get("attention_factor")
    mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
    orig = rs["original_max_position_embeddings"]

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(orig / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)  # [P/2]
    extrapolation = 1.0 - ramp  # 1: keep the original frequency, 0: interpolate (divide by factor)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1.0 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def rope_tables(cfg: ModelConfig, num_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, P/2] for positions 0..T-1, already scaled by YaRN's attention factor."""
    inv_freq, attention_factor = rope_frequencies(cfg)
    angles = np.arange(num_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, P/2]
    return np.cos(angles) * attention_factor, np.sin(angles) * attention_factor


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleave: bool) -> np.ndarray:
    """x [..., T, P]; cos, sin [T, P/2]. NeoX rotate-half: dims i and i + P/2 form a pair. With interleave the
    rope dims are first permuted evens-then-odds, so pairs (0,1), (2,3), ... of the checkpoint rotate together."""
    if interleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def softmax_scale(cfg: ModelConfig) -> float:
    """qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 under YaRN when mscale_all_dim is set."""
    scale = cfg.qk_head_dim ** -0.5
    if cfg.rope_scaling is not None and cfg.rope_scaling.get("mscale_all_dim"):
        m = _yarn_mscale(float(cfg.rope_scaling["factor"]), cfg.rope_scaling["mscale_all_dim"])
        scale *= m * m
    return scale


# ---- attention -----------------------------------------------------------------------------------------------

def attention(cfg: ModelConfig, weights: dict[str, np.ndarray], prefix: str, x: np.ndarray,
              cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Causal multi-head attention with full per-head K and V. x [T, D] (already normed) -> [T, D]."""
    num_tokens, nh = x.shape[0], cfg.num_attention_heads
    nope, rope, vdim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if cfg.q_lora_rank is None:
        q = x @ weights[f"{prefix}.q_proj.weight"].T
    else:
        q_lat = rms_norm(x @ weights[f"{prefix}.q_a_proj.weight"].T, weights[f"{prefix}.q_a_layernorm.weight"],
                         LATENT_NORM_EPS)
        q = q_lat @ weights[f"{prefix}.q_b_proj.weight"].T
    q = q.reshape(num_tokens, nh, nope + rope).transpose(1, 0, 2)  # [H, T, nope + rope]
    q_nope, q_pe = q[..., :nope], apply_rope(q[..., nope:], cos, sin, cfg.rope_interleave)

    kv_a = x @ weights[f"{prefix}.kv_a_proj_with_mqa.weight"].T  # [T, R + rope]
    c_kv = rms_norm(kv_a[:, :cfg.kv_lora_rank], weights[f"{prefix}.kv_a_layernorm.weight"], LATENT_NORM_EPS)
    k_pe = apply_rope(kv_a[:, cfg.kv_lora_rank:], cos, sin, cfg.rope_interleave)  # [T, rope], shared by heads
    kv = (c_kv @ weights[f"{prefix}.kv_b_proj.weight"].T).reshape(num_tokens, nh, nope + vdim).transpose(1, 0, 2)
    k_nope, v = kv[..., :nope], kv[..., nope:]  # [H, T, nope], [H, T, V]

    scores = (q_nope @ k_nope.transpose(0, 2, 1) + q_pe @ k_pe.T[None]) * softmax_scale(cfg)  # [H, T, T]
    future = np.triu(np.ones((num_tokens, num_tokens), dtype=bool), k=1)
    probs = softmax(np.where(future, -np.inf, scores))
    out = (probs @ v).transpose(1, 0, 2).reshape(num_tokens, nh * vdim)  # [T, H * V]
    return out @ weights[f"{prefix}.o_proj.weight"].T


# ---- MoE -----------------------------------------------------------------------------------------------------

def _top_indices(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row, largest first; equal values: lower index first."""
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


def route(cfg: ModelConfig, x: np.ndarray, gate: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group-limited top-k routing. x [T, D] -> (experts [T, k] int64, weights [T, k] float64).

    The bias only steers the selection; the weights come from the unbiased scores. A group's score is the sum
    of its two best biased scores (its best one when a group holds a single expert)."""
    logits = x @ gate.T  # [T, E]
    scores = softmax(logits) if cfg.scoring_func == "softmax" else sigmoid(logits)
    biased = scores + bias
    num_tokens, num_experts = scores.shape
    per_group = num_experts // cfg.n_group
    grouped = np.sort(biased.reshape(num_tokens, cfg.n_group, per_group), axis=-1)  # [T, G, E/G] ascending
    group_scores = grouped[..., -min(2, per_group):].sum(axis=-1)  # [T, G]
    kept_groups = _top_indices(group_scores, cfg.topk_group)  # [T, topk_group]
    allowed = np.zeros((num_tokens, cfg.n_group), dtype=bool)
    np.put_along_axis(allowed, kept_groups, True, axis=-1)
    allowed = np.repeat(allowed, per_group, axis=-1)  # [T, E]
    experts = _top_indices(np.where(allowed, biased, -np.inf), cfg.num_experts_per_tok)  # [T, k]
    topk_weights = np.take_along_axis(scores, experts, axis=-1)
    if cfg.norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(axis=-1, keepdims=True) + 1e-20)
    return experts.astype(np.int64), topk_weights * cfg.routed_scaling_factor


def moe(cfg: ModelConfig, weights: dict[str, np.ndarray], prefix: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Routed experts plus shared experts. x [T, D] -> (out [T, D], chosen experts [T, k])."""
    experts, topk_weights = route(cfg, x, weights[f"{prefix}.gate.weight"],
                                  weights[f"{prefix}.gate.e_score_correction_bias"])
    out = np.zeros_like(x)
    for e in np.unique(experts):
        rows, slots = np.nonzero(experts == e)
        out[rows] += topk_weights[rows, slots, None] * swiglu_mlp(weights, f"{prefix}.experts.{e}", x[rows])
    if cfg.n_shared_experts:
        out += swiglu_mlp(weights, f"{prefix}.shared_experts", x)
    return out, experts


# ---- the model -----------------------------------------------------------------------------------------------

@dataclass(slots=True)
class ForwardTrace:
    logits: np.ndarray  # [T, V] float64
    routed: dict[int, np.ndarray]  # MoE layer -> experts chosen per token [T, k]
    hidden: list[np.ndarray]  # [T, D] output of each layer i: transformers' hidden_states[i + 1] (the last normed)


def _checked_tokens(cfg: ModelConfig, tokens: Sequence[int]) -> np.ndarray:
    ids = np.asarray(tokens)
    if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"tokens must be a non-empty 1-D sequence of integer ids, got shape {ids.shape} "
                         f"dtype {ids.dtype}")
    bad = ids[(ids < 0) | (ids >= cfg.vocab_size)]
    if bad.size:
        raise ValueError(f"token id {int(bad[0])} is out of range [0, {cfg.vocab_size})")
    if ids.size > cfg.max_position_embeddings:
        raise ValueError(f"{ids.size} tokens exceed max_position_embeddings={cfg.max_position_embeddings}")
    return ids.astype(np.int64)


def _float64_weights(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for name, shape in weight_shapes(cfg).items():
        if name not in weights:
            raise ValueError(f"weight {name!r} is missing (expected shape {shape})")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"weight {name!r} has shape {tuple(weights[name].shape)}, expected {shape}")
        out[name] = np.asarray(weights[name], dtype=np.float64)
    return out


def run_model(cfg: ModelConfig, weights: dict[str, np.ndarray], tokens: Sequence[int]) -> ForwardTrace:
    """The full forward over tokens at positions 0..T-1, with the experts each MoE layer chose."""
    ids = _checked_tokens(cfg, tokens)
    w = _float64_weights(cfg, weights)
    cos, sin = rope_tables(cfg, ids.size)
    x = w["model.embed_tokens.weight"][ids]  # [T, D]
    routed, hidden = {}, []
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}"
        h = rms_norm(x, w[f"{p}.input_layernorm.weight"], cfg.rms_norm_eps)
        x = x + attention(cfg, w, f"{p}.self_attn", h, cos, sin)
        h = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], cfg.rms_norm_eps)
        if cfg.is_moe_layer(layer):
            ffn, routed[layer] = moe(cfg, w, f"{p}.mlp", h)
        else:
            ffn = swiglu_mlp(w, f"{p}.mlp", h)
        x = x + ffn
        hidden.append(x)
    x = rms_norm(x, w["model.norm.weight"], cfg.rms_norm_eps)
    hidden[-1] = x  # as transformers' hidden_states[-1]: the last layer's output after the final norm
    return ForwardTrace(logits=x @ w[lm_head_name(cfg)].T, routed=routed, hidden=hidden)


def forward_logits(cfg: ModelConfig, weights: dict[str, np.ndarray], tokens: Sequence[int]) -> np.ndarray:
    """Logits [T, V] float64 at every position of tokens (positions 0..T-1, causal)."""
    return run_model(cfg, weights, tokens).logits


def greedy_generate(cfg: ModelConfig, weights: dict[str, np.ndarray], prompt: Sequence[int],
                    num_new: int) -> tuple[np.ndarray, np.ndarray]:
    """Greedy continuation of prompt: (tokens [num_new] int64, logits [num_new, V] float64), where tokens[i] is
    the argmax (lowest id on ties) of logits[i]. Recomputes the full forward each step: slow, obviously right."""
    if not isinstance(num_new, int) or num_new < 1:
        raise ValueError(f"num_new={num_new!r} must be an integer >= 1")
    sequence = [int(t) for t in _checked_tokens(cfg, prompt)]
    if len(sequence) + num_new - 1 > cfg.max_position_embeddings:
        raise ValueError(f"prompt of {len(sequence)} tokens + {num_new} new tokens exceeds "
                         f"max_position_embeddings={cfg.max_position_embeddings}")
    tokens, logits = [], []
    for _ in range(num_new):
        last = forward_logits(cfg, weights, sequence)[-1]
        token = int(np.argmax(last))
        tokens.append(token)
        logits.append(last)
        sequence.append(token)
    return np.asarray(tokens, dtype=np.int64), np.stack(logits)
