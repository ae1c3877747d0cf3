"""`python -m engine <command>`: each command module adds its own parser via register(subparsers)."""
from __future__ import annotations

import argparse
import importlib
import sys

from .config import ConfigError

COMMAND_MODULES = ("profiling.verify", "profiling.cli", "engine.fixtures", "engine.hf", "profiling.sweep",
                   "engine.gpu_check", "engine.training.train_target", "engine.drafter_check")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine", description="DDTree Studio engine")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
