"""`python -m engine run`: AR and DDTree on one prompt, a progress bar, a summary table, and the five exports.

Every input is checked before the decode starts, and the report directory before anything is written
(profiling/report.py), so an error (exit 2) leaves existing files untouched.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import torch

from engine.checkpoint import Checkpoint
from engine.config import DecodeConfig
from engine.kdtr import read_kdtr
from engine.loading import load_model
from engine.records import RunRecord
from engine.session import decode_pair, parse_prompt

from .capture import capture_pair
from .metrics import summarize, tau
from .progress import DecodeProgress
from .report import check_out_dir, write_all

DRAFTERS = ("oracle",)


class RunArgsError(ValueError):
    """A command-line input of `run` is missing or invalid."""


def load_checkpoint(args: argparse.Namespace) -> Checkpoint:
    if args.fixture is not None:
        path = pathlib.Path(args.fixture)
        if not path.is_file():
            raise RunArgsError(f"--fixture {path}: no such file; pass a .kdtr fixture (tests/refs/model_tiny.kdtr, "
                               "or write one with `python -m engine make-fixture`)")
        return read_kdtr(path)
    if not pathlib.Path(args.model).exists():
        raise RunArgsError(f"--model {args.model}: no such file or directory; pass a .kdtr file or a Hugging Face "
                           "model directory")
    return load_model(args.model)


def pick_prompt(args: argparse.Namespace, ckpt: Checkpoint) -> list[int]:
    if args.prompt is not None:
        return parse_prompt(args.prompt, ckpt.config.vocab_size)
    if ckpt.prompt is None:
        raise RunArgsError(f"{ckpt.source} has no prompt of its own: pass --prompt with token ids, e.g. --prompt 1,2,3")
    return ckpt.prompt.tolist()


def decode_config(args: argparse.Namespace, ckpt: Checkpoint, prompt: list[int]) -> DecodeConfig:
    """--max-new defaults to the fixture's golden length for its own prompt, else to DecodeConfig's."""
    max_new = args.max_new
    if max_new is None:
        own = ckpt.golden_tokens is not None and ckpt.prompt is not None and prompt == ckpt.prompt.tolist()
        max_new = len(ckpt.golden_tokens) if own else DecodeConfig().max_new_tokens
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RunArgsError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    if not 0.0 <= args.noise <= 1.0:
        raise RunArgsError(f"--noise {args.noise}: expected a probability in [0, 1]")
    return DecodeConfig(budget=args.budget, block_size=args.block_size, max_new_tokens=max_new, device=args.device,
                        dtype=args.dtype)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def summary_table(ar: RunRecord, dd: RunRecord) -> str:
    s = summarize(ar, dd)
    rows = [
        ("tokens generated", len(ar.tokens), len(dd.tokens)),
        ("steps", ar.num_steps, dd.num_steps),
        ("tokens/step (tau)", _num(tau(ar), ".2f"), _num(s["tau"], ".2f")),
        ("prefill ms", f"{s['ar_prefill_ms']:.2f}", f"{s['ddtree_prefill_ms']:.2f}"),
        ("total ms", f"{s['ar_time_ms']:.2f}", f"{s['ddtree_time_ms']:.2f}"),
        ("tokens/s", _num(s["ar_tokens_per_s"], ".1f"), _num(s["ddtree_tokens_per_s"], ".1f")),
    ]
    lines = [f"{'':<20}{'AR':>12}{'DDTree':>12}"] + [f"{k:<20}{a!s:>12}{d!s:>12}" for k, a, d in rows]
    lines.append(f"{'speedup':<20}{'':>12}{_num(s['speedup'], '.2f') + 'x':>12}")
    lines.append("acceptance histogram (steps accepting 0..L drafted tokens): "
                 + " ".join(map(str, s["acceptance_histogram"])))
    div = s["first_divergence"]
    lines.append("greedy-exact: DDTree tokens == AR tokens" if s["greedy_exact"] else
                 f"NOT greedy-exact: first divergence at position {div['position']} (AR {div['ar_token']}, "
                 f"DDTree {div['ddtree_token']}, AR top-1 minus top-2 logit {_num(div['logit_gap'], '.4g')})")
    return "\n".join(lines)


def run_command(args: argparse.Namespace) -> int:
    try:
        ckpt = load_checkpoint(args)
        prompt = pick_prompt(args, ckpt)
        cfg = decode_config(args, ckpt, prompt)
        if args.report is not None:
            check_out_dir(pathlib.Path(args.report), args.force)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    progress = DecodeProgress(cfg.max_new_tokens)
    capture = None
    if args.profile:
        ar, dd, capture = capture_pair(ckpt, prompt, cfg, args.noise, args.seed, on_step=progress)
    else:
        ar, dd = decode_pair(ckpt, prompt, cfg, args.noise, args.seed, on_step=progress)
    progress.finish()
    print(summary_table(ar, dd))
    if args.report is not None:
        try:
            paths = write_all(ar, dd, args.report, force=args.force, capture=capture)
        except (ValueError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {', '.join(p.name for p in paths)} to {args.report}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    defaults = DecodeConfig()
    p = subparsers.add_parser("run", help="AR and DDTree on one prompt; summary table and reports")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--fixture", help="a .kdtr fixture file")
    source.add_argument("--model", help="a .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory")
    p.add_argument("--prompt", help="prompt token ids, comma or space separated (default: the checkpoint's prompt)")
    p.add_argument("--drafter", default="oracle", choices=DRAFTERS)
    p.add_argument("--noise", type=float, default=0.0, help="the oracle drafter's noise in [0, 1] (default 0)")
    p.add_argument("--seed", type=int, default=0, help="the drafter's seed (default 0)")
    p.add_argument("--budget", type=int, default=defaults.budget, help="tree budget B (drafted nodes)")
    p.add_argument("--block-size", type=int, default=defaults.block_size, help="L + 1 (L drafted positions)")
    p.add_argument("--max-new", type=int, default=None,
                   help="tokens to generate (default: the fixture's golden length, else "
                        f"{defaults.max_new_tokens})")
    p.add_argument("--device", default=defaults.device, choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=defaults.dtype, choices=["float32", "bfloat16"])
    p.add_argument("--profile", action="store_true", help="also capture the decode with torch.profiler")
    p.add_argument("--report", metavar="DIR", help="write report.html, report.json, kernels.csv, steps.csv and "
                                                   "trace.json into DIR")
    p.add_argument("--force", action="store_true", help="overwrite existing reports in DIR")
    p.set_defaults(func=run_command)
