"""`python -m cli <command>` (alias: `python -m engine <command>`): every command adds its parser here."""
from __future__ import annotations

import argparse
import sys

from cli import (
    drafter_check,
    gpu_check,
    import_hf,
    make_fixture,
    run,
    sweep,
    train_drafter,
    train_target,
    verify,
)
from engine.config import ConfigError

COMMANDS = (verify, run, make_fixture, import_hf, sweep, gpu_check, train_target, train_drafter, drafter_check)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DDTree Studio engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.register(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
