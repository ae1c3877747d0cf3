"""Write a TargetLM as a Hugging Face DeepseekV3ForCausalLM directory: config.json + model.safetensors, which
engine.loaders.hf_import.read_hf_dir (and transformers) load with no conversion.

In bfloat16 or float32, or as DeepSeek-V3 ships its weights (save dtype "fp8"): every projection matrix of attention
and the MLPs as F8_E4M3 with a float32 <name>_scale_inv per 128 x 128 block (the block's largest magnitude maps to
448, e4m3's largest finite value), the embeddings, lm_head, norms and the router in bfloat16, and config.json's
quantization_config saying so; the engine dequantizes it on load (engine/loaders/hf_weights.py). About half the
bytes of bfloat16 for the same parameters, so a larger target fits the same shipping budget."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.loaders.fp8_blocks import FP8_QUANTIZATION, quantize_fp8
from engine.loaders.hf_config import ARCHITECTURE, FIXED_KEYS
from engine.loaders.hf_layout import SINGLE_FILE
from engine.training.target_model import INIT_STD, TargetLM

SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
SAVE_DTYPE_CHOICES = (*SAVE_DTYPES, "fp8")  # fp8: the matrices block-wise FP8 (engine/loaders/fp8_blocks.py)


def is_fp8_weight(name: str, shape: tuple[int, ...]) -> bool:
    """Whether DeepSeek-V3's FP8 checkpoints store the tensor as F8_E4M3: the matrices of attention and the MLPs
    (not the embeddings, the lm_head or the router's gate)."""
    return len(shape) == 2 and name not in ("model.embed_tokens.weight", "lm_head.weight") \
        and not name.endswith(".mlp.gate.weight")


def hf_config(model: TargetLM, dtype: str, end_of_text_id: int | None) -> dict:
    """config.json: every ModelConfig field under its DeepseekV3Config name, the fixed DeepSeek-V3 keys, and the
    keys transformers wants for loading and generation."""
    cfg = model.cfg
    return {
        "architectures": [ARCHITECTURE], "model_type": "deepseek_v3", **FIXED_KEYS, **cfg.to_dict(),
        "num_key_value_heads": cfg.num_attention_heads,  # transformers' eager attention needs it; MLA ignores it
        "initializer_range": INIT_STD, "torch_dtype": "bfloat16" if dtype == "fp8" else dtype, "use_cache": True,
        "bos_token_id": end_of_text_id, "eos_token_id": end_of_text_id,
        **({"quantization_config": FP8_QUANTIZATION} if dtype == "fp8" else {}),
    }


def save_hf_dir(model: TargetLM, directory: str | Path, dtype: str = "bfloat16",
                end_of_text_id: int | None = None) -> list[Path]:
    """config.json and model.safetensors (weights in dtype, one of SAVE_DTYPE_CHOICES) into directory; returns the
    two files."""
    if dtype not in SAVE_DTYPE_CHOICES:
        raise ValueError(f"dtype={dtype!r}: expected one of {SAVE_DTYPE_CHOICES}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, t in model.state_dict().items():
        t = t.detach().to("cpu")
        if dtype == "fp8" and is_fp8_weight(name, tuple(t.shape)):
            tensors[name], tensors[f"{name}_scale_inv"] = quantize_fp8(t)
        else:
            tensors[name] = t.to(SAVE_DTYPES.get(dtype, torch.bfloat16)).contiguous()
    weights = directory / SINGLE_FILE
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = directory / "config.json"
    config.write_text(json.dumps(hf_config(model, dtype, end_of_text_id), indent=2) + "\n")
    return [config, weights]
