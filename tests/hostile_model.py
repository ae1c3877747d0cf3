"""A tiny target whose BPE tokenizer learned HTML and markdown, so its pieces hold <, >, & and ![x](...): what every
page and export must show escaped."""
from __future__ import annotations

from pathlib import Path

from hf_dirs import write_hf_dir

from engine.loaders.text import train_bpe
from engine.model.fixtures import random_weights, tiny_config

HOSTILE = "<script>alert(1)</script><b>bold</b> & ![x](http://127.0.0.1:9/x.png) <img src=http://127.0.0.1:9/y>"


def write_hostile_model(root: Path) -> Path:
    """The model directory at root (Hugging Face layout, random weights, the hostile tokenizer)."""
    cfg = tiny_config()
    write_hf_dir(root, cfg, random_weights(cfg, 0))
    train_bpe([HOSTILE + "\n    return x\n"] * 20, vocab_size=min(cfg.vocab_size, 300)).save(root)
    return root
