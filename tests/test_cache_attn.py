"""ops.cache_attn (csrc/cache_attn_torch.h on the CPU, csrc/cuda/cache_attn.cu on the GPU) against
kernels/reference.py's float64 attention on fresh random inputs: every head of a key/value group, every valid row
count from one row to the whole cache, nodes at a stride, the split of the keys over the grid; a captured CUDA graph
replayed at new lengths; opcheck and the errors."""
from __future__ import annotations

import random

import pytest
import torch

from kernels import ops, reference
from kernels.graph_capture import capture

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _inputs(gen, num_nodes, num_heads, num_kv, dim, cache_rows, device, dtype, row_pad=0):
    """q [N, Hq, D] whose nodes sit row_pad heads apart beyond their own (a slice of a wider row), keys, values."""
    q = torch.randn(num_nodes, num_heads + row_pad, dim, generator=gen)[:, :num_heads]
    keys = torch.randn(cache_rows, num_kv, dim, generator=gen) * 2
    values = torch.randn(cache_rows, num_kv, dim, generator=gen)
    return q.to(device, dtype), keys.to(device, dtype), values.to(device, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_float64(device, dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    shapes = [(8, 64, 8, 128, 4500), (16, 8, 4, 32, 300), (9, 12, 3, 64, 700), (1, 4, 4, 128, 64),
              (17, 16, 2, 32, 129), (3, 6, 2, 16, 40)]  # the last: a head dim the CUDA kernel leaves to torch
    for num_nodes, num_heads, num_kv, dim, cache_rows in shapes:
        q, keys, values = _inputs(gen, num_nodes, num_heads, num_kv, dim, cache_rows, device, dtype, row_pad=2)
        lengths = {1, 63, 64, 65, rng.randrange(1, cache_rows + 1), cache_rows}  # tile edges, any, the whole cache
        for visible in sorted(v for v in lengths if v <= cache_rows):
            num_visible = torch.tensor(visible, device=device)
            got = ops.cache_attn(q, keys, values, num_visible, dim ** -0.5)
            want = reference.cache_attn(q, keys, values, num_visible, dim ** -0.5)
            assert got.dtype == dtype and got.shape == q.shape and got.is_contiguous()
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            err = (got.double() - want.double()).abs().max().item()
            assert err < tolerance, (num_nodes, num_heads, num_kv, dim, cache_rows, visible, err, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_past_the_valid_ones_change_nothing(device):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, keys, values = _inputs(gen, 8, 16, 4, 64, 900, device, torch.bfloat16)
    num_visible = torch.tensor(500, device=device)
    before = ops.cache_attn(q, keys, values, num_visible, 0.125)
    keys[500:], values[500:] = 1e4, -1e4  # what a stale row may hold (the engine's are finite: zeros or old blocks)
    assert torch.equal(ops.cache_attn(q, keys, values, num_visible, 0.125), before)


@needs_cuda
def test_a_captured_graph_serves_every_length():
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, keys, values = _inputs(gen, 8, 64, 8, 128, 4500, "cuda", torch.bfloat16)
    num_visible = torch.tensor(1, device="cuda")
    graph, out = capture(lambda: ops.cache_attn(q, keys, values, num_visible, 0.1),
                         lambda: ops.cache_attn(q, keys, values, num_visible, 0.1))
    for visible in (4500, 1, 77, 4096, 2000):
        num_visible.fill_(visible)
        graph.replay()
        want = reference.cache_attn(q, keys, values, num_visible, 0.1)
        assert (out.double() - want.double()).abs().max().item() < 2e-2, visible


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        q, keys, values = _inputs(gen, 4, 8, 2, 32, 100, device, dtype)
        torch.library.opcheck(torch.ops.ddtree.cache_attn.default, (q, keys, values, torch.tensor(60, device=device),
                                                                      0.2))


def test_bad_arguments_say_what_is_wrong():
    q, keys, values = torch.randn(4, 8, 32), torch.randn(50, 2, 32), torch.randn(50, 2, 32)
    n = torch.tensor(10)
    with pytest.raises(RuntimeError, match="num_visible must be in .1, S = 50."):
        ops.cache_attn(q, keys, values, torch.tensor(51), 0.1)
    with pytest.raises(RuntimeError, match="num_visible must be in .1, S = 50."):
        ops.cache_attn(q, keys, values, torch.tensor(0), 0.1)
    with pytest.raises(RuntimeError, match="num_visible must be a 0-dim int64"):
        ops.cache_attn(q, keys, values, torch.tensor([10]), 0.1)
    with pytest.raises(RuntimeError, match="q's 8 heads must be a multiple of the cache's 3 key/value heads"):
        ops.cache_attn(q, torch.randn(50, 3, 32), torch.randn(50, 3, 32), n, 0.1)
    with pytest.raises(RuntimeError, match="keys' head dim 16 must be q's, 32"):
        ops.cache_attn(q, keys[..., :16].contiguous(), values[..., :16].contiguous(), n, 0.1)
    with pytest.raises(RuntimeError, match="values must be .S, Hkv, D. like keys"):
        ops.cache_attn(q, keys, values[:40], n, 0.1)
    with pytest.raises(RuntimeError, match="keys must be bfloat16"):
        ops.cache_attn(q.bfloat16(), keys, values.bfloat16(), n, 0.1)
    with pytest.raises(RuntimeError, match="q's heads must be contiguous"):
        ops.cache_attn(q.transpose(0, 1), keys, values, n, 0.1)
    with pytest.raises(RuntimeError, match="keys must be contiguous"):
        ops.cache_attn(q, keys.transpose(0, 1).contiguous().transpose(0, 1), values, n, 0.1)
    with pytest.raises(RuntimeError, match="scale must be a positive finite number"):
        ops.cache_attn(q, keys, values, n, float("nan"))
    with pytest.raises(RuntimeError, match="q must be float32 or bfloat16, got float16"):
        ops.cache_attn(q.half(), keys.half(), values.half(), n, 0.1)
