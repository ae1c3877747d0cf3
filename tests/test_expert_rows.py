"""ops.expert_rows and ops.expert_combine (csrc/cpu/expert_rows.cpp, csrc/cuda/expert_rows.cu) against
kernels/reference.py on fresh random routings, on the CPU and, where there is one, on the GPU: the grouping (stable
within an expert, another rank's ids last), the group ends, the weighted sums with those rows left out, opcheck and
the errors."""
from __future__ import annotations

import random

import pytest
import torch

from kernels import ops, reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.bfloat16]


def _routing(gen: torch.Generator, num_tokens: int, top_k: int, num_experts: int, foreign: bool) -> torch.Tensor:
    """[N, k] distinct experts per token, popular ones drawn more often; with foreign, id E (another rank's) too."""
    odds = torch.rand(num_tokens, num_experts + foreign, generator=gen) * torch.rand(num_experts + foreign,
                                                                                  generator=gen) ** 3
    return odds.topk(top_k, -1).indices


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_rows_grouped_by_expert_and_summed_back(device, dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for num_tokens, top_k, num_experts, width in ((1, 8, 384, 64), (17, 8, 384, 40), (65, 4, 32, 8), (257, 8, 384, 16),
                                                  (5, 1, 1, 24), (0, 2, 3, 8), (300, 6, 8191, 8)):
        for foreign in (False, True):
            k = min(top_k, num_experts + foreign)
            idx = _routing(gen, num_tokens, k, num_experts, foreign)
            x = torch.randn(num_tokens, width + 3, generator=gen).to(dtype)[:, 3:]  # rows strided
            rows, slots, ends = ops.expert_rows(x.to(device), idx.to(device), num_experts)
            want_rows, want_slots, want_ends = reference.expert_rows(x, idx, num_experts)
            where = (num_tokens, k, num_experts, foreign, seed)
            assert rows.dtype == dtype and slots.dtype == torch.int64 and ends.dtype == torch.int32, where
            assert torch.equal(slots.cpu(), want_slots) and torch.equal(ends.cpu(), want_ends), where
            assert torch.equal(rows.cpu(), want_rows), where
            out = torch.randn(rows.shape[0] + 2, width, generator=gen).to(dtype)  # rows past the groups: junk
            out[int(ends[-1]):] = float("nan") if foreign else out[int(ends[-1]):]
            weights = torch.rand(num_tokens, k, generator=gen)
            got = ops.expert_combine(out.to(device), slots, weights.to(device), ends)
            want = reference.expert_combine(out, want_slots, weights, want_ends)
            assert got.dtype == dtype and got.shape == (num_tokens, width), where
            assert torch.isfinite(got).all(), where
            assert torch.allclose(got.cpu().float(), want.float(), rtol=1e-2 if dtype == torch.bfloat16 else 1e-5,
                                  atol=1e-2 if dtype == torch.bfloat16 else 1e-5), where


@pytest.mark.parametrize("device", DEVICES)
def test_a_tokens_sum_is_its_own_whatever_the_other_tokens(device):
    """The combine reads a token's rows alone: the same bits beside any other tokens (the batch-invariant mode)."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    idx = _routing(gen, 40, 8, 64, False)
    x = torch.randn(40, 32, generator=gen).bfloat16()
    rows, slots, ends = ops.expert_rows(x.to(device), idx.to(device), 64)
    weights = torch.rand(40, 8, generator=gen).to(device)
    together = ops.expert_combine(rows, slots, weights, ends)
    for n in (0, 17, 39):
        one_rows, one_slots, one_ends = ops.expert_rows(x[n:n + 1].to(device), idx[n:n + 1].to(device), 64)
        assert torch.equal(ops.expert_combine(one_rows, one_slots, weights[n:n + 1], one_ends)[0], together[n])


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(6, 16, device=device)
    idx = torch.tensor([[0, 2], [1, 0], [3, 2], [0, 1], [2, 3], [1, 4]], device=device)
    torch.library.opcheck(torch.ops.ddtree.expert_rows.default, (x, idx, 4))
    rows, slots, ends = ops.expert_rows(x, idx, 4)
    weights = torch.rand(6, 2, device=device)
    torch.library.opcheck(torch.ops.ddtree.expert_combine.default, (rows, slots, weights, ends))


def test_bad_arguments_say_what_is_wrong():
    x, idx = torch.randn(3, 8), torch.tensor([[0, 1], [1, 2], [2, 0]])
    with pytest.raises(RuntimeError, match=r"idx\[1, 1\] = 5 is not an expert in \[0, 3\]"):
        ops.expert_rows(x, torch.tensor([[0, 1], [1, 5], [2, 0]]), 3)
    with pytest.raises(RuntimeError, match="num_experts must be in"):
        ops.expert_rows(x, idx, 0)
    with pytest.raises(RuntimeError, match="num_experts must be in"):
        ops.expert_rows(x, idx, 8192)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got float16"):
        ops.expert_rows(x.half(), idx, 3)
    with pytest.raises(RuntimeError, match="idx must be int64, got int32"):
        ops.expert_rows(x, idx.int(), 3)
    with pytest.raises(RuntimeError, match="one row of experts per row of x"):
        ops.expert_rows(x, idx[:2], 3)
    rows, slots, ends = ops.expert_rows(x, idx, 3)
    weights = torch.rand(3, 2)
    with pytest.raises(RuntimeError, match="weights must be float32, got float64"):
        ops.expert_combine(rows, slots, weights.double(), ends)
    with pytest.raises(RuntimeError, match=r"weights must be \[N, k\] like slots"):
        ops.expert_combine(rows, slots, weights[:2], ends)
    with pytest.raises(RuntimeError, match=r"slots\[0, 0\] = -1 is not a row of out"):
        ops.expert_combine(rows, torch.full_like(slots, -1), weights, ends)
    with pytest.raises(RuntimeError, match=r"group_ends\[-1\] = 9 must be in \[0, M = 6\]"):
        ops.expert_combine(rows, slots, weights, torch.tensor([2, 4, 9], dtype=torch.int32))
