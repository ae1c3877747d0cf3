"""ops.silu_mul (csrc/cpu/silu_mul.cpp, csrc/cuda/silu_mul.cu), SwiGLU's activation, on fresh random rows on the CPU
and, where there is one, on the GPU: kernels/reference.py's float64 within a tolerance; on the GPU bit for bit torch's
F.silu(gate) * up (the two launches it replaces), on the CPU within an ulp of them; rows strided or not (the vector and
element paths), more rows than a grid dimension's 65,535; leading dims, opcheck, no host sync, and the errors."""
from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from host_sync import assert_no_host_sync

from kernels import ops, reference

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
DTYPES = [torch.float32, torch.bfloat16]
ULP = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-7}  # relative: one unit in the last place, at most


def _torch(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_matches_float64_and_torchs_two_kernels(device, dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for width in (1, 3, 8, 64, 2048, 18432):
        for num_rows in (1, rng.randint(2, 40), rng.randint(250, 300)):
            offset = rng.choice([0, 0, 1, 8])  # a column offset makes rows strided and, unless 8, unaligned
            wide = (torch.randn(num_rows, 2 * width + offset, generator=gen) * 4).to(device, dtype)
            gate_up = wide[:, offset:]
            got = ops.silu_mul(gate_up)
            where = (width, num_rows, offset, seed)
            assert got.shape == (num_rows, width) and got.dtype == dtype and got.is_contiguous(), where
            want = reference.silu_mul(gate_up)
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            assert torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance), where
            theirs = _torch(gate_up)
            if device == "cuda":
                assert torch.equal(got, theirs), where
            else:  # torch's CPU exp is a vector polynomial, ours the libm one: the silu may round one ulp apart
                assert torch.allclose(got.double(), theirs.double(), rtol=3 * ULP[dtype], atol=1e-30), where


@pytest.mark.cuda
@needs_cuda
def test_cuda_takes_more_rows_than_a_grid_dimension():
    gate_up = torch.randn(70_000, 16, device="cuda").bfloat16()
    assert torch.equal(ops.silu_mul(gate_up), _torch(gate_up))
    assert torch.equal(ops.silu_mul(gate_up[:, 1:15]), _torch(gate_up[:, 1:15]))  # the element path


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_empty_rows_and_opcheck(device):
    gate_up = torch.randn(3, 5, 24, device=device)
    got = ops.silu_mul(gate_up)
    assert got.shape == (3, 5, 12)
    assert torch.allclose(got, reference.silu_mul(gate_up), atol=1e-6)
    assert ops.silu_mul(torch.randn(0, 24, device=device)).shape == (0, 12)
    torch.library.opcheck(ops._ops().silu_mul.default, (gate_up.view(15, 24),))


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    assert_no_host_sync(ops._ops().silu_mul, (torch.randn(9, 4096, device="cuda").bfloat16(),))


def test_bad_arguments_say_what_is_wrong():
    with pytest.raises(RuntimeError, match="gate_up must hold an even number of columns"):
        ops.silu_mul(torch.randn(4, 7))
    with pytest.raises(RuntimeError, match="gate_up must be float32 or bfloat16, got float16"):
        ops.silu_mul(torch.randn(4, 8).half())
    with pytest.raises(RuntimeError, match="gate_up's rows must be contiguous"):
        ops.silu_mul(torch.randn(8, 4).t())
    with pytest.raises(RuntimeError, match="gate_up must be 2-dim"):
        ops._ops().silu_mul(torch.randn(8))
