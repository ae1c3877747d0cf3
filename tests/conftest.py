"""Shared fixtures: the committed tiny model, and the tiny training recipe's target (trained once per session)."""
from __future__ import annotations

import contextlib
import io
import pathlib

import pytest

TINY_FIXTURE = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"


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
