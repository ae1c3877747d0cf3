"""Process-wide resources built once and shared by every tab: the compiled kernels and the checkpoints.

st.cache_resource objects are shared by all users, so only immutable things live here; per-tab state lives
in st.session_state (ui/state.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import tempfile
import threading
import time

import streamlit as st

from engine.loaders.checkpoint import Checkpoint
from engine.loaders.kdtr import read_kdtr
from engine.loaders.loading import load_model
from engine.model.target import TargetModel


@dataclasses.dataclass(slots=True)
class KernelBuild:
    """The kernel build started in the background when the app starts (kernels.load() in a thread)."""

    thread: threading.Thread
    started: float  # time.monotonic()
    finished: float | None = None
    error: Exception | None = None

    @property
    def done(self) -> bool:
        return self.finished is not None

    @property
    def seconds(self) -> float:
        return (self.finished or time.monotonic()) - self.started


@st.cache_resource(show_spinner=False)
def kernel_build() -> KernelBuild:
    """Start building/loading the DDTree extension once per process, so that the first Step rarely waits."""
    import kernels

    def work() -> None:
        try:
            kernels.load()
        except Exception as exc:  # noqa: BLE001 - kept for load_kernels to raise where a decode needs them
            build.error = exc
        build.finished = time.monotonic()

    build = KernelBuild(threading.Thread(target=work, name="ddtree-kernel-build", daemon=True), time.monotonic())
    build.thread.start()
    return build


def load_kernels() -> None:
    """Wait for the background build, then load the extension (kernels.load() is cached and thread-safe; a failed
    build is tried again here and raises its ExtensionBuildError)."""
    import kernels

    kernel_build().thread.join()
    kernels.load()


def identity(path: str | pathlib.Path) -> str:
    """What a model on disk is, for the caches: its path, and the modification time and size of the file (of
    every file, for a directory). Replacing the file changes it."""
    path = pathlib.Path(path)
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    stats = [(str(f.relative_to(path)) if path.is_dir() else "", f.stat().st_mtime_ns, f.stat().st_size)
             for f in files]
    return f"{path.resolve()}:{hashlib.sha256(repr(stats).encode()).hexdigest()[:12]}"


@st.cache_resource(show_spinner="Loading the checkpoint...", max_entries=8)
def bundled_checkpoint(path: str, model_id: str) -> Checkpoint:
    """A shipped model, loaded once per identity (model_id, from identity(path))."""
    return load_model(path)


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
def target_model(model_id: str, _ckpt: Checkpoint, device: str, dtype: str) -> TargetModel:
    """The torch model of a checkpoint, keyed by the checkpoint's identity (identity() of a file or directory;
    an upload's content hash), never by its name alone: a replaced file loads again. Shared across tabs: a
    decoder keeps its own cache, the model itself is read-only."""
    load_kernels()
    return TargetModel.from_checkpoint(_ckpt, device, dtype)
