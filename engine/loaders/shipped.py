"""The models that ship in models/: the trained text pair (the default) and the tiny .kdtr fixture."""
from __future__ import annotations

import pathlib

MODELS_DIR = pathlib.Path(__file__).resolve().parents[2] / "models"
DEFAULT_MODEL = MODELS_DIR / "ddtree-py-22m"  # the shipped text pair (models/README.md)
TINY_FIXTURE = MODELS_DIR / "model_tiny.kdtr"  # the seeded tiny model with golden tokens (make-fixture)


def bundled_models() -> dict[str, pathlib.Path]:
    """The shipped models by name, the default first: every directory under models/ with a config.json (a trained
    target with its tokenizer and prompts), then the .kdtr fixtures there."""
    dirs = sorted(path.parent for path in MODELS_DIR.glob("*/config.json"))
    return {path.name: path for path in [*dirs, *sorted(MODELS_DIR.glob("*.kdtr"))]}
