"""Block-wise FP8 weights as DeepSeek-V3 and Kimi-K2 ship them, the one definition the loaders and the writers share.

A matrix is stored as F8_E4M3 beside a float32 <name>_scale_inv holding one number per block of its last two
dimensions (128 x 128 in those checkpoints); weight ~= e4m3 x its block's scale_inv. config.json says so in its
quantization_config (FP8_QUANTIZATION; engine.loaders.hf_config.fp8_block_size reads it back). Half the bytes of
bfloat16 for the same parameters: the engine dequantizes on arrival and runs in its own dtype."""
from __future__ import annotations

import math

import torch

FP8_DTYPE, SCALE_SUFFIX = "F8_E4M3", "_scale_inv"  # the safetensors dtype and the scale's name suffix
FP8_BLOCK = (128, 128)  # DeepSeek-V3's and Kimi-K2's weight_block_size
FP8_MAX = 448.0  # the largest finite float8_e4m3fn value
FP8_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": list(FP8_BLOCK)}


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The shape of an FP8 weight's scale_inv: one number per block of its last two dimensions."""
    return (*shape[:-2], math.ceil(shape[-2] / block[0]), math.ceil(shape[-1] / block[1]))


def quantize_fp8(weight: torch.Tensor, block: tuple[int, int] = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 weight [R, C], float32 scale_inv [ceil(R / b0), ceil(C / b1)]): weight ~= e4m3 x its block's
    scale_inv, each block's largest magnitude mapped to FP8_MAX (a block of zeros gets a tiny scale)."""
    rows, cols = weight.shape
    num_r, num_c = scale_shape((rows, cols), block)
    padded = torch.nn.functional.pad(weight.float(), (0, num_c * block[1] - cols, 0, num_r * block[0] - rows))
    tiles = padded.view(num_r, block[0], num_c, block[1])
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX  # [num_r, num_c]
    scaled = (tiles / scale[:, None, :, None]).view(num_r * block[0], num_c * block[1])[:rows, :cols]
    return scaled.to(torch.float8_e4m3fn).contiguous(), scale


def dequantize_fp8(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """weight [..., R, C] times the scale of its (block[0] x block[1]) block, scale_inv [..., ceil(R/b0), ceil(C/b1)];
    float32, on weight's device."""
    rows, cols = weight.shape[-2:]
    scale = scale_inv.float().repeat_interleave(block[0], dim=-2)[..., :rows, :]
    return weight.float() * scale.repeat_interleave(block[1], dim=-1)[..., :cols]
