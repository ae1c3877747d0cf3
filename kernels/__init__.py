"""Builds and loads the ddtree op library, once per process.

`load()` compiles csrc/ops.cpp and csrc/cpu/*.cpp (plus csrc/cuda/*.cu and csrc/cuda/binding.cpp where torch
sees a GPU) with torch.utils.cpp_extension.load into a build directory named after the torch version, the
device kind and a hash of the sources, the flags, this checkout's path and the interpreter, so a second process
reuses the build. ninja records the sources' absolute paths and the include directories, so two checkouts (or two
virtual environments) sharing one directory would rebuild each other's library in every process: each gets its
own. While it builds or waits for another builder, it says so on stderr. Loading a second
library that registers the `ddtree` namespace aborts the process, hence the single cached load.

The build directory's guards (the builders' lock, the library's record and its error-path check) are in
kernels/build_guard.py.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from kernels.build_guard import ExtensionBuildError, build_lock, check_error_path, discard_unverified, lock_holder

__all__ = ["ExtensionBuildError", "build_holder", "build_info", "build_lock", "check_error_path", "discard_unverified",
           "is_loaded", "load"]

CSRC = Path(__file__).parent / "csrc"
EXTENSION_NAME = "ddtree_ops"
DEFAULT_LOCK_TIMEOUT_S = 600.0
_OUTPUT_TAIL_LINES = 30
_LOAD_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True)
class BuildPlan:
    sources: list[Path]
    with_cuda: bool
    extra_cflags: list[str]
    extra_cuda_cflags: list[str]
    extra_ldflags: list[str]
    build_dir: Path


@dataclasses.dataclass(frozen=True, slots=True)
class _Loaded:
    ops: object  # torch.ops.ddtree
    info: dict


def load():
    """Build (or reuse) and load the op library; returns the `torch.ops.ddtree` namespace."""
    with _LOAD_LOCK:  # Streamlit runs sessions in threads: two first calls must not both load
        return _load_once().ops


def is_loaded() -> bool:
    """Whether this process has loaded the op library already (without loading it)."""
    return _load_once.cache_info().currsize > 0


def build_info() -> dict:
    """How this process got the library: build_dir, with_cuda, load_seconds, cold_build, library."""
    with _LOAD_LOCK:
        return dict(_load_once().info)


@functools.cache
def _load_once() -> _Loaded:
    start = time.perf_counter()
    plan = make_plan()
    _check_toolchain(plan.with_cuda)
    try:
        plan.build_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExtensionBuildError(
            f"cannot create the build directory {plan.build_dir} ({e}); set DDTREE_BUILD_DIR to a writable directory"
        ) from e
    library = plan.build_dir / f"{EXTENSION_NAME}.so"
    with build_lock(plan.build_dir, _lock_timeout_s()):
        discard_unverified(library)
        before = _mtime_ns(library)
        if before is None:
            print(f"building the ddtree ops in {plan.build_dir} (process {os.getpid()} holds its lock.owner; once per "
                  "checkout: a few minutes)", file=sys.stderr, flush=True)
        _build_and_load(plan)
        check_error_path(library)
    info = {
        "build_dir": str(plan.build_dir),
        "with_cuda": plan.with_cuda,
        "load_seconds": time.perf_counter() - start,
        "cold_build": before is None or _mtime_ns(library) != before,
        "library": str(library),
    }
    return _Loaded(ops=torch.ops.ddtree, info=info)


def build_holder() -> tuple[Path, int | None]:
    """This machine's build directory and the pid of the live process building in it (None: no one is)."""
    build_dir = make_plan().build_dir
    return build_dir, lock_holder(build_dir)


def make_plan() -> BuildPlan:
    """Sources, flags and build directory for this machine (CUDA sources only where torch sees a GPU)."""
    cuda_sources = sorted((CSRC / "cuda").glob("*.cu"))
    with_cuda = torch.cuda.is_available() and torch.version.cuda is not None and bool(cuda_sources)
    sources = [CSRC / "ops.cpp", *sorted((CSRC / "cpu").glob("*.cpp"))]
    headers = [*CSRC.glob("*.h"), *(CSRC / "cpu").glob("*.h")]
    extra_cuda_cflags: list[str] = []
    if with_cuda:
        binding = CSRC / "cuda" / "binding.cpp"
        sources += cuda_sources + ([binding] if binding.exists() else [])
        headers += [*(CSRC / "cuda").glob("*.cuh"), *(CSRC / "cuda").glob("*.h")]
        extra_cuda_cflags = ["-O3", "-std=c++17", "-lineinfo", *_cuda_arch_flags()]
    extra_cflags = ["-O3", "-fopenmp"]  # -fopenmp: at::parallel_for is inline and runs serially without it
    extra_ldflags = ["-fopenmp"]
    flags = [*extra_cflags, *extra_cuda_cflags, *extra_ldflags]  # the arch list is in the -gencode flags
    digest = _digest(sorted(sources + headers), flags)
    default_dir = Path.home() / ".cache" / "ddtree-studio" / "build"
    default_dir /= f"{torch.__version__}-{'cuda' if with_cuda else 'cpu'}-{digest}"
    build_dir = Path(os.environ.get("DDTREE_BUILD_DIR") or default_dir)
    return BuildPlan(sources, with_cuda, extra_cflags, extra_cuda_cflags, extra_ldflags, build_dir)


def _cuda_arch_flags() -> list[str]:
    """nvcc -gencode flags for TORCH_CUDA_ARCH_LIST ("8.0;9.0+PTX") or, unset or "native", the visible GPU.

    9.0 builds as 9.0a: the verify_attn wgmma path needs the arch-specific target, and sm_90a code runs on
    every compute capability 9.0 GPU. -DDDTREE_SM90A tells the sources that sm_90a code is in the build.
    Passing our own -gencode flags keeps torch from adding its own.
    """
    listed = os.environ.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if listed and listed != "native":
        archs = [arch for arch in re.split(r"[;,\s]+", listed) if arch]
    else:
        major, minor = torch.cuda.get_device_capability()
        archs = [f"{major}.{minor}"]
    flags = []
    for arch in archs:
        match = re.fullmatch(r"(\d+)\.(\d+)(a?)(\+PTX)?", arch)
        if match is None:
            raise ExtensionBuildError(
                f"TORCH_CUDA_ARCH_LIST entry {arch!r} is not a compute capability such as 9.0, 9.0a or 8.6+PTX: "
                "list numeric architectures (TORCH_CUDA_ARCH_LIST=9.0 for an H100/H200) or unset it to build "
                "for the visible GPU"
            )
        major, minor, arch_specific, ptx = match.groups()
        num = f"{major}{minor}" + ("a" if arch_specific or (major, minor) == ("9", "0") else "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    if "-gencode=arch=compute_90a,code=sm_90a" in flags:
        flags.append("-DDDTREE_SM90A")
    return flags


def _digest(files: list[Path], flags: list[str]) -> str:
    """The build's identity: the sources' contents, the flags, and what ninja records besides them (the sources'
    absolute directory, and the interpreter whose torch and Python headers the build includes)."""
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(CSRC)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\0".join([*flags, str(CSRC.resolve()), sys.prefix, sys.executable]).encode())
    return h.hexdigest()[:12]


def _check_toolchain(with_cuda: bool) -> None:
    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx.split()[0]) is None:
        found_gpp = " (g++ is installed: set CXX=g++)" if shutil.which("g++") else ""
        raise ExtensionBuildError(
            f"no C++ compiler to build the ddtree ops: {cxx!r} is not on PATH{found_gpp}; "
            "install g++ (apt-get install g++) or set CXX to a C++ compiler"
        )
    if shutil.which("ninja") is None:
        raise ExtensionBuildError("ninja is needed to build the ddtree ops and is not on PATH: pip install ninja")
    if with_cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME is None or not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
            raise ExtensionBuildError(
                f"torch sees a GPU but nvcc is missing (CUDA_HOME={CUDA_HOME}): install the CUDA toolkit "
                f"{torch.version.cuda} and set CUDA_HOME to it, or hide the GPU (CUDA_VISIBLE_DEVICES=) "
                "for a CPU-only build"
            )


def _lock_timeout_s() -> float:
    raw = os.environ.get("DDTREE_BUILD_LOCK_TIMEOUT", "")
    if not raw:
        return DEFAULT_LOCK_TIMEOUT_S
    try:
        return float(raw)
    except ValueError:
        raise ExtensionBuildError(f"DDTREE_BUILD_LOCK_TIMEOUT must be a number of seconds, got {raw!r}") from None


def _build_and_load(plan: BuildPlan) -> None:
    from torch.utils.cpp_extension import load as cpp_load

    try:
        cpp_load(
            name=EXTENSION_NAME,
            sources=[str(s) for s in plan.sources],
            extra_cflags=plan.extra_cflags,
            extra_cuda_cflags=plan.extra_cuda_cflags,
            extra_ldflags=plan.extra_ldflags,
            build_directory=str(plan.build_dir),
            with_cuda=plan.with_cuda,
            is_python_module=False,
            verbose=False,
        )
    except (RuntimeError, OSError) as e:
        message = str(e)
        if not message.startswith("Error building extension"):
            raise ExtensionBuildError(
                f"the ddtree op library in {plan.build_dir} was built but could not be loaded: {message}; "
                f"delete {plan.build_dir} to rebuild it from scratch"
            ) from e
        tail = "\n".join(message.splitlines()[-_OUTPUT_TAIL_LINES:])
        raise ExtensionBuildError(
            f"compiling the ddtree ops failed (build directory {plan.build_dir}); "
            f"last lines of the compiler output:\n{tail}\n"
            "fix the error above in kernels/csrc, then load again"
        ) from e


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
