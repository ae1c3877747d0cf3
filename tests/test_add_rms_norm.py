"""ops.add_rms_norm (csrc/cpu/add_rms_norm.cpp, csrc/cuda/add_rms_norm.cu) on fresh random rows, on the CPU and, where
there is one, on the GPU: its sum bit for bit torch's add and its norm bit for bit ops.rms_norm_rows of that sum (the
two launches it fuses), kernels/reference.py's float64 within a tolerance, a row's bits whatever the call holds;
leading dims, opcheck, no host sync on the GPU, and the errors."""
from __future__ import annotations

import random

import pytest
import torch
from host_sync import assert_no_host_sync

from kernels import ops, reference

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
CASES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]
IDS = ["float32", "bfloat16", "bfloat16-weight-float32"]
EPS = 1e-6


def _rows(gen: torch.Generator, num_rows: int, width: int, offset: int, device: str, dtype: torch.dtype
          ) -> torch.Tensor:
    """[num_rows, width] columns offset.. of a wider tensor: rows strided, 16-byte aligned only where offset allows."""
    return (torch.randn(num_rows, width + offset, generator=gen) * 3).to(device, dtype)[:, offset:]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "weight_dtype"), CASES, ids=IDS)
def test_matches_the_add_and_norm_it_fuses_bit_for_bit(device, dtype, weight_dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for width in (1, 31, 512, 1536, 7168):
        for num_rows in (1, rng.randint(2, 40), rng.randint(250, 300)):
            x = _rows(gen, num_rows, width, rng.choice([0, 0, 3, 8]), device, dtype)
            delta = _rows(gen, num_rows, width, rng.choice([0, 5]), device, dtype)
            weight = (torch.rand(width, generator=gen) + 0.5).to(device, weight_dtype)
            total, normed = ops.add_rms_norm(x, delta, weight, EPS)
            want = x + delta
            where = (width, num_rows, seed)
            assert total.dtype == dtype and normed.shape == x.shape and total.is_contiguous(), where
            assert torch.equal(total, want), where
            assert torch.equal(normed, ops.rms_norm_rows(want, weight, EPS)), where
            ref_total, ref_normed = reference.add_rms_norm(x, delta, weight, EPS)
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            assert torch.allclose(total.double(), ref_total.double(), rtol=tolerance, atol=tolerance), where
            assert torch.allclose(normed.double(), ref_normed.double(), rtol=tolerance, atol=tolerance), where


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_bits_do_not_depend_on_the_call(device):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    x, delta = _rows(gen, 1, 7168, 0, device, torch.bfloat16), _rows(gen, 1, 7168, 0, device, torch.bfloat16)
    weight = (torch.rand(7168, generator=gen) + 0.5).to(device, torch.bfloat16)
    alone = ops.add_rms_norm(x, delta, weight, EPS)
    for num_rows in (2, 17, 257):
        place = random.Random(seed + num_rows).randrange(num_rows)
        xs, deltas = (_rows(gen, num_rows, 7168, 0, device, torch.bfloat16) for _ in range(2))
        xs[place], deltas[place] = x[0], delta[0]
        total, normed = ops.add_rms_norm(xs, deltas, weight, EPS)
        assert torch.equal(total[place], alone[0][0]) and torch.equal(normed[place], alone[1][0]), (num_rows, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_and_opcheck(device):
    x, delta, weight = torch.randn(3, 4, 64, device=device), torch.randn(3, 4, 64, device=device), torch.rand(64)
    total, normed = ops.add_rms_norm(x, delta, weight.to(device), 1e-5)
    assert total.shape == normed.shape == x.shape
    assert torch.allclose(normed, reference.rms_norm_rows(x + delta, weight.to(device), 1e-5), atol=1e-5)
    torch.library.opcheck(ops._ops().add_rms_norm.default, (x.view(12, 64), delta.view(12, 64), weight.to(device),
                                                            1e-5))


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    x, delta = torch.randn(9, 7168, device="cuda").bfloat16(), torch.randn(9, 7168, device="cuda").bfloat16()
    assert_no_host_sync(ops._ops().add_rms_norm, (x, delta, torch.rand(7168, device="cuda"), EPS))


def test_bad_arguments_say_what_is_wrong():
    x, delta, weight = torch.randn(4, 8), torch.randn(4, 8), torch.rand(8)
    with pytest.raises(RuntimeError, match=r"delta \(x's dtype\) must be bfloat16, got float32"):
        ops.add_rms_norm(x.bfloat16(), delta, weight, 1e-6)
    with pytest.raises(RuntimeError, match=r"delta must have x's shape \[4, 8\], got \[4, 7\]"):
        ops.add_rms_norm(x, delta[:, :7], weight, 1e-6)
    with pytest.raises(RuntimeError, match="delta's rows must be contiguous"):
        ops.add_rms_norm(x, delta.t().contiguous().t(), weight, 1e-6)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got float16"):
        ops.add_rms_norm(x.half(), delta.half(), weight, 1e-6)
    with pytest.raises(RuntimeError, match="weight must hold D = x.size.1. = 8 entries, got 7"):
        ops.add_rms_norm(x, delta, weight[:7], 1e-6)
    with pytest.raises(RuntimeError, match="eps must be >= 0"):
        ops.add_rms_norm(x, delta, weight, -1.0)


@pytest.mark.cuda
@needs_cuda
def test_cuda_arguments_on_two_devices_raise():
    x = torch.randn(4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="delta is on cpu but x is on cuda"):
        ops.add_rms_norm(x, torch.randn(4, 8), torch.rand(8, device="cuda"), 1e-6)
