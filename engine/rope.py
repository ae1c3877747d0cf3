"""RoPE tables for the torch model: inverse frequencies (plain or YaRN), cos/sin per position, and the
softmax mscale. Follows transformers' DeepSeek-V3 conventions (checked against it in tests/test_hf.py)."""
from __future__ import annotations

import math

import torch

from .config import ModelConfig


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
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


def rope_tables(cfg: ModelConfig, num_positions: int,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, float]:
    """cos, sin [num_positions, P/2] float32 (YaRN's attention factor folded in) and the softmax mscale."""
    dim, base, rs = cfg.qk_rope_head_dim, cfg.rope_theta, cfg.rope_scaling
    if rs is None:
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        attention_factor, softmax_mscale = 1.0, 1.0
    else:
        inv_freq = _yarn_inv_freq(dim, base, rs)
        mscale, mscale_all_dim = rs.get("mscale"), rs.get("mscale_all_dim")
        attention_factor = rs.get("attention_factor")
        if attention_factor is None:
            attention_factor = (_yarn_mscale(rs["factor"], mscale) / _yarn_mscale(rs["factor"], mscale_all_dim)
                                if mscale and mscale_all_dim else _yarn_mscale(rs["factor"]))
        softmax_mscale = _yarn_mscale(rs["factor"], mscale_all_dim) if mscale_all_dim else 1.0
    angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    cos = (angles.cos() * attention_factor).to(device)
    sin = (angles.sin() * attention_factor).to(device)
    return cos, sin, softmax_mscale
