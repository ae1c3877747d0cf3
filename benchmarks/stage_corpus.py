"""Stage a corpus folder for `--corpus-dir`: this interpreter's standard library with its own test suites (about
four times the text of the default `python-stdlib` corpus, which leaves the tests out), plus, for the shipped
pair's corpus, torch's and four packages' sources (--with-torch --with-packages). Kept: every .py file under the
stdlib path that is UTF-8 and at most 400 kB, outside the folders and files that are not hand-written library code
(engine.training.corpus.STDLIB_EXCLUDED_DIRS less the test folders, plus lib2to3's grammar fixtures,
_sysconfigdata_* and config-*).

    python -m benchmarks.stage_corpus .corpus/cpython-3.11-lib      # Python 3.11.7: 1,435 files, 27.4 MB
    python -m benchmarks.stage_corpus --with-torch .corpus/stdlib-torch  # plus torch's own Python sources
    python -m benchmarks.stage_corpus --with-torch --with-packages .corpus/stdlib-torch-packages  # the shipped pair's

--with-torch adds, under torch/, the .py sources of the torch that requirements.txt pins (every install of the
project has it, so the corpus stays reproducible offline; another installed version is refused), by the same
rules, less what is not torch's own hand-written library code: its test helpers (testing/), vendored code
(_vendor/) and generated pattern tables (serialized_patterns/). --with-packages adds, each under its own name,
the .py sources (tests included) of four more packages every install has: numpy and pandas (requirements.txt) and
sympy and networkx (torch's dependencies), at the versions PACKAGES names (another installed version is refused),
by the same rules, less sympy's generated ANTLR parsers (_antlr/) and autolev's generated examples
(test-examples/). The staged folder is larger than one device call carries (64 MiB with the checkout);
`tar -cJf corpus.tar.xz -C DIR .` packs it to about a sixth, and benchmarks/h200_session.sh unpacks a CORPUS that
ends in .tar.xz.
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from engine.training.corpus import STDLIB_EXCLUDED_DIRS

EXCLUDED_DIRS = (STDLIB_EXCLUDED_DIRS - {"test", "tests"}) | {"lib2to3"}
TORCH_EXCLUDED_DIRS = frozenset({"testing", "_vendor", "serialized_patterns", "__pycache__"})
PACKAGE_EXCLUDED_DIRS = frozenset({"__pycache__", "_antlr", "test-examples"})
# --with-packages: the versions their sources were staged at (requirements.txt pins none of them), so that a corpus
# staged elsewhere is the same text or refused.
PACKAGES = {"numpy": "2.4.6", "pandas": "3.1.1", "sympy": "1.14.0", "networkx": "3.6.1"}
MAX_BYTES = 400_000
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def staged_files(root: Path, excluded_dirs: frozenset[str] = EXCLUDED_DIRS) -> list[Path]:
    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        if excluded_dirs & set(parts[:-1]) or parts[-1].startswith("_sysconfigdata") or parts[0].startswith("config-"):
            return False
        data = path.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return len(data) <= MAX_BYTES

    return sorted(p for p in root.rglob("*.py") if p.is_file() and kept(p))


def pinned_version(package: str, requirements: Path = REQUIREMENTS) -> str | None:
    """The version requirements.txt pins the package at (`package==X`), None where it pins none."""
    for line in requirements.read_text().splitlines():
        name, sep, version = line.split("#")[0].strip().partition("==")
        if sep and name.strip().lower() == package:
            return version.strip()
    return None


def torch_root() -> Path:
    """The installed torch's package folder, refused unless it is the version requirements.txt pins."""
    import torch

    pinned, installed = pinned_version("torch", REQUIREMENTS), torch.__version__.split("+")[0]
    if pinned != installed:
        raise SystemExit(f"error: torch {installed} is installed but {REQUIREMENTS} pins {pinned}: the corpus "
                         "would not be reproducible; stage it where the pinned torch is installed")
    return Path(torch.__file__).parent


def package_root(name: str, version: str) -> Path:
    """An installed package's folder, refused unless it is the given version."""
    try:
        installed = metadata.version(name)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"error: {name} is not installed; install {name}=={version} to stage "
                         "--with-packages") from None
    if installed != version:
        raise SystemExit(f"error: {name} {installed} is installed but the corpus is staged from {name} {version}: "
                         f"install {name}=={version} (or stage it without --with-packages)")
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent


def copy_files(files: list[Path], root: Path, out: Path) -> int:
    """Copy files (under root) to the same relative paths under out; their bytes."""
    for path in files:
        target = out / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return sum(f.stat().st_size for f in files)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="the folder to create (must not exist)")
    p.add_argument("--with-torch", action="store_true", help="add the pinned torch's own .py sources under torch/")
    p.add_argument("--with-packages", action="store_true",
                   help=f"add the .py sources of {', '.join(f'{n} {v}' for n, v in PACKAGES.items())}, each under "
                        "its name")
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; pass a new folder", file=sys.stderr)
        return 2
    sources = [(Path(sysconfig.get_paths()["stdlib"]), EXCLUDED_DIRS, args.out)]
    if args.with_torch:
        sources.append((torch_root(), TORCH_EXCLUDED_DIRS, args.out / "torch"))
    if args.with_packages:
        sources += [(package_root(name, version), PACKAGE_EXCLUDED_DIRS, args.out / name)
                    for name, version in PACKAGES.items()]
    for root, excluded, out in sources:
        files = staged_files(root, excluded)
        num_bytes = copy_files(files, root, out)
        print(f"staged {len(files)} files, {num_bytes:,} bytes from {root} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
