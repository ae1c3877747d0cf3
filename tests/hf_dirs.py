"""Tiny Hugging Face DeepSeek-V3 directories made without transformers, and an independent FP8 decoder.

write_hf_dir saves a ModelConfig as config.json and float32 numpy weights as safetensors: in one file or sharded
with an index, in any float dtype, or block-wise FP8 as DeepSeek-V3 ships it (every projection matrix as F8_E4M3
with a float32 <name>_scale_inv per block; embeddings, lm_head, norms and the router in bfloat16). The numpy
functions decode e4m3 bits and apply block scales without torch, as the check of the loader's dequantization.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from engine.config import ModelConfig

FP8_MAX = 448.0  # the largest finite e4m3 value
INDEX = "model.safetensors.index.json"


def hf_config(cfg: ModelConfig, fp8_block: tuple[int, int] | None = None) -> dict:
    data = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **cfg.to_dict()}
    if fp8_block:
        data["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                       "weight_block_size": list(fp8_block)}
    return data


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight, float32 scale_inv) with weight ~= e4m3 * scale_inv per block, each block's max at 448."""
    rows, cols = weight.shape
    scale = torch.ones(math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            tile = weight[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            scale[i, j] = max(tile.abs().max().item(), 1e-12) / FP8_MAX
    expanded = scale.repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (weight / expanded).to(torch.float8_e4m3fn), scale


def is_quantized(name: str, shape: tuple[int, ...]) -> bool:
    """Which tensors DeepSeek-V3's FP8 checkpoints store as F8_E4M3: the matrices of attention and the MLPs."""
    return len(shape) == 2 and name not in ("model.embed_tokens.weight", "lm_head.weight") \
        and not name.endswith(".mlp.gate.weight")


def fp8_tensors(weights: dict[str, np.ndarray], block: tuple[int, int]) -> dict[str, torch.Tensor]:
    tensors = {}
    for name, w in weights.items():
        if is_quantized(name, w.shape):
            tensors[name], tensors[name + "_scale_inv"] = quantize_fp8(torch.from_numpy(w), block)
        else:
            tensors[name] = torch.from_numpy(w).bfloat16()
    return tensors


def write_hf_dir(root: Path, cfg: ModelConfig, weights: dict[str, np.ndarray], dtype: torch.dtype = torch.float32,
                 num_shards: int = 1, fp8_block: tuple[int, int] | None = None) -> dict[str, torch.Tensor]:
    """Write the directory; returns the tensors as stored."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(hf_config(cfg, fp8_block)))
    tensors = (fp8_tensors(weights, fp8_block) if fp8_block else
               {name: torch.from_numpy(w).to(dtype) for name, w in weights.items()})
    if num_shards == 1:
        save_file(tensors, root / "model.safetensors")
        return tensors
    names = sorted(tensors)
    files = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    weight_map = {name: files[i * num_shards // len(names)] for i, name in enumerate(names)}
    for file in files:
        save_file({n: tensors[n] for n in names if weight_map[n] == file}, root / file)
    (root / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tensors


def e4m3_values(bits: np.ndarray) -> np.ndarray:
    """float64 values of e4m3fn bytes: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    bits = bits.astype(np.int64)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    exponent, mantissa = (bits >> 3) & 0xF, bits & 0x7
    normal = 2.0 ** (exponent - 7) * (1 + mantissa / 8)
    subnormal = 2.0 ** -6 * (mantissa / 8)
    values = sign * np.where(exponent == 0, subnormal, normal)
    return np.where((exponent == 15) & (mantissa == 7), np.nan, values)


def dequantize_blocks(bits: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """float32 e4m3 values times their block's scale, one block at a time."""
    values = e4m3_values(bits)
    out = np.empty(values.shape, dtype=np.float32)
    for i in range(scale_inv.shape[0]):
        for j in range(scale_inv.shape[1]):
            rows, cols = slice(i * block[0], (i + 1) * block[0]), slice(j * block[1], (j + 1) * block[1])
            out[rows, cols] = values[rows, cols] * np.float64(scale_inv[i, j])
    return out
