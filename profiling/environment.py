"""Where a report was produced: library versions, device and source revision."""
from __future__ import annotations

import pathlib
import platform
import subprocess

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent


def git_commit(root: pathlib.Path = REPO_ROOT) -> str | None:
    """`git rev-parse HEAD` of the source tree (None outside a repository or before the first commit)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_dirty(root: pathlib.Path = REPO_ROOT) -> bool | None:
    """Whether the source tree differs from HEAD (changed or new files that git does not ignore); None outside
    a repository. A run on a dirty tree measured code that no commit holds yet."""
    try:
        out = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip()) if out.returncode == 0 else None


def device_name(device: str) -> str:
    """The GPU's name for a CUDA run, else the host CPU's."""
    import torch  # this process's device: a recording read from a file brings its own environment

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine() or "cpu"


def environment(device: str) -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,  # None for a CPU-only build of torch
        "cuda_available": torch.cuda.is_available(),
        "device": device,
        "device_name": device_name(device),
        "git_commit": git_commit(),
        "git_dirty": git_dirty(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
