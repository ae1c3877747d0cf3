"""The copy bandwidth every bytes floor divides by: a device-to-device copy, (bytes read + bytes written) / time,
measured in the same process as the numbers it is set against (once per device and dtype: functools.cache). The
benchmarks' roofline ceiling (benchmarks/common.py) and the studio's stage floors (profiling/stage_floor.py) both
measure it here."""
from __future__ import annotations

import functools
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

STUDIO_COPY_BYTES = {"cuda": 2**28, "cpu": 2**26}  # well past the largest L2 (60 MB), small beside a loaded model
STUDIO_REPS = 10


@dataclass(frozen=True, slots=True)
class Bandwidth:
    """A measured copy: median (read + written) bytes per second over num_reps copies of copy_bytes."""

    bytes_per_s: float
    device: str
    dtype: str
    copy_bytes: int
    num_reps: int

    @property
    def tbps(self) -> float:
        return self.bytes_per_s / 1e12

    def floor_ms(self, num_bytes: float) -> float:
        """The time `num_bytes` of reads take at this bandwidth."""
        return num_bytes / self.bytes_per_s * 1e3

    def text(self) -> str:
        return (f"copy {self.tbps * 1e3:.1f} GB/s (read + written, {self.device} {self.dtype}, "
                f"{self.copy_bytes / 2**20:.0f} MiB, median of {self.num_reps})")

    def to_dict(self) -> dict:
        return asdict(self)


def _copy_seconds(dst: torch.Tensor, src: torch.Tensor) -> float:
    if dst.device.type != "cuda":
        start = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - start
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    dst.copy_(src)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def measure_copy(device: str | torch.device, dtype: torch.dtype, copy_bytes: int, num_reps: int,
                 warmup: int = 2) -> Bandwidth:
    """Copy a copy_bytes buffer num_reps times after `warmup` copies (CUDA events on a GPU, perf_counter on the
    CPU); the median copy's 2 * copy_bytes / time."""
    if num_reps < 1 or copy_bytes < dtype.itemsize:
        raise ValueError(f"measure_copy: num_reps={num_reps}, copy_bytes={copy_bytes}: expected >= 1 and >= one "
                         "element")
    device = torch.device(device)
    src = torch.randn(copy_bytes // dtype.itemsize, device=device).to(dtype)
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    seconds = float(np.median([_copy_seconds(dst, src) for _ in range(num_reps)]))
    del src, dst
    return Bandwidth(2 * copy_bytes / seconds, device.type, str(dtype).removeprefix("torch."), copy_bytes, num_reps)


@functools.cache
def copy_bandwidth(device: str, dtype: str) -> Bandwidth:
    """This process's copy bandwidth on `device` ("cpu", "cuda") in `dtype` ("float32", "bfloat16"), measured once."""
    kind = torch.device(device).type
    if kind not in STUDIO_COPY_BYTES:
        raise ValueError(f"copy_bandwidth: device {device!r}: expected cpu or cuda")
    return measure_copy(device, getattr(torch, dtype), STUDIO_COPY_BYTES[kind], STUDIO_REPS)


def bandwidth_here(device: str, dtype: str) -> Bandwidth | None:
    """copy_bandwidth on `device` when this process has one (a recording made on a GPU opened where none is: None)."""
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        return None
    return copy_bandwidth(device, dtype)
