"""The weights of a Hugging Face directory, read tensor by tensor straight to the target device and dtype.

Each tensor's bytes are read from its shard into a host buffer of exactly its size and moved to the device in
the dtype they are stored in; there they become the run's dtype. A bfloat16 checkpoint thus crosses to the GPU
at two bytes per number and stays as it is in a bfloat16 run; no float32 copy of the model is made on the host.
FP8 weights (F8_E4M3, with one float32 <name>_scale_inv per block, DeepSeek-V3 / Kimi-K2) are dequantized on the
device as they arrive, weight * scale_inv in float32, then cast to the run's dtype. The host holds one tensor
(and its scale) at a time, so a load's peak RSS stays near the largest tensor.

The shards are read with plain reads, not the safetensors library's memory map (safe_open): a mapped shard keeps
every page the loader touched resident until the file closes (RSS grows to the shard, about 4 GB in DeepSeek-V3),
reopening a shard per tensor re-parses its header (1.4 ms for 1,500 tensors: minutes over DeepSeek-V3's more
than 90,000), and a file truncated while mapped is a SIGBUS that kills the process where a read is an HFLoadError.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from engine.config import ModelConfig
from engine.loaders.fp8_blocks import dequantize_fp8
from engine.loaders.hf_config import HFLoadError
from engine.loaders.hf_layout import Shard
from engine.loaders.hf_plan import Read
from engine.loaders.safetensors_file import TensorEntry, read_exactly

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                "F8_E4M3": torch.float8_e4m3fn}


class HFWeights:
    """A WeightSource over a checked plan of reads (engine.loaders.hf_plan)."""

    def __init__(self, cfg: ModelConfig, reads: list[Read], names: list[str], block: tuple[int, int] | None) -> None:
        self.cfg, self.reads, self.block = cfg, reads, block
        self._names = names

    def names(self) -> list[str]:
        return list(self._names)

    def tensors(self, device: str | torch.device, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        with contextlib.ExitStack() as stack:
            files: dict[Path, BinaryIO] = {}

            def host(shard: Shard, entry: TensorEntry) -> torch.Tensor:
                if shard.path not in files:
                    files[shard.path] = _open_unchanged(shard, stack)
                return _read_host(files[shard.path], shard, entry)

            for read in self.reads:
                tensor = host(read.shard, read.entry).to(device)  # in its stored dtype
                if read.scale is not None:
                    tensor = dequantize_fp8(tensor, host(*read.scale).to(device), self.block)
                tensor = tensor.to(dtype)
                for name, index in read.pieces(self.cfg):
                    yield name, tensor[index]
                del tensor  # before the next read: the host then holds one tensor at a time

    def numpy(self) -> dict[str, np.ndarray]:
        arrays = {name: tensor.numpy() for name, tensor in self.tensors("cpu", torch.float32)}
        return {name: arrays[name] for name in self._names}


def _open_unchanged(shard: Shard, stack: contextlib.ExitStack) -> BinaryIO:
    try:
        f = stack.enter_context(open(shard.path, "rb", buffering=0))  # unbuffered: reads land in the tensor
        stat = os.fstat(f.fileno())
    except OSError as exc:
        raise HFLoadError(f"{shard.path}: cannot read: {exc}") from exc
    if (stat.st_size, stat.st_mtime_ns) != (shard.size, shard.mtime_ns):
        raise HFLoadError(f"{shard.path}: the file changed after the checkpoint was checked; load the model again")
    return f


def _read_host(f: BinaryIO, shard: Shard, entry: TensorEntry) -> torch.Tensor:
    buffer = torch.empty(entry.nbytes, dtype=torch.uint8)
    try:
        read_exactly(f, shard.header.data_start + entry.begin, memoryview(buffer.numpy()), str(shard.path),
                     HFLoadError)
    except OSError as exc:
        raise HFLoadError(f"{shard.path}: cannot read: {exc}") from exc
    return buffer.view(TORCH_DTYPES[entry.dtype]).view(entry.shape)  # safetensors is little-endian, as are we
