"""A captured CUDA graph uploaded to its device when it is captured (cudaGraphUpload, the op library's graph_upload).

Left to itself, a graph uploads on its first replay, which then costs several replays: 12 ms for the auto budget's
drafted step on the shipped pair (a switch over one verify per bucket: eight verifies in one graph), four of its
steps, and 1.6 ms for a fixed budget's (H200). Uploaded at capture, its first replay costs what every replay costs,
and the upload is counted with the capture."""
from __future__ import annotations

import torch

import kernels


def upload_graph(graph: torch.cuda.CUDAGraph) -> None:
    """Upload a graph whose capture has ended to its device, on the current stream, and wait for it."""
    kernels.load()
    torch.ops.ddtree.graph_upload(graph.raw_cuda_graph_exec())
    torch.cuda.current_stream().synchronize()
