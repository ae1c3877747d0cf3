"""RoPE tables for the torch models: inverse frequencies (plain or YaRN), cos/sin per position, and the softmax
mscale, after transformers' `_compute_yarn_parameters` (checked against it in tests/test_hf.py).

Two models read them: the target (DeepSeek-V3 rules: the rope dims qk_rope_head_dim, and under YaRN a softmax
scale times mscale(factor, mscale_all_dim)^2) and the DFlash drafter (Qwen3 rules: the whole head_dim, and no
softmax adjustment). Both fold YaRN's attention factor into cos and sin.
"""
from __future__ import annotations

import math

import torch

from engine.config import ModelConfig


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(dim: int, base: float, rs: dict) -> torch.Tensor:
    factor = rs["factor"]
    beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
    orig = rs["original_max_position_embeddings"]

    def correction_dim(rotations: float) -> float:
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if rs.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation = 1 - ramp
    return (1.0 / (factor * pos_freqs)) * ramp + (1.0 / pos_freqs) * extrapolation


def inv_frequencies(dim: int, base: float, rope_scaling: dict | None) -> torch.Tensor:
    """[dim / 2] float32: plain RoPE, or YaRN's blend of interpolated and original frequencies."""
    if rope_scaling is None:
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    return _yarn_inv_freq(dim, base, rope_scaling)


def attention_factor(rope_scaling: dict | None) -> float:
    """The factor cos and sin are multiplied by: 1 without YaRN; YaRN's `attention_factor` when the config sets
    it, else mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else mscale(factor)."""
    if rope_scaling is None:
        return 1.0
    if rope_scaling.get("attention_factor") is not None:
        return float(rope_scaling["attention_factor"])
    factor, mscale, mscale_all_dim = rope_scaling["factor"], rope_scaling.get("mscale"), rope_scaling.get(
        "mscale_all_dim")
    if mscale and mscale_all_dim:
        return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
    return yarn_mscale(factor)


def cos_sin(dim: int, base: float, rope_scaling: dict | None, num_positions: int,
            device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [num_positions, dim / 2] float32 for positions 0..num_positions-1, YaRN's attention factor folded
    in (the NeoX rotate-half pairing: dims i and i + dim / 2)."""
    amplitude = attention_factor(rope_scaling)
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_frequencies(dim, base, rope_scaling)
    return (angles.cos() * amplitude).to(device), (angles.sin() * amplitude).to(device)


def rope_tables(cfg: ModelConfig, num_positions: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The target's cos, sin [num_positions, P/2] float32 (P = qk_rope_head_dim) and its softmax mscale."""
    rs = cfg.rope_scaling
    cos, sin = cos_sin(cfg.qk_rope_head_dim, cfg.rope_theta, rs, num_positions, device)
    softmax_mscale = yarn_mscale(rs["factor"], rs["mscale_all_dim"]) if rs and rs.get("mscale_all_dim") else 1.0
    return cos, sin, softmax_mscale
