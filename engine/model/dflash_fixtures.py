"""Random-weight DFlash drafters of the released layouts, for tests and benchmarks (no trained drafter is
needed to check the forward, the cache, the loader or the speed)."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from engine.loaders.dflash_checkpoint import save_dflash_dir
from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import tensor_shapes

GAIN = 1.0  # matrices: std GAIN / sqrt(fan_in), so each layer's output is of the order of its input
NORM_NOISE = 0.1  # norm weights: 1 + NORM_NOISE * N(0, 1), so a forward that skipped one would show


def kimi_k25_layout(**overrides) -> DFlashConfig:
    """z-lab/Kimi-K2.5-DFlash's layout: 6 layers, hidden 7168, 64 query / 8 key-value heads, head_dim 128,
    intermediate 18432, block 8, target layers [1, 12, 24, 35, 47, 58] of 61, mask id 163838, vocabulary
    163840, YaRN factor 64 over 4096 positions with mscale = mscale_all_dim = 1. rope_theta 50000 is the Kimi-K2
    target's (this layout's choice; the RoPE base does not change a step's cost). overrides replace fields,
    e.g. small widths for tests."""
    base = DFlashConfig(
        hidden_size=7168, intermediate_size=18432, num_hidden_layers=6, num_attention_heads=64, num_key_value_heads=8,
        head_dim=128, vocab_size=163840, block_size=8, num_target_layers=61, mask_token_id=163838,
        target_layer_ids=(1, 12, 24, 35, 47, 58), rms_norm_eps=1e-6, rope_theta=50000.0,
        rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "mscale": 1.0,
                      "mscale_all_dim": 1.0},
        max_position_embeddings=262144)
    return dataclasses.replace(base, **overrides)


def random_tensors(cfg: DFlashConfig, seed: int, device: torch.device | str = "cpu",
                   dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """Seeded weights for every tensor of the table, drawn on the device in dtype."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in tensor_shapes(cfg).items():
        w = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        w = 1.0 + NORM_NOISE * w if len(shape) == 1 else w * (GAIN / shape[1] ** 0.5)
        out[name] = w.to(dtype)
    return out


def make_dflash_dir(path: str | Path, cfg: DFlashConfig, seed: int = 0, num_shards: int = 1,
                    dtype: torch.dtype = torch.float32) -> Path:
    """A random-weight DFlash checkpoint directory at path (z-lab's layout)."""
    return save_dflash_dir(path, cfg, random_tensors(cfg, seed, dtype=dtype), num_shards=num_shards)
