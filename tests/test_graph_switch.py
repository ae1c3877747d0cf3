"""kernels.graph_switch: a switch node inside a CUDA graph runs exactly the branch its device index picks on every
replay (none for an index out of range), branches that allocate and multiply included, and the work captured
before and after it runs in order around it."""
from __future__ import annotations

import pytest
import torch

from kernels.graph_switch import graph_switch, side_stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")

NUM_BRANCHES = 5


def captured_switch(seed: int):
    """A graph: index = picks[0] (device), then a switch whose branch i writes (x @ w_i) into a fresh output and adds
    i + 1 to a counter, then after it a copy of the counter. Returns the graph and its tensors."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(8, 64, device="cuda", generator=gen)
    weights = [torch.randn(64, 32, device="cuda", generator=gen) for _ in range(NUM_BRANCHES)]
    picks = torch.zeros(1, dtype=torch.int64, device="cuda")
    counter = torch.zeros((), device="cuda")
    stream = side_stream(torch.device("cuda"))

    def branch(i):
        def run():
            counter.add_(i + 1)
            return (x @ weights[i]).relu_().mul_(2)  # one allocation, in the graph's pool: no branch reuses it
        return run

    graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
    with torch.cuda.graph(graph, pool=pool):
        index = picks[0].clone()
        outputs = graph_switch(index, [branch(i) for i in range(NUM_BRANCHES)], pool, stream)
        after = counter.clone()
    return graph, x, weights, picks, counter, outputs, after


def test_the_switch_runs_the_branch_its_index_picks_and_no_other():
    graph, x, weights, picks, counter, outputs, after = captured_switch(seed=int(torch.randint(0, 10_000, ())))
    for out in outputs:
        out.fill_(float("nan"))  # poison: a branch that runs overwrites its own output
    ran = set()
    total = 0.0
    for pick in [3, 0, 4, 1, 2, 7, -1, 3]:
        picks.fill_(pick)
        graph.replay()
        torch.cuda.synchronize()
        if 0 <= pick < NUM_BRANCHES:
            total += pick + 1
            ran.add(pick)
            torch.testing.assert_close(outputs[pick], torch.relu(x @ weights[pick]) * 2)
        assert float(counter) == total, f"after pick {pick}: only that branch added to the counter"
        assert float(after) == total, "the work after the switch saw the branch's result"
        for i in set(range(NUM_BRANCHES)) - ran:
            assert torch.isnan(outputs[i]).all(), f"branch {i} never picked, yet it wrote its output"


def test_a_switch_outside_a_capture_is_a_clear_error():
    index = torch.zeros((), dtype=torch.int64, device="cuda")
    with pytest.raises(RuntimeError, match="not capturing"):
        graph_switch(index, [lambda: None], (0, 1), side_stream(torch.device("cuda")))
