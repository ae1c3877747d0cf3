"""The studio works offline: the network guard refuses what would leave the machine, and the dashboard's server
starts as the README says (`streamlit run app.py`, headless, no address given) without reaching out."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import offline_guard
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("host", ["192.0.2.1", "8.8.8.8", "2001:db8::1", "example.com"])
def test_the_guard_refuses_and_logs_what_leaves_the_machine(host, tmp_path, monkeypatch):
    log = tmp_path / "refused.log"
    monkeypatch.setenv(offline_guard.LOG_ENV, str(log))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s, pytest.raises(OSError, match="no network beyond"):
        if host == "example.com":
            socket.getaddrinfo(host, 80)
        else:
            s.connect((host, 80))
    assert host in log.read_text()


def test_the_guard_lets_loopback_through(tmp_path, monkeypatch):
    log = tmp_path / "refused.log"
    monkeypatch.setenv(offline_guard.LOG_ENV, str(log))
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass
    assert socket.getaddrinfo("localhost", 80) and socket.getaddrinfo("0.0.0.0", 80)
    assert not log.exists()


def test_a_subprocess_is_guarded_too(tmp_path, monkeypatch):
    log = tmp_path / "refused.log"
    monkeypatch.setenv(offline_guard.LOG_ENV, str(log))
    code = "import socket\ntry:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\nexcept OSError as e:\n" \
           "    print(e)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "no network beyond this machine" in out.stdout, out.stderr
    assert "192.0.2.1" in log.read_text()


def test_the_dashboard_server_starts_without_reaching_out(tmp_path):
    """`streamlit run app.py` as a user starts it (headless on a server): Streamlit looks up this machine's
    external address unless browser.serverAddress is set (.streamlit/config.toml sets it); the guard in the server
    process would log that lookup, and this test's guard check fails on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true",
                                 "--server.port", str(port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env=os.environ | {"STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    assert r.read() == b"ok"
                    break
            except OSError:
                assert proc.poll() is None, log.read_text()[-2000:]
                assert time.monotonic() < deadline, "the server did not come up:\n" + log.read_text()[-2000:]
                time.sleep(0.5)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert b"<div id=\"root\">" in r.read() or r.status == 200
        time.sleep(1.0)  # the start-up message (and any address lookup) follows the first health answer
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    printed = log.read_text()
    assert "External URL" not in printed and "Did not auto detect external IP" not in printed, printed
