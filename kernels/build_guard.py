"""The build directory's guards: the builders' lock, and the record of a library that passed its check.

A build killed midway leaves torch's `<build_dir>/lock` behind and the next build would wait on it forever.
Builders here serialise on an flock of `<build_dir>/lock.owner` (the kernel releases it when its holder dies)
and write their pid into it, so whoever holds the flock knows no other builder is alive: a `lock` found then is
stale and removed at once. A builder holding the flock longer than DDTREE_BUILD_LOCK_TIMEOUT seconds (default
600) is an ExtensionBuildError naming the file and the pid.

A library that passed its check in a child process (check_error_path) is recorded by size and SHA-256 in
`<library>.verified`; one that does not match its record (truncated by a full disk or a killed copy: loading it
would be a SIGBUS) is deleted before the build, so ninja links it again. A build directory that cannot be
written (a read-only filesystem) is an ExtensionBuildError saying to set DDTREE_BUILD_DIR.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

_POLL_S = 0.2


class ExtensionBuildError(RuntimeError):
    """The op library could not be built or loaded; the message names the cause and the fix."""


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
    then crashes; a child process tries one error per build, and the library's record remembers that it passed."""
    record = _record(library)
    if record is not None and record == _read_record(library):
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
    try:
        _record_path(library).write_text(json.dumps(record))
    except OSError as e:
        raise _unwritable(library.parent, e) from e


def discard_unverified(library: Path) -> None:
    """Delete a library that is not the one its record describes (or has no record), so the build links it again:
    loading a truncated library is a SIGBUS, not an error. Call with the build lock held."""
    if not library.exists() or _record(library) == _read_record(library):
        return
    try:
        library.unlink()
        _record_path(library).unlink(missing_ok=True)
    except OSError as e:
        raise ExtensionBuildError(
            f"the op library {library} does not match its build record (truncated or changed since it was built) "
            f"and cannot be deleted ({e.strerror}): delete {library.parent} and load again"
        ) from e


def _record_path(library: Path) -> Path:
    return library.with_name(library.name + ".verified")


def _record(library: Path) -> dict | None:
    """{size, sha256} of the library as it is now; None when it is missing."""
    try:
        data = library.read_bytes()
    except FileNotFoundError:
        return None
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _read_record(library: Path) -> dict | None:
    try:
        record = json.loads(_record_path(library).read_text())
    except (OSError, ValueError):  # missing, unreadable or not JSON: no record
        return None
    return record if isinstance(record, dict) else None


def _unwritable(build_dir: Path, error: OSError) -> ExtensionBuildError:
    return ExtensionBuildError(
        f"cannot write in the build directory {build_dir} ({error.strerror}; a read-only filesystem?): set "
        "DDTREE_BUILD_DIR to a writable directory, where the library is built once and cached"
    )


@contextlib.contextmanager
def build_lock(build_dir: Path, timeout_s: float) -> Iterator[None]:
    """Hold the right to build in build_dir, clearing a stale torch `lock` first.

    Builders serialise on an flock of `lock.owner` (the kernel drops it when a process dies) and write their
    pid into it. Whoever holds the flock is the only builder alive, so torch's `lock`, if present, was left by a
    killed build and is removed. Waiting more than timeout_s for the flock raises ExtensionBuildError.
    """
    lock, owner = build_dir / "lock", build_dir / "lock.owner"
    deadline = time.monotonic() + timeout_s
    try:
        f = open(owner, "a+")
    except OSError as e:
        raise _unwritable(build_dir, e) from e
    with f:
        said = False
        while not _try_flock(f):
            if time.monotonic() > deadline:
                raise _held_error(lock, owner, _read_pid(owner), timeout_s)
            if not said:
                pid = _read_pid(owner)
                print(f"waiting for the ddtree op build in {build_dir}: {f'process {pid}' if pid else 'a builder'} "
                      f"holds {owner}", file=sys.stderr, flush=True)
                said = True
            time.sleep(_POLL_S)
        try:
            try:
                lock.unlink(missing_ok=True)  # no builder is alive but us: a lock here was left by a killed one
                f.truncate(0)
                f.write(str(os.getpid()))
                f.flush()
            except OSError as e:
                raise _unwritable(build_dir, e) from e
            yield
        finally:
            f.truncate(0)
            f.flush()
            fcntl.flock(f, fcntl.LOCK_UN)


def _held_error(lock: Path, owner: Path, pid: int | None, timeout_s: float) -> ExtensionBuildError:
    holder = f"process {pid}" if pid is not None else "a builder that left no pid"
    return ExtensionBuildError(
        f"the build lock {lock} has been held by {holder} (it holds {owner}) for more than {timeout_s:g} s; "
        f"wait for that build to finish, or stop that process and load again (DDTREE_BUILD_LOCK_TIMEOUT sets how "
        "long to wait)"
    )


def lock_holder(build_dir: Path) -> int | None:
    """The pid of the live process holding build_dir's builders' lock (None: none), for a page that says who builds."""
    pid = _read_pid(build_dir / "lock.owner")
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:  # killed while building: its pid stays in the file, its flock is gone
        return None
    except PermissionError:  # alive, another user's
        pass
    return pid


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


