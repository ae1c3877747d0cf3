"""`python -m engine drafter-check --model TARGET --drafter-model DIR`: the DFlash drafter's health on this target
and prompt (profiling/drafter_health.py): each check's verdict, what was measured and the rule. Exit status 0 when
every check is ok, 1 when any warns, 2 on bad input."""
from __future__ import annotations

import argparse
from pathlib import Path

from cli import options as opts
from cli.request import request_from_args
from engine.decoding.session import load_target
from engine.drafters import DrafterSpec
from engine.records import MODE_LABELS
from profiling.drafter_health import OK, Check, check_drafter

TREE_CHOICES = ("chain", "tree")  # engine.records.TREES keys of one mode


def format_checks(checks: list[Check]) -> str:
    lines = []
    for check in checks:
        lines.append(f"{check.verdict:<5} {check.name:<15} {check.found}")
        lines.append(f"{'':<21} rule: {check.rule}")
    warned = sum(c.verdict != OK for c in checks)
    lines.append(f"{warned} of {len(checks)} checks warn" if warned else f"all {len(checks)} checks ok")
    return "\n".join(lines)


def drafter_check(args: argparse.Namespace) -> int:
    request = request_from_args(args, DrafterSpec("dflash", model=args.drafter_model))
    cfg, mode = request.config, request.primary
    model = load_target(request.checkpoint, cfg)
    checks = check_drafter(model, request.prompt, cfg, request.drafter.model, mode)
    budget = f" B={cfg.budget}" if mode == "ddtree" else ""
    print(f"drafter-check: {args.drafter_model} on {Path(args.model).name}, {MODE_LABELS[mode]}{budget}, "
          f"block size {cfg.block_size}, {cfg.max_new_tokens} tokens, prompt of {len(request.prompt)} tokens")
    print(format_checks(checks))
    return 0 if all(c.verdict == OK for c in checks) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("drafter-check", help="a DFlash drafter's health on a target: layer ids, mask row, "
                                                    "RoPE, block size (exit 1 when a check warns)")
    opts.add_model_args(p)
    p.add_argument("--drafter-model", required=True, metavar="DIR", help="the DFlash checkpoint directory")
    opts.add_prompt_args(p)
    opts.add_decode_args(p)
    p.add_argument("--tree", default="tree", choices=TREE_CHOICES,
                   help="measure acceptance with the best-first tree (DDTree) or the top-1 chain (default: tree)")
    p.set_defaults(func=drafter_check)
