"""Shared fixtures: the committed tiny model, the tiny training recipe's target (trained once per session), the
committed H200 profile report unpacked, each CPU instruction set and the thread count for the CPU kernels' tests,
and the network guard that fails any test (or any process it starts)
reaching beyond this machine (netguard/)."""
from __future__ import annotations

import contextlib
import io
import os
import pathlib
import shutil
import sys
import sysconfig
import tarfile

import pytest

NETGUARD = pathlib.Path(__file__).parent / "netguard"
sys.path.insert(0, str(NETGUARD))
import offline_guard  # noqa: E402 - found on the path just set

os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(NETGUARD), os.environ.get("PYTHONPATH")) if p)
offline_guard.install()


def pytest_collection_modifyitems(config, items):
    """A test skipped where torch sees no GPU is a CUDA test: it gets the cuda marker, which gpu-check selects by
    (cli/gpu_check.py), whether or not its file marked it too."""
    for item in items:
        if any("CUDA GPU" in str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.cuda)


@pytest.fixture(scope="session")
def netguard_log(tmp_path_factory) -> pathlib.Path:
    log = tmp_path_factory.mktemp("netguard") / "refused.log"
    log.touch()
    os.environ[offline_guard.LOG_ENV] = str(log)
    return log


@pytest.fixture(autouse=True)
def no_network_beyond_this_machine(netguard_log):
    """Fails the test during which this process or any it started tried to reach another machine."""
    before = netguard_log.stat().st_size
    yield
    grown = netguard_log.read_text()[before:]
    if grown:
        pytest.fail(f"a connection beyond this machine was attempted (and refused):\n{grown[:3000]}")

TINY_FIXTURE = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"


H200_REPORT_ARCHIVE = pathlib.Path(__file__).parents[1] / "benchmarks" / "reports" / "h200-tiny-fixture.tar.xz"


@pytest.fixture(scope="session")
def h200_report_dir(tmp_path_factory) -> pathlib.Path:
    """The committed H200 profile report (report.json, the CSVs, trace.json, report.html), unpacked from its
    archive into a temporary folder."""
    out = tmp_path_factory.mktemp("h200-report")
    with tarfile.open(H200_REPORT_ARCHIVE) as archive:
        archive.extractall(out, filter="data")
    return out / "h200-tiny-fixture"


@pytest.fixture(scope="session")
def tiny_checkpoint():
    from engine.loaders.kdtr import read_kdtr

    return read_kdtr(TINY_FIXTURE)


@pytest.fixture(scope="session")
def tiny_target_run(tmp_path_factory):
    """`train-target --preset tiny` on this CPU, as shipped: the real corpus, BPE training included. Returns the
    run directory and what the command printed on stderr."""
    from cli.__main__ import main

    out = tmp_path_factory.mktemp("tiny-target") / "run"
    err = io.StringIO()  # a session-scoped fixture cannot take capsys
    with contextlib.redirect_stderr(err):
        code = main(["train-target", "--out", str(out), "--preset", "tiny", "--device", "cpu"])
    assert code == 0, err.getvalue()
    return out, err.getvalue()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory):
    """Forty standard-library files: enough for a few steps, quick to tokenize."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    folder = tmp_path_factory.mktemp("corpus")
    for path in sorted(root.glob("[a-m]*.py"))[:40]:
        shutil.copy(path, folder / path.name)
    return folder


@pytest.fixture(params=["avx512", "avx2", "generic"])
def isa(request, monkeypatch):
    """Runs the test with DDTREE_CPU_ISA set to each instruction set; skips those this CPU lacks."""
    import torch

    from kernels import ops

    monkeypatch.setenv("DDTREE_CPU_ISA", request.param)
    try:
        ops.tree_build(torch.zeros(1, 1), torch.tensor(0), 1)
    except RuntimeError as e:
        if "lacks it" not in str(e):
            raise
        pytest.skip(f"this CPU lacks {request.param}")
    return request.param


@pytest.fixture
def threads():
    """Restores torch's thread count after a test that changes it."""
    import torch

    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)
