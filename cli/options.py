"""The command-line options that verify, run and sweep share, and how each becomes an engine value: one
definition of the model and prompt choice, the drafter, the decode settings and the output checks."""
from __future__ import annotations

import argparse
import os
import pathlib

import torch

from engine.config import DEVICES, DTYPES, DecodeConfig
from engine.decoding.decoder import validate_prompt
from engine.decoding.session import parse_prompt
from engine.drafters import REGISTRY, DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.loading import load_model
from engine.loaders.shipped import DEFAULT_MODEL
from engine.records import TREES


class CliError(ValueError):
    """A command-line input is missing or invalid."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--fixture", dest="model", default=str(DEFAULT_MODEL), metavar="PATH",
                   help="a .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (default: %(default)s)")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="prompt token ids, comma or space separated (default: the checkpoint's "
                                         "prompt)")
    prompt.add_argument("--prompt-text", help="the prompt as text, encoded with the model's tokenizer.json")


def add_drafter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", choices=sorted(REGISTRY),
                   help="default: dflash when the model has a DFlash directory beside it (<dir>/dflash/ or "
                        "<model>-dflash/) and no oracle option is given, else oracle. " +
                        "; ".join(f"{name}: {entry.summary}" for name, entry in REGISTRY.items()))
    p.add_argument("--noise", type=float, default=0.0, help="oracle: chance to demote the true token (default 0)")
    p.add_argument("--drafter-seed", type=int, default=0, help="oracle: seed of its distractors (default 0)")
    p.add_argument("--drafter-model", metavar="DIR", help="dflash: the DFlash checkpoint directory (default: the "
                                                            "one beside the model)")


def add_decode_args(p: argparse.ArgumentParser, budget: bool = True, max_new_default: int | None = None) -> None:
    defaults = DecodeConfig()
    if budget:
        p.add_argument("--budget", type=int, default=defaults.budget, help="tree budget B (drafted nodes)")
    p.add_argument("--block-size", type=int, default=defaults.block_size, help="L + 1 (L drafted positions)")
    p.add_argument("--max-new", "--max-new-tokens", dest="max_new", type=int, default=max_new_default,
                   help="tokens to generate (default: the fixture's golden length for its own prompt, else "
                        f"{defaults.max_new_tokens})")
    p.add_argument("--device", default=defaults.device, choices=DEVICES)
    p.add_argument("--dtype", default=defaults.dtype, choices=DTYPES)
    p.add_argument("--temperature", type=float, default=defaults.temperature,
                   help="the target samples softmax(logits / T) at every node; 0 is greedy (default 0)")
    p.add_argument("--top-k", type=int, default=defaults.top_k, help="sample among the k most likely tokens "
                                                                    "(default 0: no limit)")
    p.add_argument("--top-p", type=float, default=defaults.top_p, help="sample within the top-p nucleus "
                                                                      "(default 1: no limit)")
    p.add_argument("--batch-invariant", action="store_true",
                   help="compute every row as AR computes it (fixed row blocks, position-ordered attention): "
                        "DDTree == AR bit for bit in every dtype, at a cost (benchmarks/RESULTS.md)")
    p.add_argument("--seed", type=int, default=defaults.seed,
                   help="the sampling seed: noise is keyed by (seed, position), so AR and DDTree draw alike "
                        "(default 0)")


def add_tree_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tree", default="tree", choices=sorted(TREES),
                   help="verify the best-first tree (DDTree), the drafter's top-1 chain (DFlash's own "
                        "verification), or both beside AR (default: tree)")


def load_checkpoint(args: argparse.Namespace) -> Checkpoint:
    if not pathlib.Path(args.model).exists():
        raise CliError(f"--model {args.model}: no such file or directory; pass a .kdtr file or a Hugging Face "
                       "model directory")
    return load_model(args.model)


def pick_prompt(args: argparse.Namespace, ckpt: Checkpoint) -> list[int]:
    if args.prompt is not None:
        return parse_prompt(args.prompt, ckpt.config.vocab_size)
    if args.prompt_text is not None:
        if ckpt.tokenizer is None:
            raise CliError(f"--prompt-text: {ckpt.source} has no tokenizer.json; pass token ids with --prompt")
        if not args.prompt_text:
            raise CliError("--prompt-text is empty: give some text, or token ids with --prompt")
        return validate_prompt(ckpt.tokenizer.encode(args.prompt_text), ckpt.config.vocab_size)
    if ckpt.prompt is None:
        raise CliError(f"{ckpt.source} has no prompt of its own: pass --prompt with token ids, e.g. --prompt 1,2,3")
    return ckpt.prompt.tolist()


def decode_config(args: argparse.Namespace, ckpt: Checkpoint, prompt: list[int]) -> DecodeConfig:
    """--max-new defaults to the fixture's golden length for its own prompt, else to DecodeConfig's."""
    max_new = args.max_new
    if max_new is None:
        own = ckpt.golden_tokens is not None and ckpt.prompt is not None and prompt == ckpt.prompt.tolist()
        max_new = len(ckpt.golden_tokens) if own else DecodeConfig().max_new_tokens
    if args.device == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return DecodeConfig(budget=getattr(args, "budget", DecodeConfig().budget), block_size=args.block_size,
                        max_new_tokens=max_new, device=args.device, dtype=args.dtype, seed=args.seed,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        batch_invariant=args.batch_invariant)


DRAFTER_FLAGS = {"noise": "--noise", "seed": "--drafter-seed", "model": "--drafter-model"}  # DrafterSpec field


def drafter_spec(args: argparse.Namespace) -> DrafterSpec:
    """The DrafterSpec the options describe; options of another drafter must stay at their defaults. Without
    --drafter, a model with a DFlash directory beside it drafts with that drafter, any other with the oracle
    (so --noise alone still picks the oracle)."""
    beside = dflash_dir_beside(args.model)
    oracle_flags = args.noise != 0.0 or args.drafter_seed != 0
    name = args.drafter or ("dflash" if (beside or args.drafter_model) and not oracle_flags else "oracle")
    fields = REGISTRY[name].fields
    model = args.drafter_model or (str(beside) if beside and name == "dflash" else None)
    given = {"noise": args.noise, "seed": args.drafter_seed, "model": model}
    stray = [DRAFTER_FLAGS[k] for k, v in given.items()
             if k not in fields and v != DrafterSpec.__dataclass_fields__[k].default]
    if stray:
        raise CliError(f"--drafter {name} does not take {', '.join(stray)}")
    try:
        return DrafterSpec(name, **{k: v for k, v in given.items() if k in fields})
    except ValueError as exc:
        flag = next((DRAFTER_FLAGS[k] for k in fields if k in str(exc)), "--drafter")
        raise CliError(f"{flag}: {exc}") from exc


def check_output_file(path: pathlib.Path, force: bool, flag: str) -> None:
    """path can be written: not a directory, an existing file only with --force, its directory writable."""
    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory: give a file path")
    if path.exists() and not force:
        raise CliError(f"{flag} {path} exists; pass --force to overwrite it")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: directory {parent} is not writable")
