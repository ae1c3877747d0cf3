"""`import-hf`: a Hugging Face DeepSeek-V3 / Kimi-K2 directory to a .kdtr fixture with golden tokens."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from engine.decoding.session import parse_prompt
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.hf_config import HFLoadError
from engine.loaders.hf_import import read_hf_dir
from engine.loaders.kdtr import write_kdtr
from engine.model.reference import greedy_generate


def _import_hf(args: argparse.Namespace) -> int:
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
