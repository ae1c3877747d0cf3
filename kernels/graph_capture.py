"""Work captured as a CUDA graph the way torch advises: a warm-up run first on a side stream (it loads the extension
and its kernels, sets their shared-memory attributes and makes any library handle, none of which a capture allows),
then the capture. The tests, the trainer's generation and the benchmarks' graph timings capture through it."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture(warm_up: Callable[[], Any], body: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """warm_up() on a side stream, then body() captured; the graph and what body returned (its static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        warm_up()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = body()
    return graph, out
