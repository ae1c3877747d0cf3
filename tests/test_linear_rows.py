"""ops.linear_rows on the CPU (the batch-invariant mode's matmul) against kernels/reference.py and float64 matmuls on
every instruction set this machine has: row invariance (a row's bits whatever M, its place, the other rows, the
threads), grouped weights, rows grouped by group_ends, strided rows, opcheck and input errors; and
engine/model/batch_rows.py's InvariantRows, whose activations, norms and experts keep every row's bits whatever the rows
beside it. tests/test_linear_rows_cuda.py has the CUDA kernels."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from moe_cases import TOLERANCE, random_experts, relative_error

from engine.model.batch_rows import FAST, InvariantRows
from engine.model.moe import dense_moe
from kernels import ops, reference


def _case(seed: int, groups: int, out_features: int, depth: int, rows: int, stride_pad: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(groups, out_features, depth, generator=gen)
    x = torch.randn(rows, groups, depth + stride_pad, generator=gen)[:, :, stride_pad:]  # K contiguous, rows strided
    return weight, x


@pytest.mark.parametrize("shape", [(1, 384, 384), (1, 4096, 384), (12, 128, 32), (3, 17, 5), (2, 1, 1)])
def test_matches_reference_and_float64(isa, shape):
    seed = random.randrange(2**31)
    groups, out_features, depth = shape
    for rows in (1, 5, 6, 7, 65):
        weight, x = _case(seed, groups, out_features, depth, rows, stride_pad=3)
        packed = ops.pack_linear_rows(weight)
        got = ops.linear_rows(x, packed, out_features)
        assert got.shape == (rows, groups, out_features)
        want = torch.einsum("mgk,gnk->mgn", x.double(), weight.double())
        scale = (x.double().abs() @ weight.double().abs().amax((0, 1))).max().clamp_min(1.0)
        assert float((got.double() - want).abs().max() / scale) < 1e-6, (shape, rows, seed)
        assert torch.allclose(reference.linear_rows(x, packed, out_features), want.float(), rtol=1e-5, atol=1e-5)


def test_every_row_is_its_own_bits_whatever_the_call_holds(isa, threads):
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    groups, out_features, depth = rng.randint(1, 3), rng.randint(1, 70), rng.randint(1, 300)
    weight, x = _case(seed, groups, out_features, depth, 40, stride_pad=rng.randint(0, 2))
    packed = ops.pack_linear_rows(weight)
    alone = torch.cat([ops.linear_rows(x[i:i + 1], packed, out_features) for i in range(len(x))])
    for num_threads in (1, 2):
        torch.set_num_threads(num_threads)
        for _ in range(6):
            start, stop = sorted(rng.sample(range(len(x) + 1), 2))
            block = torch.cat([torch.randn(rng.randint(0, 7), groups, depth), x[start:stop]])  # other rows first
            got = ops.linear_rows(block, packed, out_features)[-(stop - start):] if stop > start else None
            assert got is None or torch.equal(got, alone[start:stop]), (seed, start, stop, num_threads)


def test_two_dim_calls_and_packing():
    weight, x = torch.randn(33, 20), torch.randn(9, 20)
    packed = ops.pack_linear_rows(weight)
    assert packed.shape == (1, 3, 20, ops.LINEAR_ROWS_PANEL) and torch.equal(packed[0, 2, :, 1:], torch.zeros(20, 15))
    assert torch.allclose(ops.linear_rows(x, packed, 33), x @ weight.T, atol=1e-5)
    assert ops.linear_rows(x[:0], packed, 33).shape == (0, 33)
    assert torch.equal(ops.linear_rows(torch.randn(4, 0), ops.pack_linear_rows(torch.randn(5, 0)), 5),
                       torch.zeros(4, 5))


def test_grouped_rows_match_the_reference_and_keep_their_bits(isa):
    """With group_ends every row goes through its group's weight (rows past the last end: zeros), and a row's bits do
    not depend on how many rows share its group."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    groups, out_features, depth, num_rows = 5, 37, 29, 23
    weight = torch.randn(groups, out_features, depth, generator=gen)
    packed = ops.pack_linear_rows(weight)
    counts = torch.multinomial(torch.ones(groups + 1), num_rows, replacement=True, generator=gen).bincount(
        minlength=groups + 1)  # the last "group" is rows past every end
    ends = counts[:groups].cumsum(0).int()
    x = torch.randn(num_rows, depth, generator=gen)
    got = ops.linear_rows(x, packed, out_features, ends)
    want = reference.linear_rows(x[:, None], packed, out_features, ends)[:, 0]
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), seed
    assert torch.equal(got[int(ends[-1]):], torch.zeros(num_rows - int(ends[-1]), out_features))
    group = torch.searchsorted(ends, torch.arange(num_rows), right=True)
    for m in range(int(ends[-1])):
        g = int(group[m])
        one = torch.zeros(groups, dtype=torch.int32)
        one[g:] = 1
        assert torch.equal(ops.linear_rows(x[m:m + 1], packed, out_features, one)[0], got[m]), (seed, m)


def test_opcheck():
    weight, x = _case(random.randrange(2**31), 2, 19, 7, 5, stride_pad=1)
    torch.library.opcheck(torch.ops.ddtree.linear_rows.default, (x, ops.pack_linear_rows(weight), 19))
    ends = torch.tensor([2, 2, 4], dtype=torch.int32)
    torch.library.opcheck(torch.ops.ddtree.linear_rows.default,
                          (torch.randn(5, 1, 7), ops.pack_linear_rows(torch.randn(3, 19, 7)), 19, ends))


BAD_INPUTS = {
    "x dtype": (lambda p: ops.linear_rows(torch.randn(2, 8).double(), p, 10), "x must be float32, got float64"),
    "x dim": (lambda p: torch.ops.ddtree.linear_rows(torch.randn(2, 8), p, 10), r"x must be 3-dim \[M, G, K\]"),
    "K strided": (lambda p: ops.linear_rows(torch.randn(8, 2).t(), p, 10), "x's last dimension \\(K\\) must be contig"),
    "K mismatch": (lambda p: ops.linear_rows(torch.randn(2, 9), p, 10), r"packed must be \[G, ceil\(N / 16\), K, 16\]"),
    "N mismatch": (lambda p: ops.linear_rows(torch.randn(2, 8), p, 17), r"G = 1, N = out_features = 17"),
    "N negative": (lambda p: ops.linear_rows(torch.randn(2, 8), p, -1), "out_features must be >= 0, got -1"),
    "packed dtype": (lambda p: ops.linear_rows(torch.randn(2, 8), p.double(), 10), "packed must be float32"),
    "packed strides": (lambda p: ops.linear_rows(torch.randn(2, 8), p.transpose(2, 3), 10), "packed must be contig"),
    "ends dtype": (lambda p: ops.linear_rows(torch.randn(2, 8), p, 10, torch.tensor([2])), "group_ends must be int32"),
    "ends count": (lambda p: ops.linear_rows(torch.randn(2, 8), p, 10, torch.tensor([1, 2], dtype=torch.int32)),
                   r"group_ends must hold one end per packed weight \(1\), got 2"),
    "ends past M": (lambda p: ops.linear_rows(torch.randn(2, 8), p, 10, torch.tensor([3], dtype=torch.int32)),
                    r"group_ends must be non-decreasing in \[0, M = 2\]"),
    "ends grouped x": (lambda p: torch.ops.ddtree.linear_rows(torch.randn(2, 2, 8), p, 10,
                                                              torch.tensor([2], dtype=torch.int32)),
                       r"with group_ends, x must be \[M, 1, K\]"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_clear_errors(case):
    call, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message):
        call(ops.pack_linear_rows(torch.randn(10, 8)))


@pytest.mark.parametrize("width", [1, 4, 8, 13, 64, 100])
def test_invariant_activations_keep_each_rows_bits(width):
    """torch's CPU silu rounds the elements past a tensor's last full vectors differently; InvariantRows' SwiGLU
    activation gives a row the same bits in any call, and the fast one the same values to float32 rounding."""
    rows = InvariantRows(torch.device("cpu"))
    x = torch.randn(37, 2 * width) * 4
    full = rows.gated(x)
    assert full.shape == (37, width)
    assert torch.equal(full, torch.cat([rows.gated(x[i:i + 1]) for i in range(len(x))]))
    assert torch.allclose(full, FAST.gated(x), rtol=1e-6, atol=1e-6)


def test_invariant_rows_match_the_fast_ones():
    """Each InvariantRows map equals FastRows' to float32 rounding (weights packed once, then reused)."""
    rows = InvariantRows(torch.device("cpu"))
    x, weight = torch.randn(5, 24), torch.randn(40, 24)
    assert torch.allclose(rows.linear(x, weight), F.linear(x, weight), atol=1e-5)
    assert rows.packed(weight, torch.float32) is rows.packed(weight, torch.float32)
    norm = torch.randn(24)
    assert torch.allclose(rows.rms_norm(x, norm, 1e-6), FAST.rms_norm(x, norm, 1e-6), rtol=1e-5, atol=1e-6)
    q_nope, w_uk = torch.randn(5, 3, 8), torch.randn(3, 8, 16)
    assert torch.allclose(rows.absorb(q_nope, w_uk), FAST.absorb(q_nope, w_uk), atol=1e-5)
    o_lat, w_uv = torch.randn(5, 3, 16), torch.randn(3, 8, 16)
    assert torch.allclose(rows.expand(o_lat, w_uv), FAST.expand(o_lat, w_uv), atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_invariant_routed_experts_match_the_dense_reference_row_by_row(dtype):
    """InvariantRows.routed against dense_moe (every expert on every token), an expert id past the held ones (another
    rank's, local_routing) adding nothing; and each row's output its own bits whatever rows share its experts."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    num, hidden, inter, k, n = 6, 24, 16, 2, 23
    experts = random_experts(num, hidden, inter, dtype, gen)
    x = torch.randn(n, hidden, generator=gen).to(dtype)
    idx = torch.rand(n, num + 1, generator=gen).topk(k, -1).indices  # num: "not here"
    weights = torch.rand(n, k, generator=gen) * (idx < num)
    rows = InvariantRows(torch.device("cpu"))
    got = rows.routed(True, x, idx, weights, experts)
    assert relative_error(got, dense_moe(x, idx, weights, experts)) < TOLERANCE[dtype], seed
    alone = torch.cat([rows.routed(True, x[i:i + 1], idx[i:i + 1], weights[i:i + 1], experts) for i in range(n)])
    assert torch.equal(got, alone), seed


def test_invariant_activations_hold_across_thread_splits(threads):
    """A pointwise call over more than torch's grain (32768 elements) is split over threads at points that need not
    fall on a vector's edge; InvariantRows' activations give a row its own bits at any thread count and row count."""
    rows = InvariantRows(torch.device("cpu"))
    x = torch.randn(300, 2 * 576)  # gates of 172,800 elements: torch would split them
    alone = torch.cat([rows.gated(x[i:i + 1]) for i in range(len(x))])
    for num_threads in (1, 2, 3):
        torch.set_num_threads(num_threads)
        for m in (1, 57, 300):
            assert torch.equal(rows.gated(x[:m]), alone[:m]), (num_threads, m)
    assert rows.gated(torch.randn(3, 0)).shape == (3, 0)
