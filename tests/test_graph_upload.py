"""kernels.graph_upload: uploading a captured graph does not run it, and the graph then replays exactly what it
captured (every decoder uploads its graphs: the graph decodes of test_decode_cuda.py and test_auto_budget.py replay
uploaded graphs). An executable handle of 0 is a clear error."""
from __future__ import annotations

import pytest
import torch

from kernels.graph_upload import upload_graph

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")


def test_an_uploaded_graph_is_not_run_by_the_upload_and_replays_what_it_captured():
    gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(0, 10_000, ())))
    x = torch.randn(64, 48, device="cuda", generator=gen)
    w = torch.randn(48, 32, device="cuda", generator=gen)
    counter = torch.zeros((), device="cuda")
    out = torch.empty(64, 32, device="cuda")
    x @ w  # cuBLAS's handle and workspace before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counter.add_(1)
        out.copy_(x @ w + counter)
    counter.zero_()
    out.fill_(float("nan"))
    upload_graph(graph)
    assert float(counter) == 0 and torch.isnan(out).all(), "the upload ran the graph"
    for replays in (1, 2, 3):
        graph.replay()
        torch.cuda.synchronize()
        assert float(counter) == replays
        torch.testing.assert_close(out, x @ w + replays)


def test_a_null_executable_is_a_clear_error():
    with pytest.raises(RuntimeError, match="graph_exec is 0"):
        torch.ops.ddtree.graph_upload(0)
