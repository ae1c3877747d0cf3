"""The five exports of a set of runs (AR, then chain and/or DDTree): render one to bytes, or write them all
into a directory.

write_all checks everything before it writes anything (all five render, the directory is usable, no file
would be overwritten without force) and writes each file atomically (a temporary file renamed into place),
so a failed call leaves existing files as they were.
"""
from __future__ import annotations

import os
import pathlib
import uuid
from collections.abc import Callable
from types import ModuleType

from engine.records import RunRecord

from . import export_csv, export_json, export_trace
from .capture_data import Capture


class ReportError(ValueError):
    """The reports cannot be written where asked."""


def html_exporter() -> ModuleType:
    """profiling.export_html, imported on first use: it needs plotly, which the engine itself does not (the
    GPU machine runs the engine without it)."""
    try:
        from . import export_html
    except ImportError as exc:
        raise ReportError(f"report.html needs plotly ({exc}): pip install plotly, or write the reports on a "
                          "machine that has it") from exc
    return export_html


Runs = dict[str, RunRecord]  # AR first, then the speculative runs (decode_runs)
Renderer = Callable[[Runs, Capture | None], bytes]
FORMATS: dict[str, Renderer] = {
    "report.html": lambda runs, capture: html_exporter().render(runs, capture),
    "report.json": export_json.render,
    "kernels.csv": export_csv.render_kernels,
    "steps.csv": lambda runs, capture: export_csv.render_steps(runs),
    "trace.json": export_trace.render,
}


def render(runs: Runs, fmt: str, capture: Capture | None = None) -> bytes:
    """One export as bytes; fmt is its file name (one of FORMATS)."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}: expected one of {sorted(FORMATS)}")
    return FORMATS[fmt](runs, capture)


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
    existing = [name for name in FORMATS if (out_dir / name).exists()]
    if existing and not force:
        raise ReportError(f"{out_dir} already holds {', '.join(existing)}: pass --force to overwrite them, or pick "
                          "another directory")


def write_atomic(path: pathlib.Path, data: bytes) -> None:
    """Write a uniquely named sibling (created like any file, so the umask applies) and rename it over path."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_all(runs: Runs, out_dir: str | os.PathLike, force: bool = False,
              capture: Capture | None = None) -> list[pathlib.Path]:
    """Write all five exports into out_dir (created if missing); returns their paths."""
    out = pathlib.Path(out_dir)
    check_out_dir(out, force)
    blobs = {name: render(runs, name, capture) for name in FORMATS}
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, data in blobs.items():
        write_atomic(out / name, data)
        paths.append(out / name)
    return paths
