"""Stage a corpus folder for `--corpus-dir`: this interpreter's standard library with its own test suites (about
four times the text of the default `python-stdlib` corpus, which leaves the tests out), plus, for the shipped
pair's corpus, torch's, four packages' and the dashboard's packages' sources (--with-torch --with-packages
--with-app-packages, the last command below). Kept: every .py file under the stdlib path that is UTF-8 and at
most 400 kB, outside the folders and files that are not hand-written library code
(engine.training.corpus.STDLIB_EXCLUDED_DIRS less the test folders, plus lib2to3's grammar fixtures,
_sysconfigdata_* and config-*).

    python -m benchmarks.stage_corpus .corpus/cpython-3.11-lib      # Python 3.11.7: 1,435 files, 27.4 MB
    python -m benchmarks.stage_corpus --with-torch .corpus/stdlib-torch  # plus torch's own Python sources
    python -m benchmarks.stage_corpus --with-torch --with-packages .corpus/stdlib-torch-packages
    python -m benchmarks.stage_corpus --with-torch --with-packages --with-app-packages .corpus/stdlib-torch-apps

--with-torch adds, under torch/, the .py sources of the torch that requirements.txt pins (every install of the
project has it, so the corpus stays reproducible offline; another installed version is refused), by the same
rules, less what is not torch's own hand-written library code: its test helpers (testing/), vendored code
(_vendor/) and generated pattern tables (serialized_patterns/). --with-packages adds, each under its own name,
the .py sources (tests included) of four more packages every install has: numpy and pandas (requirements.txt) and
sympy and networkx (torch's dependencies), at the versions PACKAGES names (another installed version is refused),
by the same rules, less sympy's generated ANTLR parsers (_antlr/) and autolev's generated examples
(test-examples/). --with-app-packages adds the packages the dashboard's install brings (streamlit, plotly and what
they, jsonschema and torch pull in: APP_PACKAGES, by import name, at the versions it names), less generated code:
protobuf modules (*_pb2.py, streamlit's proto/), plotly's graph_objs/, altair's schema/, huggingface_hub's
_generated/, vendored code (_vendor/, vendored/) and idna's Unicode tables (with them all: 9,504 files, 157.6 MB).
The staged folder is larger than one device call carries (64 MiB with the checkout); `tar -cJf corpus.tar.xz -C DIR
.` packs it to about a sixth, and benchmarks/h200_session.sh unpacks a CORPUS that ends in .tar.xz.
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
PACKAGE_EXCLUDED_DIRS = frozenset({"__pycache__", "_antlr", "test-examples", "proto", "graph_objs", "schema",
                                   "_generated", "_vendor", "vendored"})
GENERATED_FILES = ("_pb2.py", "idnadata.py", "uts46data.py")  # name endings of generated modules (app packages)
# --with-packages: the versions their sources were staged at (requirements.txt pins none of them), so that a corpus
# staged elsewhere is the same text or refused.
PACKAGES = {"numpy": "2.4.6", "pandas": "3.1.1", "sympy": "1.14.0", "networkx": "3.6.1"}
# --with-app-packages: import name -> (distribution, version), each a package folder of hand-written Python that
# `pip install -r requirements.txt` brings (the dashboard's stack and its dependencies), at the versions staged.
APP_PACKAGES = {
    "streamlit": ("streamlit", "1.67.0"), "plotly": ("plotly", "7.1.0"), "_plotly_utils": ("plotly", "7.1.0"),
    "altair": ("altair", "6.3.0"), "pydeck": ("pydeck", "0.9.3"), "narwhals": ("narwhals", "2.29.0"),
    "pyarrow": ("pyarrow", "26.0.1"), "huggingface_hub": ("huggingface-hub", "2.4.0"),
    "fsspec": ("fsspec", "2026.9.0"), "filelock": ("filelock", "4.3.2"), "tqdm": ("tqdm", "4.70.1"),
    "packaging": ("packaging", "26.2"), "jinja2": ("jinja2", "3.1.6"), "click": ("click", "8.5.1"),
    "starlette": ("starlette", "1.10.0"), "uvicorn": ("uvicorn", "0.55.0"), "anyio": ("anyio", "4.16.0"),
    "h11": ("h11", "0.16.0"), "httpx2": ("httpx2", "2.17.0"), "httpcore2": ("httpcore2", "2.17.0"),
    "websockets": ("websockets", "17.4"), "watchdog": ("watchdog", "7.1.1"), "requests": ("requests", "2.34.2"),
    "urllib3": ("urllib3", "2.7.0"), "idna": ("idna", "3.21"), "charset_normalizer": ("charset-normalizer", "3.4.7"),
    "jsonschema": ("jsonschema", "4.26.0"), "referencing": ("referencing", "0.37.0"), "attr": ("attrs", "26.1.0"),
    "yaml": ("pyyaml", "6.0.3"), "dateutil": ("python-dateutil", "2.9.0.post0"), "PIL": ("pillow", "13.0.0"),
    "google.protobuf": ("protobuf", "7.36.2"), "mpmath": ("mpmath", "1.3.0"), "setuptools": ("setuptools", "84.2.1"),
    "python_multipart": ("python-multipart", "0.0.34"), "itsdangerous": ("itsdangerous", "2.2.0"),
    "truststore": ("truststore", "0.10.5"), "tokenizers": ("tokenizers", "0.23.3"),
}
MAX_BYTES = 400_000
REQUIREMENTS = Path(__file__).resolve().parents[1] / "requirements.txt"


def staged_files(root: Path, excluded_dirs: frozenset[str] = EXCLUDED_DIRS,
                 excluded_endings: tuple[str, ...] = ()) -> list[Path]:
    def kept(path: Path) -> bool:
        parts = path.relative_to(root).parts
        if excluded_dirs & set(parts[:-1]) or parts[-1].startswith("_sysconfigdata") or parts[0].startswith("config-"):
            return False
        if parts[-1].endswith(excluded_endings):
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


def package_root(name: str, version: str, distribution: str | None = None, option: str = "--with-packages") -> Path:
    """An installed package's folder (name: its import name; distribution: what pip calls it, default the same),
    refused unless the distribution is the given version."""
    distribution = distribution or name
    try:
        installed = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        raise SystemExit(f"error: {distribution} is not installed; install {distribution}=={version} to stage "
                         f"{option}") from None
    if installed != version:
        raise SystemExit(f"error: {distribution} {installed} is installed but the corpus is staged from "
                         f"{distribution} {version}: install {distribution}=={version} (or stage it without "
                         f"{option})")
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"error: {distribution} {version} is installed but has no package {name}; stage it "
                         f"without {option}")
    return Path(list(spec.submodule_search_locations)[0])


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
    p.add_argument("--with-app-packages", action="store_true",
                   help=f"add the .py sources of the {len(APP_PACKAGES)} packages the dashboard's install brings "
                        "(streamlit, plotly, ...), each under its import name, less generated code")
    args = p.parse_args(argv)
    if args.out.exists():
        print(f"error: {args.out} exists; pass a new folder", file=sys.stderr)
        return 2
    sources = [(Path(sysconfig.get_paths()["stdlib"]), EXCLUDED_DIRS, (), args.out)]
    if args.with_torch:
        sources.append((torch_root(), TORCH_EXCLUDED_DIRS, (), args.out / "torch"))
    if args.with_packages:
        sources += [(package_root(name, version), PACKAGE_EXCLUDED_DIRS, (), args.out / name)
                    for name, version in PACKAGES.items()]
    if args.with_app_packages:
        sources += [(package_root(name, version, distribution, "--with-app-packages"), PACKAGE_EXCLUDED_DIRS,
                     GENERATED_FILES, args.out / name.replace(".", "/"))
                    for name, (distribution, version) in APP_PACKAGES.items()]
    for root, excluded_dirs, excluded_endings, out in sources:
        files = staged_files(root, excluded_dirs, excluded_endings)
        num_bytes = copy_files(files, root, out)
        print(f"staged {len(files)} files, {num_bytes:,} bytes from {root} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
