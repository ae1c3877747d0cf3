"""Import Hugging Face checkpoints (DeepSeek-V3, Kimi-K2): config.json plus (sharded) safetensors, lazily.

read_hf_dir checks the whole directory before it reads any weight: the config (engine.hf_config), the files and
each shard's header (engine.hf_layout), and every tensor's name, dtype and shape (engine.hf_plan). The weights
themselves are read when a model is built (engine.hf_weights: tensor by tensor, straight to the device).
docs/hf-loading.md describes what is accepted and what is refused; every refusal is an HFLoadError naming the
file, field or tensor.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint
from .hf_config import HFLoadError, config_from_hf, fp8_block_size
from .hf_layout import CONFIG_FILE, read_json, read_shard, weight_files
from .hf_plan import plan_reads, present_tensors
from .hf_weights import HFWeights
from .weights import weight_shapes

__all__ = ["HFLoadError", "read_hf_dir", "register"]


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


def _import_hf(args: argparse.Namespace) -> int:
    from .kdtr import write_kdtr
    from .reference import greedy_generate
    from .session import parse_prompt

    if args.out.exists() and not args.force:
        raise HFLoadError(f"{args.out} exists; pass --force to overwrite it")
    if args.golden < 1:
        raise HFLoadError(f"--golden {args.golden}: expected at least 1 token to generate")
    ckpt = read_hf_dir(args.src)
    vocab = ckpt.config.vocab_size
    if args.prompt is None:
        prompt = np.random.default_rng(args.seed).integers(0, vocab, size=8, dtype=np.int64)
    else:
        prompt = np.asarray(parse_prompt(args.prompt, vocab), dtype=np.int64)
    weights = ckpt.numpy_weights()  # float32 on the host, read once: the golden model and the writer take them
    tokens, logits = greedy_generate(ckpt.config, weights, prompt.tolist(), args.golden)
    write_kdtr(args.out, Checkpoint(ckpt.config, weights, ckpt.source, prompt, np.asarray(tokens, dtype=np.int64),
                                    np.asarray(logits, dtype=np.float32)))
    print(f"wrote {args.out}: {ckpt.config.num_hidden_layers} layers, vocab {vocab}, prompt {prompt.tolist()}, "
          f"{args.golden} golden tokens")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import-hf", help="convert a Hugging Face DeepSeek-V3 / Kimi-K2 directory into a .kdtr fixture",
        description="Load SRC_DIR (config.json + safetensors), generate golden tokens with the numpy reference "
                    "model, and write a .kdtr fixture.")
    parser.add_argument("src", metavar="SRC_DIR", type=Path, help="Hugging Face model directory")
    parser.add_argument("--out", required=True, type=Path, help="the .kdtr file to write")
    parser.add_argument("--prompt", help="prompt token ids, comma or space separated (default: 8 seeded random ids)")
    parser.add_argument("--golden", type=int, default=16, metavar="N", help="golden tokens to generate (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the default random prompt (default 0)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.set_defaults(func=_import_hf)
