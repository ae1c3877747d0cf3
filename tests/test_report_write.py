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


def siblings(directory: pathlib.Path) -> list[str]:
    return sorted(p.name for p in directory.parent.iterdir())


@pytest.mark.parametrize("fails_at", range(len(report.FORMATS)))
def test_a_disk_that_fills_midway_leaves_the_old_set(tmp_path, pair, monkeypatch, fails_at):
    out = tmp_path / "reports"
    before = old_set(out)

    def fills_up(new, blobs):
        for name in list(blobs)[:fails_at]:
            (new / name).write_bytes(blobs[name])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(new / list(blobs)[fails_at]))

    monkeypatch.setattr(report, "_write_set", fills_up)
    with pytest.raises(report.ReportError, match=f"into {out} failed .No space left"):
        report.write_all(Measurement.of(pair), out, force=True)
    assert snapshot(out) == before
    assert siblings(out) == ["reports"], "no temporary directory or lock left beside it"


def test_a_swap_that_fails_leaves_the_old_set(tmp_path, pair, monkeypatch):
    out = tmp_path / "reports"
    before = old_set(out)

    def fails(a, b):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(b))

    monkeypatch.setattr(report, "_exchange", fails)
    with pytest.raises(report.ReportError, match="Input/output error"):
        report.write_all(Measurement.of(pair), out, force=True)
    assert snapshot(out) == before
    assert siblings(out) == ["reports"]


def test_without_the_exchange_two_renames_replace_the_set(tmp_path, pair, monkeypatch):
    out = tmp_path / "reports"
    old_set(out)

    def unsupported(a, b):
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), str(b))

    monkeypatch.setattr(report, "_exchange", unsupported)
    report.write_all(Measurement.of(pair), out, force=True)
    assert snapshot(out)["steps.csv"] == report.render(Measurement.of(pair), "steps.csv")
    assert siblings(out) == ["reports"]


def test_a_failed_write_into_a_new_directory_leaves_no_directory(tmp_path, pair, monkeypatch):
    def full(new, blobs):
        raise OSError(errno.ENOSPC, "full")

    monkeypatch.setattr(report, "_write_set", full)
    with pytest.raises(report.ReportError):
        report.write_all(Measurement.of(pair), tmp_path / "new")
    assert list(tmp_path.iterdir()) == []


def test_a_successful_write_replaces_the_set_and_leaves_nothing_else(tmp_path, pair):
    out = tmp_path / "reports"
    old = old_set(out)
    paths = report.write_all(Measurement.of(pair), out, force=True)
    now = snapshot(out)
    assert sorted(now) == sorted(p.name for p in paths) == sorted(report.FORMATS)
    assert all(now[name] != old[name] for name in now)
    for name in now.keys() - {"report.html"}:  # plotly gives each render of the page new element ids
        assert now[name] == report.render(Measurement.of(pair), name), name
    assert siblings(out) == ["reports"]
