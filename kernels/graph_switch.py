"""A switch inside a CUDA graph, picked on the device (csrc/cuda/graph_switch.cuh): the captured graph runs one of
several branches, chosen by a 0-dim int64 tensor that earlier work of the same graph wrote, with no read back to the
host. The auto budget's drafted step uses it to verify the truncation it chose in the same graph as its draft.

Each branch is captured once, in order, on a side stream into its body graph; the tensors it returns live in the
parent graph's pool, like every tensor the capture allocates. A value of `index` outside [0, len(branches)) runs no
branch. Needs CUDA 12.8 or newer (conditional switch nodes)."""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

import kernels


@functools.cache
def side_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream branches are captured on, one per device. Warmed up with a matrix product in each dtype the engine
    runs, so that cuBLAS's per-stream workspace is allocated here, outside any capture."""
    stream = torch.cuda.Stream(device)
    with torch.cuda.stream(stream):
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.ones(16, 16, device=device, dtype=dtype)
            a @ a
    stream.synchronize()
    return stream


def graph_switch(index: torch.Tensor, branches: Sequence[Callable[[], object]], pool: tuple[int, int],
                 stream: torch.cuda.Stream) -> list:
    """Inside a capture (torch.cuda.graph(graph, pool=pool)): a switch node that runs branches[int(index)] on every
    replay, after the work captured so far and before what is captured next; the branches are captured on `stream`
    (side_stream(device), made before the capture). Returns each branch's outputs."""
    kernels.load()
    ops = torch.ops.ddtree
    switch_id = ops.graph_switch_begin(index, len(branches), *pool)
    outputs = []
    try:
        for i, branch in enumerate(branches):
            with torch.cuda.stream(stream):
                ops.graph_branch_begin(index, switch_id, i)
                try:
                    outputs.append(branch())
                finally:
                    ops.graph_branch_end(index, switch_id)
    finally:
        ops.graph_switch_end(index, switch_id)
    return outputs
