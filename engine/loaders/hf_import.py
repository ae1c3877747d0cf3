"""Import Hugging Face checkpoints (DeepSeek-V3, Kimi-K2): config.json plus (sharded) safetensors, lazily.

read_hf_dir checks the whole directory before it reads any weight: the config (engine.loaders.hf_config), the files and
each shard's header (engine.loaders.hf_layout), and every tensor's name, dtype and shape (engine.loaders.hf_plan).
The weights themselves are read when a model is built (engine.loaders.hf_weights: tensor by tensor, straight to the
device). docs/hf-loading.md describes what is accepted and what is refused; every refusal is an HFLoadError naming the
file, field or tensor.
"""
from __future__ import annotations

from pathlib import Path

from engine.loaders.checkpoint import Checkpoint
from engine.loaders.hf_config import HFLoadError, config_from_hf, fp8_block_size
from engine.loaders.hf_layout import CONFIG_FILE, read_json, read_shard, weight_files
from engine.loaders.hf_plan import plan_reads, present_tensors
from engine.loaders.hf_weights import HFWeights
from engine.model.weights import weight_shapes

__all__ = ["HFLoadError", "read_hf_dir"]


def read_hf_dir(path: str | Path) -> Checkpoint:
    """A Hugging Face DeepseekV3ForCausalLM directory as a Checkpoint whose weights are read on demand."""
    root = Path(path)
    if not root.is_dir():
        raise HFLoadError(f"{root}: not a directory; pass a Hugging Face model directory")
    if not (root / CONFIG_FILE).exists():
        raise HFLoadError(f"{root}: no config.json; a Hugging Face model directory needs config.json and safetensors")
    data = read_json(root, CONFIG_FILE)
    where = str(root / CONFIG_FILE)
    cfg = config_from_hf(data, where)
    block = fp8_block_size(data, where)
    files, placement = weight_files(root)
    reads = plan_reads(cfg, present_tensors([read_shard(p) for p in files], placement), block, root)
    return Checkpoint(config=cfg, weights=HFWeights(cfg, reads, list(weight_shapes(cfg)), block), source=str(root))
