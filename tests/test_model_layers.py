"""The layer functions (engine/model/layers.py) against float64 formulas of their own: RMSNorm, and RoPE in both
layouts through each of its forms (ops.head_norm_rope without autograd; under autograd real arithmetic on the CPU and
a complex multiply on CUDA), on the CPU and, where there is one, on the GPU; and the fast mode's per-head matmul
(engine/model/batch_rows.py per_head_matmul: absorbed attention's W_UK and W_UV) against float64 einsum."""
from __future__ import annotations

import random

import pytest
import torch

from engine.model.batch_rows import per_head_matmul
from engine.model.layers import _rope_complex, apply_rope, rms_norm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def rope64(x: torch.Tensor, angles: torch.Tensor, interleave: bool) -> torch.Tensor:
    """Each pair rotated by its angle in float64: (j, j + P/2), or (j, j + 1) with the result in evens-then-odds."""
    x, angles = x.double(), angles.double()
    half = x.shape[-1] // 2
    first, second = (x[..., 0::2], x[..., 1::2]) if interleave else (x[..., :half], x[..., half:])
    shape = (angles.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    c, s = angles.cos().view(shape), angles.sin().view(shape)
    return torch.cat([first * c - second * s, second * c + first * s], dim=-1)


def trainer_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """apply_rope under autograd: torch's forms, not the op (which has no backward)."""
    return apply_rope(x.float().clone().requires_grad_(), cos, sin, interleave).detach().to(x.dtype)


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rope_matches_float64_in_both_layouts_and_both_forms(device, dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for shape in ((1, 64), (17, 8, 64), (5, 3, 2, 16), (65, 64, 64)):
        x = torch.randn(*shape, generator=gen).to(device, dtype)
        angles = (torch.rand(shape[0], shape[-1] // 2, generator=gen) * 50).to(device)
        for interleave in (False, True):
            want = rope64(x, angles, interleave)
            for form in (apply_rope, trainer_rope, _rope_complex):
                got = form(x, angles.cos(), angles.sin(), interleave)
                assert got.shape == x.shape and got.dtype == dtype and got.device == x.device
                assert _error(got, want) < TOLERANCE[dtype], (form.__name__, shape, interleave, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_rms_norm_matches_float64(device, dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for shape in ((1, 7168), (17, 512), (3, 8, 128)):
        x = (torch.randn(*shape, generator=gen) * 3).to(device, dtype)
        weight = (torch.rand(shape[-1], generator=gen) + 0.5).to(device, dtype)
        x64 = x.double()
        want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
        got = rms_norm(x, weight, 1e-6)
        assert got.shape == x.shape and got.dtype == dtype
        assert _error(got, want) < TOLERANCE[dtype], (shape, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_per_head_matmul_matches_float64_einsum_in_rows_layout_with_and_without_autograd(device, dtype):
    """x as the target holds it (q_nope a slice of q's heads; o_lat contiguous), the weight as W_UK [H, a, b] or
    W_UV transposed: [N, H, b] out (contiguous on CUDA, where it skips einsum's copy); under autograd the same values
    and a gradient."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    n, h, a, b = random.choice([1, 5, 17]), random.choice([1, 3, 4]), random.choice([8, 16]), random.choice([8, 32])
    q = torch.randn(n, h, a + 4, generator=gen).to(device, dtype)
    for x, w in ((q[:, :, :a], torch.randn(h, a, b, generator=gen).to(device, dtype)),
                 (q[:, :, :a].contiguous(), torch.randn(h, b, a, generator=gen).to(device, dtype).transpose(1, 2))):
        got = per_head_matmul(x, w)
        want = torch.einsum("nha,hab->nhb", x.double(), w.double())
        assert got.shape == (n, h, b) and got.dtype == dtype and (got.is_contiguous() or device == "cpu"), seed
        assert _error(got, want) < TOLERANCE[dtype], seed
        leaf = w.detach().clone().requires_grad_()
        traced = per_head_matmul(x, leaf)
        traced.float().sum().backward()
        assert _error(traced.detach(), want) < TOLERANCE[dtype] and leaf.grad is not None, seed
