"""DDTree Studio engine: config, checkpoints, golden model, torch model, drafters and decoders."""
from .loading import load_model

__all__ = ["load_model"]
