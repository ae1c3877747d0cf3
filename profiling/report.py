"""The five exports of a Measurement (profiling/measurement.py: the runs, AR then chain and/or DDTree, and what is
known about them): render one to bytes, or write them all into a directory.

write_all checks everything before it writes anything (all five render, the directory is usable, no target is
a directory, no file would be overwritten without force), then writes the set all or nothing: every file to a
temporary name first, and only when all five are written are they renamed into place, each old file kept as
a hard-linked backup until the last rename succeeds. A failure at any point (a full disk midway, a rename that
fails) puts the old set back exactly as it was and leaves no temporary file behind.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import uuid
from collections.abc import Callable
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


def check_out_dir(out_dir: pathlib.Path, force: bool) -> None:
    """out_dir can hold the exports: a directory (or one we can create) with no export in it unless force,
    and every format can be rendered here."""
    html_exporter()
    if out_dir.exists() and not out_dir.is_dir():
        raise ReportError(f"--report {out_dir} exists and is not a directory: pick a directory path")
    if not out_dir.exists():
        ancestor = next(p for p in out_dir.absolute().parents if p.exists())
        if not ancestor.is_dir() or not os.access(ancestor, os.W_OK | os.X_OK):
            raise ReportError(f"cannot create {out_dir}: {ancestor} is not a writable directory")
        return
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ReportError(f"{out_dir} is not writable: pick another --report directory or fix its permissions")
    blocking = [name for name in FORMATS if (out_dir / name).is_dir()]
    if blocking:
        raise ReportError(f"{out_dir / blocking[0]} is a directory, so the report cannot be written there: move it "
                          "away or pick another --report directory")
    existing = [name for name in FORMATS if (out_dir / name).exists()]
    if existing and not force:
        raise ReportError(f"{out_dir} already holds {', '.join(existing)}: pass --force to overwrite them, or pick "
                          "another directory")


def _sibling(path: pathlib.Path, kind: str) -> pathlib.Path:
    """A unique hidden name beside path (e.g. .report.json.1234.<hex>.tmp)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.{kind}")


def _write_temp(path: pathlib.Path, data: bytes) -> pathlib.Path:
    """data in a new file beside path (created like any file, so the umask applies); returns its name."""
    tmp = _sibling(path, "tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """One file written whole or not at all: a temporary sibling renamed over path."""
    tmp = _write_temp(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _backup(path: pathlib.Path) -> pathlib.Path:
    """A second name for path's current content: a hard link (no copy, path stays in place), or a copy where
    the filesystem has no hard links."""
    backup = _sibling(path, "old")
    try:
        os.link(path, backup)
    except OSError:
        shutil.copy2(path, backup)
    return backup


def _replace_all(out: pathlib.Path, blobs: dict[str, bytes]) -> None:
    """Every blob into out/<name>, all or none: on any failure the old files are back and nothing is left over."""
    temps: dict[str, pathlib.Path] = {}
    backups: dict[str, pathlib.Path] = {}
    replaced: list[str] = []
    try:
        for name, data in blobs.items():
            temps[name] = _write_temp(out / name, data)
        for name in blobs:
            if (out / name).exists():
                backups[name] = _backup(out / name)
        for name, tmp in temps.items():
            os.replace(tmp, out / name)
            replaced.append(name)
    except BaseException:
        for name in reversed(replaced):
            if name in backups:
                os.replace(backups.pop(name), out / name)
            else:
                (out / name).unlink(missing_ok=True)
        raise
    finally:
        for leftover in (*temps.values(), *backups.values()):
            leftover.unlink(missing_ok=True)


def write_all(data: Measurement, out_dir: str | os.PathLike, force: bool = False) -> list[pathlib.Path]:
    """Write all five exports of `data` into out_dir (created if missing), all or none; returns their paths. A
    parallel run's trace.json shows one process per rank and run (Measurement.ranks)."""
    out = pathlib.Path(out_dir)
    check_out_dir(out, force)
    blobs = {name: render(data, name) for name in FORMATS}
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        _replace_all(out, blobs)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()
        raise
    return [out / name for name in FORMATS]
