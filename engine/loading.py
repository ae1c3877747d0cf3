"""One entry point for every model source: a .kdtr fixture file or a Hugging Face model directory."""
from __future__ import annotations

from pathlib import Path

from .checkpoint import Checkpoint
from .hf import read_hf_dir
from .kdtr import read_kdtr


class ModelLoadError(ValueError):
    """The path is neither a .kdtr file nor a Hugging Face model directory."""


def load_model(path: str | Path) -> Checkpoint:
    """Load a .kdtr fixture (engine.kdtr) or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (engine.hf)."""
    path = Path(path)
    if path.is_dir():
        return read_hf_dir(path)
    if path.is_file() and path.suffix == ".kdtr":
        return read_kdtr(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory; pass a .kdtr file or a Hugging Face model directory")
    if path.name == "config.json" or path.suffix == ".safetensors":
        raise ModelLoadError(f"{path}: pass the Hugging Face model directory ({path.parent}), not a file inside it")
    raise ModelLoadError(f"{path}: not a .kdtr file or a directory; pass a .kdtr fixture or a Hugging Face "
                         "model directory (config.json + safetensors)")
