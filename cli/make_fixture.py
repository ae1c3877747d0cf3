"""`make-fixture`: the tiny seeded model with its golden tokens, written as a .kdtr file."""
from __future__ import annotations

import argparse
import pathlib
import sys

from engine.loaders.kdtr import KdtrError, write_kdtr
from engine.model.fixtures import make_fixture


def _make_fixture_command(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    if args.seed < 0:
        print(f"error: --seed must be >= 0, got {args.seed}", file=sys.stderr)
        return 2
    if out.exists() and not args.force:
        print(f"error: {out} already exists; pass --force to overwrite it", file=sys.stderr)
        return 2
    if not out.parent.is_dir():
        print(f"error: directory {out.parent} does not exist; create it first", file=sys.stderr)
        return 2
    ckpt = make_fixture(seed=args.seed)
    try:
        write_kdtr(out, ckpt)
    except (KdtrError, OSError) as exc:
        print(f"error: could not write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {len(ckpt.weights.names())} weight tensors, prompt of {ckpt.prompt.size} tokens, "
          f"{ckpt.golden_tokens.size} golden tokens ({out.stat().st_size} bytes)")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `make-fixture --out PATH [--seed N] [--force]`."""
    parser = subparsers.add_parser("make-fixture", help="write the tiny seeded model with golden tokens as .kdtr",
                                   description="Write the tiny seeded model (random weights, seeded prompt, golden "
                                               "greedy continuation from the numpy golden model) as a .kdtr file.")
    parser.add_argument("--out", required=True, help="the .kdtr file to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and prompt (default 0)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.set_defaults(func=_make_fixture_command)
