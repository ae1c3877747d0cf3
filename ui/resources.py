"""Process-wide resources built once and shared by every tab: the compiled kernels and the checkpoints.

st.cache_resource objects are shared by all users, so only immutable things live here; per-tab state lives
in st.session_state (ui/state.py).
"""
from __future__ import annotations

import dataclasses
import pathlib
import tempfile

import streamlit as st

from engine.checkpoint import Checkpoint
from engine.kdtr import read_kdtr
from engine.loading import load_model
from engine.model import TargetModel

FIXTURES_DIR = pathlib.Path(__file__).resolve().parent.parent / "tests" / "refs"


@st.cache_resource(show_spinner="Building the DDTree kernels (the first build takes about a minute)...")
def load_kernels() -> bool:
    """Build/load the extension once per process; kernels.load() itself is cached too, this adds the spinner."""
    import kernels

    kernels.load()
    return True


def bundled_models() -> dict[str, pathlib.Path]:
    """The fixtures shipped in tests/refs, by file name."""
    return {path.name: path for path in sorted(FIXTURES_DIR.glob("*.kdtr"))}


@st.cache_resource(show_spinner="Loading the checkpoint...")
def bundled_checkpoint(path: str) -> Checkpoint:
    return read_kdtr(path)


def read_upload(name: str, data: bytes) -> Checkpoint:
    """Validate an uploaded .kdtr with the CLI's loader; raises the loader's error (a ValueError) when bad, its
    message naming the uploaded file rather than the temporary copy the loader read."""
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "upload.kdtr"
        path.write_bytes(data)
        try:
            ckpt = read_kdtr(path)
        except ValueError as exc:
            raise type(exc)(str(exc).replace(str(path), name)) from exc
    return dataclasses.replace(ckpt, source=f"upload:{name}")


def load_path(path: str) -> Checkpoint:
    """A .kdtr file or a Hugging Face directory named by a path on this server."""
    return load_model(path)


@st.cache_resource(show_spinner="Loading the target model...", max_entries=8)
def target_model(model: str, _ckpt: Checkpoint, device: str, dtype: str) -> TargetModel:
    """The torch model of a checkpoint, keyed by its sidebar name (uploads carry a content hash in theirs).
    Shared across tabs: a decoder keeps its own cache, the model itself is read-only."""
    load_kernels()
    return TargetModel.from_checkpoint(_ckpt, device, dtype)
