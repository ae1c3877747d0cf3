"""The report set under a hostile schedule: a writer SIGKILLed at each point of write_all leaves the directory
holding the old set or the new one, whole; the next writer removes what the killed one left; a directory that
holds other files, or a set without --force, is refused with nothing changed."""
from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys

import pytest
from fake_records import fake_runs

from cli.__main__ import main
from profiling import report
from profiling.measurement import Measurement

ROOT = pathlib.Path(__file__).parents[1]
TINY = ROOT / "models" / "model_tiny.kdtr"
SEED = 7
WRITER = f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]
from fake_records import fake_runs
from profiling import report
from profiling.measurement import Measurement
report.write_all(Measurement.of(fake_runs({SEED})), sys.argv[1], force=True)
"""
POINTS = [f"wrote {name}" for name in report.FORMATS] + ["written", "swapped"]


def snapshot(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in directory.iterdir()}


def old_set(directory: pathlib.Path) -> dict[str, bytes]:
    directory.mkdir()
    for name in report.FORMATS:
        (directory / name).write_bytes(f"old {name}".encode())
    return snapshot(directory)


def is_new_set(files: dict[str, bytes]) -> bool:
    measurement = Measurement.of(fake_runs(SEED))
    return sorted(files) == sorted(report.FORMATS) and all(
        files[name] == report.render(measurement, name) for name in report.FORMATS if name != "report.html")


@pytest.mark.parametrize("point", POINTS)
def test_a_writer_killed_at_any_point_leaves_one_whole_set(tmp_path, point):
    out = tmp_path / "reports"
    before = old_set(out)
    env = {**os.environ, report.KILL_AT_ENV: point}
    done = subprocess.run([sys.executable, "-c", WRITER, str(out)], env=env, capture_output=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    after = snapshot(out)
    if point == "swapped":
        assert is_new_set(after)
    else:
        assert after == before
    assert len(list(tmp_path.iterdir())) > 1, "the killed writer left its temporaries (and lock) beside the set"

    report.write_all(Measurement.of(fake_runs(SEED)), out, force=True)  # the next writer cleans them up
    assert is_new_set(snapshot(out))
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]


def test_stale_temporaries_of_the_old_writer_are_cleaned(tmp_path):
    out = tmp_path / "reports"
    old_set(out)
    (out / ".report.json.4242.0123abcd.tmp").write_text("half")
    (out / ".kernels.csv.4242.0123abcd.old").write_text("old")
    (tmp_path / ".reports.new-4242-ff").mkdir()
    (tmp_path / ".reports.new-4242-ff" / "report.json").write_text("half")
    report.write_all(Measurement.of(fake_runs(SEED)), out, force=True)
    assert is_new_set(snapshot(out))
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]


def test_a_set_left_only_as_the_old_directory_is_put_back(tmp_path):
    """Killed between the two renames of a filesystem without the exchange: the old set is restored, and as it
    is a set, a writer without force is then refused."""
    out = tmp_path / "reports"
    before = old_set(tmp_path / ".reports.old-4242-ff")
    with pytest.raises(report.ReportError, match="--force"):
        report.write_all(Measurement.of(fake_runs(SEED)), out)
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]


def test_a_folder_with_other_files_is_refused(tmp_path):
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(report.ReportError, match="notes.txt, which are not part of a report set"):
        report.write_all(Measurement.of(fake_runs(SEED)), out, force=True)
    assert snapshot(out) == {"notes.txt": b"mine"}
    assert [p.name for p in tmp_path.iterdir()] == ["project"]


def test_a_second_run_into_a_report_directory_needs_force(tmp_path, capsys):
    out = tmp_path / "reports"
    argv = ["run", "--fixture", str(TINY), "--max-new", "3", "--report", str(out)]
    assert main(argv) == 0
    first = snapshot(out)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already holds" in err and "--force" in err
    assert snapshot(out) == first
    assert main([*argv, "--force"]) == 0
    assert sorted(snapshot(out)) == sorted(report.FORMATS)
