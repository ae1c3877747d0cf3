"""`sweep`: DDTree at several budgets on one prompt, with each budget's median and p10-p90 range."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cli import options as opts
from cli.request import request_from_args
from profiling.report import write_atomic
from profiling.sweep import DEFAULT_BUDGETS, budget_sweep, format_rows, parse_budgets


def _sweep_command(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    budgets = parse_budgets(args.budgets)
    if args.json is not None:
        opts.check_output_file(args.json, args.force, "--json")

    def progress(done: int, total: int) -> None:
        if sys.stderr.isatty():  # a live counter for people; logs get only the table
            print(f"\rbudget {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)

    rows = budget_sweep(request, budgets, repeats=args.repeats, on_progress=progress)
    print(format_rows(rows))
    if args.json is not None:
        spec = request.drafter
        meta = {"model": str(args.model), "prompt": list(request.prompt), "decode": request.config.to_dict(),
                "drafter": spec.settings() | {"name": spec.name}, "repeats": args.repeats}
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
