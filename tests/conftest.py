"""Shared fixtures: the committed tiny model."""
from __future__ import annotations

import pathlib

import pytest

REFS = pathlib.Path(__file__).parent / "refs"
TINY_FIXTURE = REFS / "model_tiny.kdtr"


@pytest.fixture(scope="session")
def tiny_checkpoint():
    from engine.kdtr import read_kdtr

    return read_kdtr(TINY_FIXTURE)
