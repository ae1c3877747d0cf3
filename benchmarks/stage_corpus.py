"""Stage the corpus the shipped pair was trained on: this interpreter's standard library with its own test
suites (about four times the text of the default `python-stdlib` corpus, which leaves the tests out), as a
folder for `--corpus-dir`. Kept: every .py file under the stdlib path that is UTF-8 and at most 400 kB, outside
the folders and files that are not hand-written library code (engine.training.corpus.STDLIB_EXCLUDED_DIRS less the test
folders, plus lib2to3's grammar fixtures, _sysconfigdata_* and config-*).

    python -m benchmarks.stage_corpus .corpus/cpython-3.11-lib      # Python 3.11.7: 1,435 files, 27.4 MB
"""
from __future__ import annotations

import argparse
import shutil
import sys
import sysconfig
from pathlib import Path

from engine.training.corpus import STDLIB_EXCLUDED_DIRS

EXCLUDED_DIRS = (STDLIB_EXCLUDED_DIRS - {"test", "tests"}) | {"lib2to3"}
MAX_BYTES = 400_000


def staged_files(root: Path) -> list[Path]:
    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        if EXCLUDED_DIRS & set(parts[:-1]) or parts[-1].startswith("_sysconfigdata") or parts[0].startswith("config-"):
            return False
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return len(data) <= MAX_BYTES

    return sorted(p for p in root.rglob("*.py") if p.is_file() and kept(p))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder to create (must not exist)")
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; pass a new folder", file=sys.stderr)
        return 2
    root = Path(sysconfig.get_paths()["stdlib"])
    files = staged_files(root)
    for path in files:
        target = args.out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    print(f"staged {len(files)} files, {sum(f.stat().st_size for f in files):,} bytes from {root} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
