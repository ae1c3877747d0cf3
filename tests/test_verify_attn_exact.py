"""verify_attn's batch-invariant kernels (CPU and CUDA): the reference's result, and a node's output bit for bit
what a one-node call computes over the same keys laid out as AR holds them (the prefix, then the node's
ancestors, contiguous), whatever the other nodes, the cache slots and the call's size. On the GPU also across
both ways the tensor-core kernel spreads its splits over blocks, and across the other rows of an MMA tile."""
from __future__ import annotations

import random

import pytest
import torch
from masks import ancestor_mask

from kernels import ops, reference

CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")])
DEVICES = ["cpu", CUDA]
BLOCKS = "DDTREE_VERIFY_ATTN_EXACT_BLOCKS"  # split | group: how the CUDA kernel maps its splits onto blocks
SPLITS = "DDTREE_VERIFY_ATTN_EXACT_SPLITS"  # the most splits a row is cut into (longer splits for longer rows)


def random_case(rng: random.Random, dtype: torch.dtype, device: str, lat: int, rope: int, num_nodes: int,
                heads: int, prefix: int):
    rows = prefix + num_nodes + rng.randint(0, 9)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    # deep chains now and then, so that a node's ancestors cross key-block and split boundaries
    parents = [-1] + [i - 1 if rng.random() < 0.6 else rng.randrange(i) for i in range(1, num_nodes)]
    return (draw(num_nodes, heads, lat), draw(num_nodes, heads, rope), draw(rows, lat), draw(rows, rope),
            torch.tensor(prefix, device=device), ancestor_mask(parents).to(device), parents)


def ar_call(q_lat, q_pe, ckv, kpe, prefix: int, parents: list[int], node: int, scale: float):
    """The node's one-node call over AR's cache: the prefix, its ancestors root first, itself, then other rows."""
    chain = []
    j = node
    while j >= 0:
        chain.append(j)
        j = parents[j]
    chain.reverse()
    device = ckv.device
    rows = torch.cat([torch.arange(prefix, device=device), prefix + torch.tensor(chain, device=device)])
    return ops.verify_attn(q_lat[node:node + 1], q_pe[node:node + 1], torch.cat([ckv[rows], ckv[:3]]),
                           torch.cat([kpe[rows], kpe[:3]]), torch.tensor(prefix + len(chain) - 1, device=device),
                           torch.ones(1, 1, dtype=torch.bool, device=device), scale, batch_invariant=True)


def check_against_reference(args, out, lse, dtype) -> None:
    want_out, want_lse = reference.verify_attn(*args)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.double().cpu(), want_out.double(), atol=tol, rtol=tol)
    assert torch.allclose(lse.double().cpu(), want_lse.double(), atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_node_equals_a_one_node_call_over_the_same_keys(device, dtype):
    rng = random.Random()
    for _ in range(4):
        lat, rope = (512, 64) if device == "cuda" or rng.random() < 0.3 else rng.choice([(16, 8), (40, 6)])
        prefix = rng.choice([0, rng.randint(1, 70), rng.randint(100, 300)])
        heads = rng.choice([1, 3, 64]) if device == "cuda" else rng.randint(1, 4)
        q_lat, q_pe, ckv, kpe, prefix_len, mask, parents = random_case(rng, dtype, device, lat, rope,
                                                                       rng.randint(1, 40), heads, prefix)
        scale = rng.uniform(0.05, 0.3)
        args = (q_lat, q_pe, ckv, kpe, prefix_len, mask, scale)
        out, lse = ops.verify_attn(*args, batch_invariant=True)
        check_against_reference([a.cpu() if isinstance(a, torch.Tensor) else a for a in args], out, lse, dtype)
        for node in rng.sample(range(len(parents)), min(5, len(parents))):
            one, one_lse = ar_call(q_lat, q_pe, ckv, kpe, prefix, parents, node, scale)
            assert torch.equal(one[0], out[node]) and torch.equal(one_lse[0], lse[node]), (device, dtype, node)


def on_cuda(*values):
    """Parameters of a CUDA-only case (CUDA's marks), beside cpu / CUDA ones."""
    return pytest.param("cuda", *values, marks=CUDA.marks)


@pytest.mark.parametrize(("device", "split_target"), [("cpu", "auto"), on_cuda("auto"), on_cuda("8"), on_cuda("3")])
def test_a_node_alone_and_among_257_is_the_same_bits(device, split_target, monkeypatch):
    """Kimi-K2 widths, a 257-node tree over a prefix that crosses split (256) and group (2048) boundaries: each
    sampled node's output equals its AR call's, with every block layout of the CUDA kernel on either side. With at
    most 8 splits a row, rows up to 2048 keys split every 256 positions and longer ones every 512, so the tree's
    nodes straddle the change; with 3, every 1024 (a block per group then folds 3 long splits)."""
    monkeypatch.setenv(SPLITS, split_target)
    rng = random.Random()
    dtype = torch.bfloat16
    heads = 64 if device == "cuda" else 8
    prefix = rng.randint(2040, 2300) if split_target != "8" else rng.randint(1990, 2040)
    q_lat, q_pe, ckv, kpe, prefix_len, mask, parents = random_case(rng, dtype, device, 512, 64, 257, heads, prefix)
    scale = 0.1
    layouts = ["split", "group"] if device == "cuda" else ["auto"]
    outs = {}
    for layout in layouts:
        monkeypatch.setenv(BLOCKS, layout)
        outs[layout] = ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, scale, batch_invariant=True)
    out, lse = outs[layouts[0]]
    for other in layouts[1:]:
        assert torch.equal(outs[other].o_lat, out) and torch.equal(outs[other].lse, lse), other
    args = [a.cpu() if isinstance(a, torch.Tensor) else a for a in (q_lat, q_pe, ckv, kpe, prefix_len, mask, scale)]
    check_against_reference(args, out, lse, dtype)
    nodes = [0, 256] + rng.sample(range(1, 256), 4) + [max(range(257), key=lambda i: mask[i].sum().item())]
    for layout in layouts:
        monkeypatch.setenv(BLOCKS, layout)
        for node in nodes:
            one, one_lse = ar_call(q_lat, q_pe, ckv, kpe, prefix, parents, node, scale)
            assert torch.equal(one[0], out[node]) and torch.equal(one_lse[0], lse[node]), (layout, node)


@pytest.mark.parametrize("device", [CUDA])
def test_a_call_too_large_for_one_workspace_runs_in_chunks_of_nodes_with_the_same_bits(device):
    """600 nodes over 32768 rows need more than the tensor-core kernel's 1 GiB of partials (about 2 MiB a node
    there), so the op runs the nodes in two launches: nodes on either side of the cut still equal their AR
    calls bit for bit (whose values the tests above check against the reference)."""
    rng = random.Random()
    num_nodes, rows = 600, 32768
    q_lat, q_pe, ckv, kpe, prefix_len, mask, parents = random_case(rng, torch.bfloat16, device, 512, 64, num_nodes,
                                                                   64, rows - num_nodes - 9)
    prefix = int(prefix_len)
    out, lse = ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, 0.1, batch_invariant=True)
    for node in (0, 509, 510, 511, num_nodes - 1):
        one, one_lse = ar_call(q_lat, q_pe, ckv, kpe, prefix, parents, node, 0.1)
        assert torch.equal(one[0], out[node]) and torch.equal(one_lse[0], lse[node]), node
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()  # every node written


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("value", ["0", "129", "-3", "8x", ""])
def test_a_split_target_out_of_range_is_refused(device, value, monkeypatch):
    q_lat, q_pe = torch.randn(1, 64, 512, device=device).bfloat16(), torch.randn(1, 64, 64, device=device).bfloat16()
    ckv, kpe = torch.randn(30, 512, device=device).bfloat16(), torch.randn(30, 64, device=device).bfloat16()
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(29, device=device), torch.ones(1, 1, dtype=torch.bool, device=device),
            0.1)
    monkeypatch.setenv(SPLITS, value)
    with pytest.raises(RuntimeError, match=f"{SPLITS}={value} is not a count from 1 to 128 or auto"):
        ops.verify_attn(*args, batch_invariant=True)
    monkeypatch.setenv(SPLITS, "1")
    one = ops.verify_attn(*args, batch_invariant=True)
    monkeypatch.setenv(SPLITS, "auto")
    assert torch.equal(one.o_lat, ops.verify_attn(*args, batch_invariant=True).o_lat)  # 30 keys: one split either way


@pytest.mark.parametrize("device", [CUDA])
def test_an_mma_rows_result_does_not_depend_on_the_other_rows(device):
    """The tensor-core kernel's premise: a query row's output is the same bits whatever the other 63 rows of its
    MMA tile hold (here the node's other heads, redrawn), and whether the tile is full or padded."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch.bfloat16)

    prefix, rows = 3000, 3010
    q_lat, q_pe, ckv, kpe = draw(1, 64, 512), draw(1, 64, 64), draw(rows, 512), draw(rows, 64)
    args = (ckv, kpe, torch.tensor(prefix, device=device), torch.ones(1, 1, dtype=torch.bool, device=device), 0.1)
    full = ops.verify_attn(q_lat, q_pe, *args, batch_invariant=True)
    other_lat, other_pe = q_lat.clone(), q_pe.clone()
    other_lat[:, 32:], other_pe[:, 32:] = draw(1, 32, 512), draw(1, 32, 64)
    redrawn = ops.verify_attn(other_lat, other_pe, *args, batch_invariant=True)
    padded = ops.verify_attn(q_lat[:, :32].contiguous(), q_pe[:, :32].contiguous(), *args, batch_invariant=True)
    for got in (redrawn, padded):
        assert torch.equal(got.o_lat[:, :32], full.o_lat[:, :32]) and torch.equal(got.lse[:, :32], full.lse[:, :32])
    assert not torch.equal(redrawn.o_lat[:, 32:], full.o_lat[:, 32:])  # the redrawn rows did change


def test_the_cpu_kernel_is_batch_invariant_in_both_modes():
    """On the CPU one kernel serves both modes: batch_invariant=False gives the same bits, AR's included."""
    rng = random.Random()
    q_lat, q_pe, ckv, kpe, prefix_len, mask, parents = random_case(rng, torch.float32, "cpu", 512, 64, 33, 16,
                                                                   rng.randint(60, 200))
    fast = ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, 0.1)
    exact = ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, 0.1, batch_invariant=True)
    assert torch.equal(fast.o_lat, exact.o_lat) and torch.equal(fast.lse, exact.lse)
    node = max(range(33), key=lambda i: mask[i].sum().item())
    one, _ = ar_call(q_lat, q_pe, ckv, kpe, int(prefix_len), parents, node, 0.1)
    assert torch.equal(one[0], fast.o_lat[node])


@pytest.mark.parametrize("device", DEVICES)
def test_a_node_that_sees_nothing(device):
    q = torch.randn(2, 3, 16, device=device)
    q_pe = torch.randn(2, 3, 8, device=device)
    mask = torch.zeros(2, 2, dtype=torch.bool, device=device)
    out, lse = ops.verify_attn(q, q_pe, torch.randn(4, 16, device=device), torch.randn(4, 8, device=device),
                               torch.tensor(0, device=device), mask, 0.2, batch_invariant=True)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()


@pytest.mark.parametrize("device", [CUDA])
def test_a_bfloat16_node_that_sees_nothing_on_the_tensor_cores(device):
    q = torch.randn(2, 64, 512, device=device, dtype=torch.bfloat16)
    q_pe = torch.randn(2, 64, 64, device=device, dtype=torch.bfloat16)
    mask = torch.tensor([[True, False], [False, False]], device=device)
    out, lse = ops.verify_attn(q, q_pe, torch.randn(4, 512, device=device, dtype=torch.bfloat16),
                               torch.randn(4, 64, device=device, dtype=torch.bfloat16),
                               torch.tensor(0, device=device), mask, 0.2, batch_invariant=True)
    assert (out[1] == 0).all() and torch.isinf(lse[1]).all() and (lse[1] < 0).all() and torch.isfinite(lse[0]).all()
