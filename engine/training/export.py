"""Write a TargetLM as a Hugging Face DeepseekV3ForCausalLM directory: config.json + model.safetensors, which
engine.loaders.hf_import.read_hf_dir (and transformers) load with no conversion."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.loaders.hf_config import ARCHITECTURE, FIXED_KEYS
from engine.loaders.hf_layout import SINGLE_FILE
from engine.training.target_model import INIT_STD, TargetLM

SAVE_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def hf_config(model: TargetLM, dtype: str, end_of_text_id: int | None) -> dict:
    """config.json: every ModelConfig field under its DeepseekV3Config name, the fixed DeepSeek-V3 keys, and the
    keys transformers wants for loading and generation."""
    cfg = model.cfg
    return {
        "architectures": [ARCHITECTURE], "model_type": "deepseek_v3", **FIXED_KEYS, **cfg.to_dict(),
        "num_key_value_heads": cfg.num_attention_heads,  # transformers' eager attention needs it; MLA ignores it
        "initializer_range": INIT_STD, "torch_dtype": dtype, "use_cache": True,
        "bos_token_id": end_of_text_id, "eos_token_id": end_of_text_id,
    }


def save_hf_dir(model: TargetLM, directory: str | Path, dtype: str = "bfloat16",
                end_of_text_id: int | None = None) -> list[Path]:
    """config.json and model.safetensors (weights in dtype) into directory; returns the two files."""
    if dtype not in SAVE_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {tuple(SAVE_DTYPES)}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to(device="cpu", dtype=SAVE_DTYPES[dtype]).contiguous()
               for name, t in model.state_dict().items()}
    weights = directory / SINGLE_FILE
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = directory / "config.json"
    config.write_text(json.dumps(hf_config(model, dtype, end_of_text_id), indent=2) + "\n")
    return [config, weights]
