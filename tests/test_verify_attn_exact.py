"""verify_attn's batch-invariant kernel (CPU and CUDA): the reference's result, and a node's output bit for bit
what a one-node call computes over the same keys laid out as AR holds them (the prefix, then the node's
ancestors, contiguous), whatever the other nodes, the cache slots and the call's size."""
from __future__ import annotations

import random

import pytest
import torch
from masks import ancestor_mask

from kernels import ops, reference

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")])]


def random_case(rng: random.Random, dtype: torch.dtype, device: str, lat: int, rope: int):
    num_nodes, heads = rng.randint(1, 40), rng.randint(1, 4)
    prefix = rng.choice([0, rng.randint(1, 70), rng.randint(100, 300)])
    rows = prefix + num_nodes + rng.randint(0, 9)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))

    def draw(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    parents = [-1] + [rng.randrange(i) for i in range(1, num_nodes)]
    return (draw(num_nodes, heads, lat), draw(num_nodes, heads, rope), draw(rows, lat), draw(rows, rope),
            torch.tensor(prefix, device=device), ancestor_mask(parents).to(device), parents)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_node_equals_a_one_node_call_over_the_same_keys(device, dtype):
    rng = random.Random()
    lat, rope = (512, 64) if device == "cuda" else rng.choice([(16, 8), (40, 6)])
    for _ in range(4):
        q_lat, q_pe, ckv, kpe, prefix_len, mask, parents = random_case(rng, dtype, device, lat, rope)
        prefix = int(prefix_len)
        scale = rng.uniform(0.05, 0.3)
        out, lse = ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, scale, batch_invariant=True)
        want_out, want_lse = reference.verify_attn(q_lat, q_pe, ckv, kpe, prefix_len, mask, scale)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        assert torch.allclose(out.double(), want_out.double(), atol=tol, rtol=tol)
        assert torch.allclose(lse.double(), want_lse.double(), atol=1e-3, rtol=1e-3)
        for node in rng.sample(range(len(parents)), min(5, len(parents))):
            chain = []
            j = node
            while j >= 0:
                chain.append(j)
                j = parents[j]
            chain.reverse()  # the node's ancestors root first, then itself: AR's rows after the prefix
            depth = len(chain) - 1
            rows = torch.cat([torch.arange(prefix, device=device), prefix + torch.tensor(chain, device=device)])
            ar_ckv = torch.cat([ckv[rows], ckv[: 3]])  # AR's cache: the same keys contiguous, then other rows
            ar_kpe = torch.cat([kpe[rows], kpe[: 3]])
            one, one_lse = ops.verify_attn(q_lat[node:node + 1], q_pe[node:node + 1], ar_ckv, ar_kpe,
                                           torch.tensor(prefix + depth, device=device),
                                           torch.ones(1, 1, dtype=torch.bool, device=device), scale,
                                           batch_invariant=True)
            assert torch.equal(one[0], out[node]) and torch.equal(one_lse[0], lse[node]), (device, dtype, node)


@pytest.mark.parametrize("device", DEVICES)
def test_a_node_that_sees_nothing(device):
    q = torch.randn(2, 3, 16, device=device)
    q_pe = torch.randn(2, 3, 8, device=device)
    mask = torch.zeros(2, 2, dtype=torch.bool, device=device)
    out, lse = ops.verify_attn(q, q_pe, torch.randn(4, 16, device=device), torch.randn(4, 8, device=device),
                               torch.tensor(0, device=device), mask, 0.2, batch_invariant=True)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse < 0).all()
