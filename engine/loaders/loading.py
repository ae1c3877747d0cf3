"""One entry point for every model source: a .kdtr fixture file or a Hugging Face model directory."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.loaders.checkpoint import Checkpoint
from engine.loaders.hf_import import read_hf_dir
from engine.loaders.hf_layout import read_json
from engine.loaders.kdtr import read_kdtr
from engine.loaders.text import TOKENIZER_FILE, Tokenizer

PROMPTS_FILE = "prompts.json"  # {"source": ..., "prompts": [{"text": ..., "file": ...}, ...]}


class ModelLoadError(ValueError):
    """The path is neither a .kdtr file nor a Hugging Face model directory."""


def load_model(path: str | Path) -> Checkpoint:
    """Load a .kdtr fixture (engine.loaders.kdtr) or a Hugging Face DeepSeek-V3 / Kimi-K2 directory
    (engine.loaders.hf_import)."""
    path = Path(path)
    if path.is_dir():
        return with_text(read_hf_dir(path), path)
    if path.is_file() and path.suffix == ".kdtr":
        return read_kdtr(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or directory; pass a .kdtr file or a Hugging Face model directory")
    if path.name == "config.json" or path.suffix == ".safetensors":
        raise ModelLoadError(f"{path}: pass the Hugging Face model directory ({path.parent}), not a file inside it")
    raise ModelLoadError(f"{path}: not a .kdtr file or a directory; pass a .kdtr fixture or a Hugging Face "
                         "model directory (config.json + safetensors)")


def _present(path: Path) -> bool:
    """A file, or anything in its place (a dangling link, a device), which the readers then refuse by name."""
    return path.exists() or path.is_symlink()


def with_text(ckpt: Checkpoint, root: Path) -> Checkpoint:
    """Attach a model directory's tokenizer.json and prompts.json (its example prompts, as text), when it has
    them; the first prompt becomes the checkpoint's prompt. Both are read like every other file of the
    directory (inside it, bounded, strict JSON)."""
    if not _present(root / TOKENIZER_FILE):
        return ckpt
    tokenizer = Tokenizer.load(root)
    if tokenizer.vocab_size > ckpt.config.vocab_size:
        raise ModelLoadError(f"{root / TOKENIZER_FILE} has {tokenizer.vocab_size} tokens but config.json's "
                             f"vocab_size is {ckpt.config.vocab_size}: the tokenizer belongs to another model")
    tokenizer.fit_model(ckpt.config.vocab_size)  # a padded vocabulary: ids past the tokenizer show as <id N>
    ckpt.tokenizer = tokenizer
    prompts = root / PROMPTS_FILE
    if _present(prompts):
        doc = read_json(root, PROMPTS_FILE)
        entries = doc.get("prompts") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries or not all(
                isinstance(p, dict) and isinstance(p.get("text"), str) and p["text"] for p in entries):
            raise ModelLoadError(f"{prompts}: field 'prompts' must be a non-empty list of {{\"text\": \"...\"}} "
                                 "with non-empty texts; fix or delete the file")
        texts = tuple(p["text"] for p in entries)
        for i, text in enumerate(texts):
            if tokenizer.decode(tokenizer.encode(text)) != text:
                raise ModelLoadError(f"{prompts}: prompts[{i}] does not round-trip through {TOKENIZER_FILE}; fix or "
                                     "delete the file")
        ckpt.prompt_texts = texts
        ckpt.prompt = np.asarray(tokenizer.encode(texts[0]), dtype=np.int64)
    return ckpt
