"""The five exports of a Measurement (profiling/measurement.py: the runs, AR then chain and/or DDTree, and what is
known about them): render one to bytes, or write them all into a directory.

write_all checks everything before it writes anything (all five render, the directory is usable and holds
nothing but a report set, no set is replaced without force), then writes the set whole or not at all: into a
fresh hidden sibling directory (.DIR.new-*), swapped with DIR by one rename (renameat2 RENAME_EXCHANGE: both
names always hold a whole set), the old set then deleted. It all runs under a lock beside DIR (.DIR.lock,
flock: released by the kernel when a writer dies), which also deletes the temporaries of a writer killed
earlier. A failure at any point (a full disk midway, a rename that fails, kill -9) leaves DIR holding either the
old set or the new one, whole.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import os
import pathlib
import re
import shutil
import signal
import stat
import uuid
from collections.abc import Callable, Iterator
from types import ModuleType

from profiling import export_csv, export_json, export_trace
from profiling.measurement import Measurement


class ReportError(ValueError):
    """The reports cannot be written where asked."""


def html_exporter() -> ModuleType:
    """profiling.export_html, imported on first use: it needs plotly, which the engine itself does not (the
    GPU machine runs the engine without it)."""
    try:
        from profiling import export_html
    except ImportError as exc:
        raise ReportError(f"report.html needs plotly ({exc}): pip install plotly, or write the reports on a "
                          "machine that has it") from exc
    return export_html


FORMATS: dict[str, Callable[[Measurement], bytes]] = {
    "report.html": lambda data: html_exporter().render(data),
    "report.json": export_json.render,
    "kernels.csv": export_csv.render_kernels,
    "steps.csv": lambda data: export_csv.render_steps(data.runs),
    "trace.json": lambda data: export_trace.render(data.runs, data.capture, data.ranks),
}


def render(data: Measurement, fmt: str) -> bytes:
    """One export as bytes, of a live measurement or a recording (profiling.report_reader.Recording); fmt is its
    file name (one of FORMATS)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}: expected one of {sorted(FORMATS)}")
    return FORMATS[fmt](data)


STALE_INSIDE = re.compile(r"\.(" + "|".join(re.escape(n) for n in FORMATS) + r")\.\d+\.[0-9a-f]+\.(tmp|old)")
KILL_AT_ENV = "DDTREE_TEST_KILL_REPORT_AT"  # tests only: the writer SIGKILLs itself at this point of write_all


def check_out_dir(out_dir: pathlib.Path, force: bool) -> None:
    """out_dir can hold the exports: a directory (or one we can create) that holds a report set at most (no
    other file: the set is swapped in as a whole directory), none unless force, and every format can be
    rendered here."""
    html_exporter()
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"--report {out_dir} exists and is not a directory: pick a directory path")
    if not out_dir.exists():
        ancestor = next(p for p in out_dir.absolute().parents if p.exists())
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise ReportError(f"cannot create {out_dir}: {ancestor} is not a writable directory")
        return
    if not os.access(out_dir, os.W_OK | os.X_OK) or not os.access(out_dir.absolute().parent, os.W_OK | os.X_OK):
        raise ReportError(f"{out_dir} (or the folder above it) is not writable: pick another --report directory or "
                          "fix its permissions")
    blocking = [name for name in FORMATS if (out_dir / name).is_dir()]
    if blocking:
        raise ReportError(f"{out_dir / blocking[0]} is a directory, so the report cannot be written there: move it "
                          "away or pick another --report directory")
    others = sorted(p.name for p in out_dir.iterdir() if p.name not in FORMATS and not STALE_INSIDE.fullmatch(p.name))
    if others:
        raise ReportError(f"{out_dir} holds {', '.join(others[:5])}, which are not part of a report set; the set "
                          "replaces the whole directory, so pick a new or empty --report directory")
    existing = [name for name in FORMATS if (out_dir / name).exists()]
    if existing and not force:
        raise ReportError(f"{out_dir} already holds {', '.join(existing)}: pass --force to overwrite them, or pick "
                          "another directory")


def _sibling(path: pathlib.Path, kind: str) -> pathlib.Path:
    """A unique hidden name beside path (e.g. .report.json.1234.<hex>.tmp, .reports.new-1234-<hex>)."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex}")


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """One file written whole or not at all: a temporary sibling renamed over path."""
    tmp = _sibling(path, "tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _kill_point(point: str) -> None:
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


@contextlib.contextmanager
def _locked(out: pathlib.Path) -> Iterator[None]:
    """An exclusive flock on .DIR.lock beside out (waits for another writer); the file is removed on release."""
    path = out.with_name(f".{out.name}.lock")
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break  # not a file a releasing writer unlinked meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)


def _clean_stale(out: pathlib.Path) -> None:
    """Under the lock: the temporaries of writers killed earlier. A set left only as .DIR.old-* (killed between
    the two renames where the filesystem cannot exchange) is put back first."""
    olds = sorted(out.parent.glob(f".{glob.escape(out.name)}.old-*"), key=lambda p: p.stat().st_mtime)
    if not out.exists() and olds:
        os.rename(olds.pop(), out)
    for stale in (*out.parent.glob(f".{glob.escape(out.name)}.new-*"), *olds):
        shutil.rmtree(stale, ignore_errors=True)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: pathlib.Path, b: pathlib.Path) -> None:
    """Swap two directories in one rename (Linux renameat2 RENAME_EXCHANGE); OSError where it is unsupported."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


def _swap_in(new: pathlib.Path, out: pathlib.Path) -> None:
    """new (a whole set) becomes out; the old set, if any, is deleted."""
    if not out.exists():
        os.rename(new, out)
        return
    try:
        _exchange(new, out)
        old = new
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        old = _sibling(out, "old")  # a filesystem without the exchange: two renames, undone by _clean_stale
        os.rename(out, old)
        os.rename(new, out)
    _kill_point("swapped")
    shutil.rmtree(old, ignore_errors=True)


def _write_set(new: pathlib.Path, blobs: dict[str, bytes]) -> None:
    for name, data in blobs.items():
        with open(new / name, "xb") as f:
            f.write(data)
        _kill_point(f"wrote {name}")


def write_all(data: Measurement, out_dir: str | os.PathLike, force: bool = False) -> list[pathlib.Path]:
    """Write all five exports of `data` into out_dir (created if missing), whole or not at all; returns their paths.
    A parallel run's trace.json shows one process per rank and run (Measurement.ranks)."""
    out = pathlib.Path(out_dir).absolute()
    check_out_dir(out, force)
    blobs = {name: render(data, name) for name in FORMATS}
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # DIR is created if missing, its parents too
        with _locked(out):
            _clean_stale(out)
            check_out_dir(out, force)  # again under the lock: another run may have written meanwhile
            new = _sibling(out, "new")
            new.mkdir()
            try:
                if out.exists():
                    os.chmod(new, stat.S_IMODE(out.stat().st_mode))
                _write_set(new, blobs)
                _kill_point("written")
                _swap_in(new, out)
            finally:
                shutil.rmtree(new, ignore_errors=True)
    except OSError as exc:
        raise ReportError(f"writing the reports into {out} failed ({exc.strerror or exc}): free space there or pick "
                          "another --report directory; the directory holds what it held before") from exc
    return [pathlib.Path(out_dir) / name for name in FORMATS]
