"""The five reports are written all or none: a target that is a directory, a write that fails midway or a rename
that fails leaves the old set exactly as it was, with nothing stray beside it."""
from __future__ import annotations

import errno
import os
import pathlib
import random

import pytest
from fake_records import fake_runs

from cli.__main__ import main
from profiling import report
from profiling.measurement import Measurement

TINY = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"


def old_set(directory: pathlib.Path) -> dict[str, bytes]:
    directory.mkdir(exist_ok=True)
    for name in report.FORMATS:
        (directory / name).write_bytes(f"old {name} {random.random()}".encode())
    return snapshot(directory)


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    """Every entry of the directory: a file's bytes, or "<dir>" for a directory."""
    return {p.name: b"<dir>" if p.is_dir() else p.read_bytes() for p in directory.iterdir()}


@pytest.fixture
def pair():
    return fake_runs(random.randrange(2**31))


def test_a_target_that_is_a_directory_stops_the_run_before_anything_is_written(tmp_path, capsys):
    before = old_set(tmp_path / "d")
    (tmp_path / "d" / "report.json").unlink()
    (tmp_path / "d" / "report.json").mkdir()
    before = snapshot(tmp_path / "d")
    args = ["run", "--fixture", str(TINY), "--max-new", "3", "--report", str(tmp_path / "d"), "--force"]
    assert main(args) == 2  # before decoding: the directory is checked first
    assert "report.json is a directory" in capsys.readouterr().err
    assert snapshot(tmp_path / "d") == before


def test_write_all_refuses_a_directory_target_and_changes_nothing(tmp_path, pair):
    before = old_set(tmp_path)
    (tmp_path / "kernels.csv").unlink()
    (tmp_path / "kernels.csv").mkdir()
    before = snapshot(tmp_path)
    with pytest.raises(report.ReportError, match="kernels.csv is a directory"):
        report.write_all(Measurement.of(pair), tmp_path, force=True)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fails_at", range(len(report.FORMATS)))
def test_a_disk_that_fills_midway_leaves_the_old_set(tmp_path, pair, monkeypatch, fails_at):
    before = old_set(tmp_path)
    real, calls = report._write_temp, []

    def fills_up(path, data):
        calls.append(path.name)
        if len(calls) > fails_at:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data)

    monkeypatch.setattr(report, "_write_temp", fills_up)
    with pytest.raises(OSError, match="No space left"):
        report.write_all(Measurement.of(pair), tmp_path, force=True)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fails_at", range(1, len(report.FORMATS)))
def test_a_rename_that_fails_after_others_puts_the_old_files_back(tmp_path, pair, monkeypatch, fails_at):
    before = old_set(tmp_path)
    (tmp_path / "trace.json").unlink()  # one target that did not exist: it must not exist afterwards either
    before.pop("trace.json")
    real, calls = os.replace, []

    def fails(src, dst):
        if str(src).endswith(".tmp"):
            calls.append(src)
            if len(calls) > fails_at:
                raise OSError(errno.EIO, os.strerror(errno.EIO), str(dst))
        return real(src, dst)

    monkeypatch.setattr(report.os, "replace", fails)
    with pytest.raises(OSError, match="Input/output error"):
        report.write_all(Measurement.of(pair), tmp_path, force=True)
    assert snapshot(tmp_path) == before


def test_a_failed_write_into_a_new_directory_leaves_no_directory(tmp_path, pair, monkeypatch):
    monkeypatch.setattr(report, "_write_temp", lambda path, data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "full")))
    with pytest.raises(OSError):
        report.write_all(Measurement.of(pair), tmp_path / "new")
    assert list(tmp_path.iterdir()) == []


def test_a_successful_write_replaces_the_set_and_leaves_nothing_else(tmp_path, pair):
    old = old_set(tmp_path)
    paths = report.write_all(Measurement.of(pair), tmp_path, force=True)
    now = snapshot(tmp_path)
    assert sorted(now) == sorted(p.name for p in paths) == sorted(report.FORMATS)
    assert all(now[name] != old[name] for name in now)
    for name in now.keys() - {"report.html"}:  # plotly gives each render of the page new element ids
        assert now[name] == report.render(Measurement.of(pair), name), name
