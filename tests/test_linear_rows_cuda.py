"""ops.linear_rows on CUDA (csrc/cuda/linear_rows.cu), bfloat16 tensor-core tiles and the float32 warp kernel, against
float64 and kernels/reference.py; the property the batch-invariant mode stands on: a row's output is the same bits
whatever M, its place among the rows (in a 16-row MMA tile and across tiles), the other rows' values and how many
rows share its group; the K splits at Kimi-K2 widths; opcheck; and InvariantRows on CUDA against the fast rows."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_batch_invariant import random_model

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.model.batch_rows import FAST, InvariantRows
from engine.model.target import TargetModel
from kernels import ops, reference

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float32]
# (groups, out_features, depth): an odd K (padded to 8), an odd N, per-head maps, and Kimi-K2 widths whose plan
# splits K (x_proj 7168 -> 2112, o_proj 8192 -> 7168, an expert's down projection 2048 -> 7168).
SHAPES = [(1, 37, 29), (3, 64, 128), (64, 512, 128), (1, 2112, 7168), (1, 7168, 8192), (1, 7168, 2048)]


def _weights(groups: int, out_features: int, depth: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(groups, out_features, depth, generator=gen) / depth ** 0.5).to("cuda", dtype)


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", DTYPES, ids=["bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_and_the_reference(dtype, shape):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    groups, out_features, depth = shape
    weight = _weights(groups, out_features, depth, dtype, gen)
    packed = ops.pack_linear_rows(weight, dtype)
    for num_rows in (1, 17, 65):
        x = torch.randn(num_rows, groups, depth + 8, generator=gen).to("cuda", dtype)[:, :, 8:]  # rows strided
        got = ops.linear_rows(x, packed, out_features)
        assert got.shape == (num_rows, groups, out_features) and got.dtype == dtype
        want = torch.einsum("mgk,gnk->mgn", x.double(), weight.double())
        assert _relative(got, want) < (6e-3 if dtype == torch.bfloat16 else 1e-5), (shape, num_rows, seed)
        assert _relative(got, reference.linear_rows(x, packed, out_features)) < 6e-3, (shape, num_rows, seed)


# The bfloat16 kernels: the automatic choice (wgmma on an H100/H200) and mma.sync, each row-invariant on its own.
KERNELS = [("bfloat16", "auto"), ("bfloat16", "mma"), ("float32", "auto")]


@pytest.mark.parametrize(("dtype", "kernel"), [(getattr(torch, d), k) for d, k in KERNELS],
                         ids=[f"{d}-{k}" for d, k in KERNELS])
@pytest.mark.parametrize("shape", [(1, 37, 29), (64, 512, 128), (1, 2112, 7168), (1, 7168, 2048)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_row_is_its_own_bits_whatever_the_call_holds(dtype, kernel, shape, monkeypatch):
    """The AR row (a call of one row) against the same row at a random place among up to 300 random rows: in another
    MMA tile, at another place in its tile, beside other values."""
    monkeypatch.setenv("DDTREE_LINEAR_ROWS_KERNEL", kernel)
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    groups, out_features, depth = shape
    packed = ops.pack_linear_rows(_weights(groups, out_features, depth, dtype, gen), dtype)
    rows = torch.randn(8, groups, depth, generator=gen).to("cuda", dtype)
    alone = torch.cat([ops.linear_rows(rows[i:i + 1], packed, out_features) for i in range(len(rows))])
    for num_rows in (2, 16, 17, 33, 65, 257, 300):
        block = torch.randn(num_rows, groups, depth, generator=gen).to("cuda", dtype)
        places = rng.sample(range(num_rows), min(num_rows, len(rows)))
        block[places] = rows[:len(places)]
        got = ops.linear_rows(block, packed, out_features)
        assert torch.equal(got[places], alone[:len(places)]), (shape, num_rows, places, seed)


@pytest.mark.parametrize("dtype", DTYPES, ids=["bfloat16", "float32"])
@pytest.mark.parametrize(("groups", "out_features", "depth"), [(12, 4096, 7168 // 8), (384, 256, 512)],
                         ids=["12-experts", "384-experts"])  # 12: an expert's gate_up at a narrower K
def test_grouped_rows_match_the_reference_and_keep_their_bits(dtype, groups, out_features, depth):
    """group_ends: each row through its expert (rows past the last end: zeros), its bits the same whether its group
    holds one row or many. Skewed draws put many rows in a few groups (more than a tile) and none in most, as routing
    does; at 384 groups the grouped grid walks its tiles group by group (linear_rows.cu grouped_tile)."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    packed = ops.pack_linear_rows(_weights(groups, out_features, depth, dtype, gen), dtype)
    for num_rows, skew in ((3, 1), (40, 1), (200, 1), (8, 4), (136, 4), (520, 4), (2056, 4)):
        odds = torch.rand(groups + 1, generator=gen) ** skew
        counts = torch.multinomial(odds, num_rows, replacement=True, generator=gen).bincount(
            minlength=groups + 1)
        ends = counts[:groups].cumsum(0).int().cuda()
        x = torch.randn(num_rows, depth, generator=gen).to("cuda", dtype)
        got = ops.linear_rows(x, packed, out_features, ends)
        want = reference.linear_rows(x[:, None], packed, out_features, ends)[:, 0]
        assert _relative(got, want) < (6e-3 if dtype == torch.bfloat16 else 1e-5), (groups, num_rows, seed)
        last = int(ends[-1])
        assert torch.equal(got[last:], torch.zeros_like(got[last:]))
        group = torch.searchsorted(ends.cpu().long(), torch.arange(num_rows), right=True)
        for m in random.Random(seed).sample(range(last), min(last, 6)):
            one = torch.zeros(groups, dtype=torch.int32)
            one[int(group[m]):] = 1
            alone = ops.linear_rows(x[m:m + 1], packed, out_features, one.cuda())
            assert torch.equal(alone[0], got[m]), (groups, num_rows, m, seed)


def test_opcheck_and_errors():
    x = torch.randn(5, 2, 24, device="cuda", dtype=torch.bfloat16)
    packed = ops.pack_linear_rows(torch.randn(2, 19, 24, device="cuda"), torch.bfloat16)
    torch.library.opcheck(torch.ops.ddtree.linear_rows.default, (x, packed, 19))
    ends = torch.tensor([2, 2, 4], dtype=torch.int32, device="cuda")
    grouped = ops.pack_linear_rows(torch.randn(3, 19, 7, device="cuda"))
    x32 = torch.randn(5, 1, 7, device="cuda")
    torch.library.opcheck(torch.ops.ddtree.linear_rows.default, (x32, grouped, 19, ends))
    with pytest.raises(RuntimeError, match="packed must be bfloat16, got float32"):
        ops.linear_rows(x, ops.pack_linear_rows(torch.randn(2, 19, 24, device="cuda")), 19)
    with pytest.raises(RuntimeError, match=r"packed must be \[G, N, K'\] for G = 2, N = out_features = 20"):
        ops.linear_rows(x, packed, 20)
    with pytest.raises(RuntimeError, match="x must be bfloat16 or float32, got float16"):
        ops.linear_rows(x.half(), packed.half(), 19)


def test_invariant_rows_on_cuda_match_the_fast_ones():
    rows = InvariantRows(torch.device("cuda"))
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    x, weight = (torch.randn(9, 300, generator=gen).to("cuda", torch.bfloat16),
                 torch.randn(70, 300, generator=gen).to("cuda", torch.bfloat16) / 17)
    assert _relative(rows.linear(x, weight), F.linear(x, weight)) < 6e-3
    assert rows.packed(weight, torch.bfloat16) is rows.packed(weight, torch.bfloat16)
    norm = torch.randn(300, generator=gen).cuda()
    assert _relative(rows.rms_norm(x, norm, 1e-6), FAST.rms_norm(x, norm, 1e-6)) < 6e-3
    q_nope, w_uk = torch.randn(9, 4, 16).cuda().bfloat16(), torch.randn(4, 16, 64).cuda().bfloat16()
    assert _relative(rows.absorb(q_nope, w_uk), FAST.absorb(q_nope, w_uk)) < 6e-3
    alone = torch.cat([rows.rms_norm(x[i:i + 1], norm, 1e-6) for i in range(len(x))])
    assert torch.equal(rows.rms_norm(x, norm, 1e-6), alone)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_batch_invariant_decodes_on_cuda_are_ar_bit_for_bit(dtype):
    """Random MoE models on the GPU: every DDTree and chain decode in the batch-invariant mode commits AR's tokens with
    AR's logits, bit for bit (InvariantRows: linear_rows for every matmul, norm and expert; verify_attn's exact
    kernel)."""
    seed = random.randrange(2**31)
    ckpt, _ = random_model(seed, dtype)
    model = TargetModel.from_checkpoint(ckpt, "cuda", dtype)
    assert isinstance(model.exact_rows, InvariantRows)
    rng = random.Random(seed)
    for _ in range(2):
        prompt = [rng.randrange(ckpt.config.vocab_size) for _ in range(rng.randint(1, 40))]
        cfg = DecodeConfig(budget=rng.choice([3, 17, 64, 200]), block_size=rng.randint(2, 12), max_new_tokens=16,
                           device="cuda", dtype=dtype, batch_invariant=True)
        ar = decode(ckpt, prompt, cfg, "ar", model=model)
        for mode in ("ddtree", "chain"):
            run = decode(ckpt, prompt, cfg, mode, DrafterSpec(noise=rng.random(), seed=rng.randrange(99)), model=model)
            assert run.tokens == ar.tokens and np.array_equal(run.logits, ar.logits), (mode, seed)
