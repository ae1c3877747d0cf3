"""The op-library loader: one load per process, a cached build across processes, stale locks, clear errors."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

import kernels
from kernels import ExtensionBuildError, build_guard, build_lock

REPO = Path(__file__).resolve().parents[1]
PRINT_BUILD_INFO = "import json, kernels; kernels.load(); print(json.dumps(kernels.build_info()))"


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter at the repository root with `env` added to this environment."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=os.environ | env, capture_output=True, text=True, timeout=300
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def live_pid():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


_HOLD_FLOCK = """
import fcntl, os, sys, time
with open(sys.argv[1], "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.truncate(0)
    f.write(str(os.getpid()))
    f.flush()
    print("holding", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def live_builder():
    """Start a process that holds build_dir's flock as a builder does; returns its pid."""
    procs = []

    def start(build_dir: Path) -> int:
        proc = subprocess.Popen([sys.executable, "-c", _HOLD_FLOCK, str(build_dir / "lock.owner")],
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "holding"
        return proc.pid

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def built_dir() -> Path:
    kernels.load()
    return Path(kernels.build_info()["build_dir"])


def test_load_twice_returns_the_same_library_without_rebuilding(built_dir, monkeypatch):
    first = kernels.load()
    info = kernels.build_info()

    def no_second_build(*args, **kwargs):
        raise AssertionError("load() built the extension a second time")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_second_build)
    assert kernels.load() is first
    assert kernels.build_info() == info
    assert first.tree_build is torch.ops.ddtree.tree_build


def test_second_process_reuses_the_cached_build(built_dir):
    start = time.perf_counter()
    result = _python(PRINT_BUILD_INFO)
    elapsed = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    child = json.loads(result.stdout.splitlines()[-1])
    assert child["build_dir"] == str(built_dir) and child["cold_build"] is False
    assert child["load_seconds"] < 5.0 and elapsed < 60.0


PRINT_DEFAULT_BUILD_DIR = "import kernels; print(kernels.make_plan().build_dir)"


def test_two_checkouts_get_build_directories_of_their_own(tmp_path):
    """ninja records the sources' absolute paths: a second checkout of the same sources sharing the first one's
    build directory would rebuild it in every process, so its default directory differs, and stays the same from
    one process to the next."""
    other = tmp_path / "checkout"
    shutil.copytree(REPO / "kernels", other / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "DDTREE_BUILD_DIR"}

    def default_dir(root: Path) -> str:
        out = subprocess.run([sys.executable, "-c", PRINT_DEFAULT_BUILD_DIR], cwd=root, env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    here, there = default_dir(REPO), default_dir(other)
    assert here != there
    assert default_dir(other) == there and default_dir(REPO) == here
    assert Path(here).parent == Path(there).parent, "both under the one cache directory"


def test_stale_lock_of_a_dead_builder_is_cleared(tmp_path):
    lock, owner = tmp_path / "lock", tmp_path / "lock.owner"
    lock.touch()
    owner.write_text(str(_dead_pid()))
    with build_lock(tmp_path, timeout_s=5.0):
        assert not lock.exists()
        assert owner.read_text() == str(os.getpid())
    assert owner.read_text() == ""


def test_old_lock_without_owner_is_cleared(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    an_hour_ago = time.time() - 3600
    os.utime(lock, (an_hour_ago, an_hour_ago))
    start = time.monotonic()
    with build_lock(tmp_path, timeout_s=600.0):
        assert not lock.exists()
    assert time.monotonic() - start < 5.0


def test_a_fresh_lock_without_owner_is_cleared_at_once(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()
    start = time.monotonic()
    with build_lock(tmp_path, timeout_s=600.0):
        assert not lock.exists()
    assert time.monotonic() - start < 5.0


def test_a_lock_whose_owner_names_a_live_unrelated_process_is_cleared_at_once(tmp_path, live_pid):
    """A builder's pid can be reused by any process after it dies: holding the flock proves no builder is alive
    (the loader once waited out its full timeout here, 600 s by default)."""
    lock = tmp_path / "lock"
    lock.touch()
    (tmp_path / "lock.owner").write_text(str(live_pid))
    start = time.monotonic()
    with build_lock(tmp_path, timeout_s=3.0):
        assert not lock.exists()
        assert (tmp_path / "lock.owner").read_text() == str(os.getpid())
    assert time.monotonic() - start < 2.0


def test_lock_held_by_a_live_builder_times_out_naming_the_file(tmp_path, live_builder):
    lock = tmp_path / "lock"
    lock.touch()
    pid = live_builder(tmp_path)
    with pytest.raises(ExtensionBuildError, match=rf"{re.escape(str(lock))}.*process {pid}.*stop that process"):
        with build_lock(tmp_path, timeout_s=0.5):
            pass
    assert lock.exists()  # a live builder's lock is never removed


def test_builders_take_turns(tmp_path):
    holding, release = threading.Event(), threading.Event()

    def hold():
        with build_lock(tmp_path, timeout_s=5.0):
            holding.set()
            release.wait(10.0)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(10.0)
    with pytest.raises(ExtensionBuildError, match="lock"):
        with build_lock(tmp_path, timeout_s=0.3):
            pass
    release.set()
    holder.join()
    with build_lock(tmp_path, timeout_s=0.3):
        assert (tmp_path / "lock.owner").read_text() == str(os.getpid())


def test_load_clears_a_stale_lock_and_proceeds(built_dir, tmp_path):
    build_dir = tmp_path / "build"
    shutil.copytree(built_dir, build_dir, ignore=shutil.ignore_patterns("lock", "lock.owner"))
    (build_dir / "lock").touch()
    (build_dir / "lock.owner").write_text(str(_dead_pid()))
    result = _python(PRINT_BUILD_INFO, DDTREE_BUILD_DIR=str(build_dir))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["cold_build"] is False
    assert not (build_dir / "lock").exists()


def test_load_with_a_live_held_lock_fails_naming_the_file(tmp_path, live_builder):
    (tmp_path / "lock").touch()
    pid = live_builder(tmp_path)
    result = _python(PRINT_BUILD_INFO, DDTREE_BUILD_DIR=str(tmp_path), DDTREE_BUILD_LOCK_TIMEOUT="1")
    assert result.returncode != 0
    lock = tmp_path / "lock"
    assert f"ExtensionBuildError: the build lock {lock} has been held by process {pid}" in result.stderr
    assert f"waiting for the ddtree op build in {tmp_path}: process {pid} holds {lock}.owner" in result.stderr


def test_a_truncated_library_is_linked_again_not_loaded(built_dir, tmp_path):
    """A library cut short (a full disk, a killed copy) would be a SIGBUS when loaded: its size and digest no
    longer match the record written when it passed its check, so the load deletes it and ninja links it again."""
    build_dir = tmp_path / "build"
    shutil.copytree(built_dir, build_dir, ignore=shutil.ignore_patterns("lock", "lock.owner"))
    library = build_dir / "ddtree_ops.so"
    intact = library.read_bytes()
    assert json.loads((build_dir / "ddtree_ops.so.verified").read_text())["size"] == len(intact)
    with open(library, "r+b") as f:
        f.truncate(len(intact) // 2)
    result = _python(PRINT_BUILD_INFO, DDTREE_BUILD_DIR=str(build_dir))
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    assert json.loads(result.stdout.splitlines()[-1])["cold_build"] is True
    record = json.loads((build_dir / "ddtree_ops.so.verified").read_text())
    assert record == {"size": library.stat().st_size, "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}


def test_an_unwritable_build_directory_says_to_set_ddtree_build_dir(tmp_path, monkeypatch):
    def read_only(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(build_guard, "open", read_only, raising=False)
    with pytest.raises(ExtensionBuildError, match=rf"cannot write in the build directory {re.escape(str(tmp_path))} "
                                                  r"\(Read-only file system.*set DDTREE_BUILD_DIR"):
        with build_lock(tmp_path, timeout_s=1.0):
            pass


def test_a_build_directory_on_a_read_only_filesystem_is_a_clear_error(built_dir, tmp_path):
    """The real thing where unprivileged mount namespaces are allowed: the build directory bind-mounted read-only."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("needs unshare -rm (an unprivileged user and mount namespace) to mount a read-only directory")
    build_dir = tmp_path / "build"
    shutil.copytree(built_dir, build_dir, ignore=shutil.ignore_patterns("lock", "lock.owner"))
    mount = f"mount --bind {build_dir} {build_dir} && mount -o remount,bind,ro {build_dir}"
    result = subprocess.run(["unshare", "-rm", "sh", "-c", f'{mount} && exec "$0" -c "$1"', sys.executable,
                             PRINT_BUILD_INFO], cwd=REPO, env=os.environ | {"DDTREE_BUILD_DIR": str(build_dir)},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert (f"ExtensionBuildError: cannot write in the build directory {build_dir} (Read-only file system"
            in result.stderr and "set DDTREE_BUILD_DIR" in result.stderr)


def test_missing_compiler_is_a_clear_error(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    result = _python(
        PRINT_BUILD_INFO, CXX="/nonexistent/c++", PATH=str(empty_bin), DDTREE_BUILD_DIR=str(tmp_path / "build")
    )
    assert result.returncode != 0
    assert "ExtensionBuildError: no C++ compiler" in result.stderr and "apt-get install g++" in result.stderr
    assert not (tmp_path / "build").exists()


def test_missing_ninja_is_a_clear_error(tmp_path):
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx is not None
    result = _python(PRINT_BUILD_INFO, CXX=cxx, PATH=str(empty_bin), DDTREE_BUILD_DIR=str(tmp_path / "build"))
    assert result.returncode != 0
    assert "ExtensionBuildError: ninja" in result.stderr and "pip install ninja" in result.stderr


def test_compile_failure_shows_the_compiler_output_tail(tmp_path, monkeypatch):
    output = "\n".join(f"compiler line {i}" for i in range(100))

    def failing_build(*args, **kwargs):
        raise RuntimeError(f"Error building extension 'ddtree_ops': {output}")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", failing_build)
    plan = kernels.make_plan()
    with pytest.raises(ExtensionBuildError) as err:
        kernels._build_and_load(plan)
    message = str(err.value)
    assert str(plan.build_dir) in message and "compiler line 99" in message and "compiler line 70" in message
    assert "compiler line 69\n" not in message


def test_missing_nvcc_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", None)
    with pytest.raises(ExtensionBuildError, match="nvcc is missing.*CUDA_HOME"):
        kernels._check_toolchain(with_cuda=True)


@pytest.mark.parametrize(
    "capability, flags",
    [((9, 0), ["compute_90a,code=sm_90a", "-DDDTREE_SM90A"]), ((8, 6), ["compute_86,code=sm_86"])],
)
def test_cuda_arch_follows_the_gpu_when_the_list_is_unset(monkeypatch, capability, flags):
    monkeypatch.delenv("TORCH_CUDA_ARCH_LIST", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: capability)
    expected = [flag if flag.startswith("-D") else f"-gencode=arch={flag}" for flag in flags]
    assert kernels._cuda_arch_flags() == expected
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "native")
    assert kernels._cuda_arch_flags() == expected


@pytest.mark.parametrize(
    "listed, expected",
    [
        ("9.0", ["-gencode=arch=compute_90a,code=sm_90a", "-DDDTREE_SM90A"]),  # wgmma needs the 'a' target
        ("9.0a", ["-gencode=arch=compute_90a,code=sm_90a", "-DDDTREE_SM90A"]),
        ("8.0;8.6+PTX", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_86,code=sm_86",
                         "-gencode=arch=compute_86,code=compute_86"]),
        ("8.0 9.0", ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90a,code=sm_90a",
                     "-DDDTREE_SM90A"]),
    ],
)
def test_cuda_arch_list_is_turned_into_our_flags(monkeypatch, listed, expected):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", listed)
    flags = kernels._cuda_arch_flags()
    assert flags == expected
    # torch adds no arch flags of its own once ours are there
    assert torch.utils.cpp_extension._get_cuda_arch_flags(flags) == []


def test_named_arch_list_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")
    with pytest.raises(ExtensionBuildError, match="'Hopper' is not a compute capability.*TORCH_CUDA_ARCH_LIST=9.0"):
        kernels._cuda_arch_flags()


def test_build_dir_names_torch_device_and_sources(monkeypatch, tmp_path):
    monkeypatch.delenv("DDTREE_BUILD_DIR", raising=False)
    plan = kernels.make_plan()
    assert plan.build_dir.parent == Path.home() / ".cache" / "ddtree-studio" / "build"
    assert re.fullmatch(rf"{re.escape(torch.__version__)}-(cpu|cuda)-[0-9a-f]{{12}}", plan.build_dir.name)
    assert {p.name for p in plan.sources} >= {"ops.cpp", "tree_build.cpp", "verify_attn.cpp", "tree_accept.cpp"}
    monkeypatch.setenv("DDTREE_BUILD_DIR", str(tmp_path))
    assert kernels.make_plan().build_dir == tmp_path


def test_bad_lock_timeout_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("DDTREE_BUILD_LOCK_TIMEOUT", "ten")
    with pytest.raises(ExtensionBuildError, match="DDTREE_BUILD_LOCK_TIMEOUT must be a number of seconds, got 'ten'"):
        kernels._lock_timeout_s()


def test_error_path_probe_passes_on_the_built_library():
    library = Path(kernels.build_info()["library"])
    record = library.with_name(library.name + ".verified")
    record.unlink(missing_ok=True)
    kernels.check_error_path(library)
    assert json.loads(record.read_text()) == {"size": library.stat().st_size,
                                              "sha256": hashlib.sha256(library.read_bytes()).hexdigest()}


def test_error_path_probe_names_the_fix_when_errors_crash(tmp_path):
    broken = tmp_path / "ddtree_ops.so"
    broken.write_bytes(b"not a shared library")
    with pytest.raises(kernels.ExtensionBuildError, match=r"CXX=/usr/bin/g\+\+"):
        kernels.check_error_path(broken)
    assert not (tmp_path / "ddtree_ops.so.verified").exists()
