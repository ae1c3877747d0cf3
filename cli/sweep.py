"""`sweep`: DDTree at several budgets on one prompt, with each budget's median and p10-p90 range."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cli import options as opts
from profiling.report import write_atomic
from profiling.sweep import DEFAULT_BUDGETS, budget_sweep, format_rows, parse_budgets


def _sweep_command(args: argparse.Namespace) -> int:
    ckpt = opts.load_checkpoint(args)
    prompt = opts.pick_prompt(args, ckpt)
    cfg = opts.decode_config(args, ckpt, prompt)
    spec = opts.drafter_spec(args)
    budgets = parse_budgets(args.budgets)
    if args.json is not None:
        opts.check_output_file(args.json, args.force, "--json")

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():  # a live counter for people; logs get only the table
            print(f"\rbudget {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)

    rows = budget_sweep(ckpt, prompt, cfg, budgets, spec, repeats=args.repeats, on_progress=progress)
    print(format_rows(rows))
    if args.json is not None:
        meta = {"model": str(args.model), "prompt": list(prompt), "decode": cfg.to_dict(), "drafter": spec.settings()
                | {"name": spec.name}, "repeats": args.repeats}
        write_atomic(args.json, (json.dumps({**meta, "rows": rows}, indent=2) + "\n").encode())
        print(f"wrote {args.json}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sweep", help="decode one prompt with DDTree at several budgets: tau and ms/token per B")
    opts.add_model_args(p)
    opts.add_prompt_args(p)
    opts.add_drafter_args(p)
    opts.add_decode_args(p, budget=False)
    p.add_argument("--budgets", default=", ".join(map(str, DEFAULT_BUDGETS)),
                   help="tree budgets to try (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="decodes per budget: the median and its p10-p90 range "
                                                          "(default 3)")
    p.add_argument("--json", type=Path, help="also write the rows to this JSON file")
    p.add_argument("--force", action="store_true", help="overwrite the --json file if it exists")
    p.set_defaults(func=_sweep_command)
