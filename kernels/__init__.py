"""Builds and loads the ddtree op library, once per process.

`load()` compiles csrc/ops.cpp and csrc/cpu/*.cpp (plus csrc/cuda/*.cu and csrc/cuda/binding.cpp where torch
sees a GPU) with torch.utils.cpp_extension.load into a build directory named after the torch version, the
device kind and a hash of the sources and flags, so a second process reuses the build. Loading a second
library that registers the `ddtree` namespace aborts the process, hence the single cached load.

A build killed midway leaves torch's `<build_dir>/lock` behind and the next build would wait on it forever.
Builders here serialise on an flock of `<build_dir>/lock.owner` and write their pid into it; a `lock` whose
owner is dead (or, with no owner, older than the timeout) is stale and removed, and a live owner holding it
longer than DDTREE_BUILD_LOCK_TIMEOUT seconds (default 600) is an ExtensionBuildError naming the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["ExtensionBuildError", "build_info", "build_lock", "check_error_path", "is_loaded", "load"]

CSRC = Path(__file__).parent / "csrc"
EXTENSION_NAME = "ddtree_ops"
DEFAULT_LOCK_TIMEOUT_S = 600.0
_POLL_S = 0.2
_OUTPUT_TAIL_LINES = 30
_LOAD_LOCK = threading.Lock()


class ExtensionBuildError(RuntimeError):
    """The op library could not be built or loaded; the message names the cause and the fix."""


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
    before = _mtime_ns(library)
    with build_lock(plan.build_dir, _lock_timeout_s()):
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
    h = hashlib.sha256()
    for path in files:
        h.update(str(path.relative_to(CSRC)).encode() + b"\0" + path.read_bytes() + b"\0")
    h.update("\0".join(flags).encode())
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


_ERROR_PROBE = """
import sys, torch
torch.ops.load_library(sys.argv[1])
try:
    torch.ops.ddtree.tree_build(torch.zeros(1, 1), torch.tensor(0), -1)
except RuntimeError as e:
    sys.exit(0 if "budget must be in" in str(e) else 3)
sys.exit(4)
"""


def check_error_path(library: Path) -> None:
    """An op raising an error must not take the process down. A g++ that links libstdc++ statically into the
    library (seen with a wrapper g++ on a CUDA image) builds one that works until its first error message,
    then crashes; a child process tries one error per build, and a marker file remembers that it passed."""
    marker = library.with_name(library.name + ".errors-ok")
    if _mtime_ns(marker) is not None and _mtime_ns(marker) >= (_mtime_ns(library) or 0):
        return
    result = subprocess.run([sys.executable, "-c", _ERROR_PROBE, str(library)], capture_output=True, text=True,
                            timeout=600, check=False)
    if result.returncode != 0:
        cxx = os.environ.get("CXX") or "c++"
        raise ExtensionBuildError(
            f"the op library {library} fails when an op raises an error (probe exit {result.returncode}; "
            f"{result.stderr.strip()[-300:]}): the C++ compiler {cxx!r} likely linked libstdc++ into it statically. "
            f"Set CXX to a g++ that links libstdc++ dynamically (for example CXX=/usr/bin/g++), delete "
            f"{library.parent} and load again"
        )
    marker.touch()


@contextlib.contextmanager
def build_lock(build_dir: Path, timeout_s: float) -> Iterator[None]:
    """Hold the right to build in build_dir, clearing a stale torch `lock` first.

    Builders serialise on an flock of `lock.owner` (the kernel drops it when a process dies) and write their
    pid into it. Inside, torch's own `lock` is stale when that pid is dead, or when no pid was written and
    the lock is older than timeout_s; a live holder past timeout_s raises ExtensionBuildError.
    """
    lock, owner = build_dir / "lock", build_dir / "lock.owner"
    deadline = time.monotonic() + timeout_s
    with open(owner, "a+") as f:
        while not _try_flock(f):
            if time.monotonic() > deadline:
                raise _held_error(lock, owner, _read_pid(owner), timeout_s)
            time.sleep(_POLL_S)
        try:
            _wait_for_torch_lock(lock, owner, deadline, timeout_s)
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            yield
        finally:
            f.truncate(0)
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def _wait_for_torch_lock(lock: Path, owner: Path, deadline: float, timeout_s: float) -> None:
    while True:
        now = time.monotonic()  # read before the age, so an ownerless lock ages out before the deadline passes
        age = _age_s(lock)
        if age is None:
            return
        pid = _read_pid(owner)
        if (pid is not None and not _pid_alive(pid)) or (pid is None and age > timeout_s):
            lock.unlink(missing_ok=True)  # left by a killed build
            return
        if now > deadline:
            raise _held_error(lock, owner, pid, timeout_s)
        time.sleep(_POLL_S)


def _held_error(lock: Path, owner: Path, pid: int | None, timeout_s: float) -> ExtensionBuildError:
    holder = f"process {pid}" if pid is not None else "a builder that left no pid"
    return ExtensionBuildError(
        f"the build lock {lock} has been held by {holder} (see {owner}) for more than {timeout_s:g} s; "
        f"wait for that build to finish, or if no build is running delete {lock} and load again "
        "(DDTREE_BUILD_LOCK_TIMEOUT sets how long to wait)"
    )


def _try_flock(f) -> bool:
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _read_pid(owner: Path) -> int | None:
    try:
        text = owner.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _age_s(path: Path) -> float | None:
    try:
        return time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None


def _mtime_ns(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None
