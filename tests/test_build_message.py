"""While the kernels build, whoever waits says who holds the builders' lock: the dashboard's message and the CLI's
stderr (`run`, `verify`) name the pid in the build directory's lock.owner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ui import kernel_status

ROOT = Path(__file__).resolve().parent.parent
_HOLD_FLOCK = """
import fcntl, os, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.truncate(0); f.write(str(os.getpid())); f.flush()
print("holding", flush=True)
time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path, monkeypatch):
    """A live process holding tmp_path's builders' lock, as a builder does; DDTREE_BUILD_DIR names tmp_path."""
    monkeypatch.setenv("DDTREE_BUILD_DIR", str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", _HOLD_FLOCK, str(tmp_path / "lock.owner")], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "holding"
    yield proc.pid
    proc.kill()
    proc.wait()


def test_the_dashboards_build_message_names_the_process_holding_the_lock(holder, tmp_path):
    text = kernel_status.message(3.0)
    assert f"waiting for process {holder}, which holds the build lock" in text
    assert str(tmp_path) in text and "Running for 3 s" in text


def test_the_dashboards_build_message_names_this_server_or_says_it_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_BUILD_DIR", str(tmp_path))
    assert "loading them" in kernel_status.message(0.0)
    (tmp_path / "lock.owner").write_text(str(os.getpid()))
    assert f"this server (process {os.getpid()}) holds the build lock" in kernel_status.message(0.0)


@pytest.mark.parametrize("command", [["verify", "--fixture", "models/model_tiny.kdtr"],
                                     ["run", "--model", "models/model_tiny.kdtr", "--max-new-tokens", "4"]])
def test_run_and_verify_say_on_stderr_who_holds_the_build_lock(holder, tmp_path, command):
    result = subprocess.run([sys.executable, "-m", "cli", *command], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "DDTREE_BUILD_LOCK_TIMEOUT": "1"}, check=False)
    assert f"waiting for the ddtree op build in {tmp_path}: process {holder} holds" in result.stderr, result.stderr
    assert result.returncode != 0 and f"held by process {holder}" in result.stderr
