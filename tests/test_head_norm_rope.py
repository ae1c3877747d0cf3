"""ops.head_norm_rope (csrc/cpu/head_norm_rope.cpp, csrc/cuda/head_norm_rope.cu) against kernels/reference.py's
float64 norm and RoPE, and against the torch functions it fuses (engine.model.layers rms_norm and apply_rope's
trainer forms), on fresh random heads: a slice of a wider row, per-head weights in either dtype, the RoPE alone of
strided heads in both layouts and a row's bits alone and among others; opcheck and the errors."""
from __future__ import annotations

import random

import pytest
import torch

from engine.model.layers import apply_rope, rms_norm
from kernels import ops, reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "weight_dtype"), CASES, ids=["float32", "bfloat16", "bfloat16-weight-float32"])
def test_matches_float64_and_the_unfused_functions(device, dtype, weight_dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for rows, heads, dim in [(8, 72, 128), (17, 12, 32), (3, 5, 2), (1, 1, 512), (40, 3, 64)]:
        x = (torch.randn(rows, heads + 3, dim, generator=gen) * 3).to(device, dtype)[:, 1:heads + 1]  # rows strided
        weight = (torch.rand(heads, dim, generator=gen) + 0.5).to(device, weight_dtype)
        angles = torch.rand(rows, dim // 2, generator=gen) * 100
        cos, sin = angles.cos().to(device), angles.sin().to(device)
        got = ops.head_norm_rope(x, weight, cos, sin, 1e-6)
        want = reference.head_norm_rope(x, weight, cos, sin, 1e-6)
        assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        assert torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance), (rows, heads, dim, seed)
        if weight_dtype == dtype:  # one weight for every head: torch's rms_norm, then its rotate-half RoPE
            same = weight[:1].expand(heads, dim).contiguous()
            unfused = apply_rope(rms_norm(x, same[0], 1e-6), cos, sin, False)
            assert torch.allclose(ops.head_norm_rope(x, same, cos, sin, 1e-6).double(), unfused.double(),
                                  rtol=tolerance, atol=tolerance), (rows, heads, dim, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rope_alone_of_strided_heads_in_both_layouts(device, dtype):
    """No weight: the target's RoPE of q_pe (the last P dims of each head of a wider projection, heads strided) and of
    k_pe (one head, a slice of a fused row), against float64 and the torch forms the trainers use."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for rows, heads, nope, dim in [(1, 64, 128, 64), (17, 8, 16, 32), (65, 3, 0, 2), (4, 1, 512, 64)]:
        wide = (torch.randn(rows, heads, nope + dim + 5, generator=gen) * 3).to(device, dtype)
        x = wide[:, :, nope:nope + dim]  # rows and heads strided, each head's dims contiguous
        angles = torch.rand(rows, dim // 2, generator=gen) * 100
        cos, sin = angles.cos().to(device), angles.sin().to(device)
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2
        for interleave in (False, True):
            got = ops.head_norm_rope(x, None, cos, sin, 0.0, interleave)
            want = reference.head_norm_rope(x, None, cos, sin, 0.0, interleave)
            assert got.dtype == dtype and got.shape == x.shape and got.is_contiguous()
            where = (rows, heads, dim, interleave, seed)
            assert torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance), where
            trainer = apply_rope(x.clone().requires_grad_(), cos, sin, interleave)
            assert torch.allclose(got.double(), trainer.detach().double(), rtol=tolerance, atol=tolerance), where
            assert torch.equal(ops.head_norm_rope(x[:1], None, cos[:1], sin[:1], 0.0, interleave), got[:1]), where


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x = torch.randn(4, 6, 32, device=device)
    weight, angles = torch.rand(6, 32, device=device), torch.rand(4, 16, device=device)
    torch.library.opcheck(torch.ops.ddtree.head_norm_rope.default, (x, weight, angles.cos(), angles.sin(), 1e-6))
    torch.library.opcheck(torch.ops.ddtree.head_norm_rope.default,
                          (torch.randn(4, 6, 48, device=device)[..., 16:], None, angles.cos(), angles.sin(), 0.0, True))


def test_bad_arguments_say_what_is_wrong():
    x, weight, cos, sin = torch.randn(4, 6, 32), torch.rand(6, 32), torch.rand(4, 16), torch.rand(4, 16)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got float16"):
        ops.head_norm_rope(x.half(), weight, cos, sin, 1e-6)
    with pytest.raises(RuntimeError, match="the head dim D = x.size.2. must be even and in .2, 512., got 33"):
        ops.head_norm_rope(torch.randn(4, 6, 33), torch.rand(6, 33), cos, sin, 1e-6)
    with pytest.raises(RuntimeError, match="must be even and in .2, 512., got 514"):
        ops.head_norm_rope(torch.randn(4, 6, 514), torch.rand(6, 514), torch.rand(4, 257), torch.rand(4, 257), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be .H, D. = .6, 32., got"):
        ops.head_norm_rope(x, weight[:5], cos, sin, 1e-6)
    with pytest.raises(RuntimeError, match="weight must be bfloat16 .x's dtype. or float32, got float16"):
        ops.head_norm_rope(x.bfloat16(), weight.half(), cos, sin, 1e-6)
    with pytest.raises(RuntimeError, match="cos must be .M, D/2. = .4, 16., got"):
        ops.head_norm_rope(x, weight, cos[:3], sin, 1e-6)
    with pytest.raises(RuntimeError, match="sin must be float32"):
        ops.head_norm_rope(x, weight, cos, sin.double(), 1e-6)
    with pytest.raises(RuntimeError, match="each head of x must be contiguous .x.stride.2. == 1., got strides"):
        ops.head_norm_rope(torch.randn(4, 6, 64)[..., ::2], weight, cos, sin, 1e-6)
    with pytest.raises(RuntimeError, match="eps must be >= 0"):
        ops.head_norm_rope(x, weight, cos, sin, -1.0)
