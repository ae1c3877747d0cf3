"""ops.rms_norm_rows (csrc/cpu/rms_norm_rows.cpp, csrc/cuda/rms_norm_rows.cu) against kernels/reference.py's float64
norm on fresh random rows, on the CPU and, where there is one, on the GPU; the property the batch-invariant mode
needs: a row's bits are the same whatever the call holds; opcheck and the errors."""
from __future__ import annotations

import random

import pytest
import torch

from kernels import ops, reference

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
CASES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]
IDS = ["float32", "bfloat16", "bfloat16-weight-float32"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "weight_dtype"), CASES, ids=IDS)
def test_matches_float64_and_keeps_each_rows_bits(device, dtype, weight_dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    for width in (1, 31, 512, 1536, 7168):
        weight = (torch.rand(width, generator=gen) + 0.5).to(device, weight_dtype)
        rows = (torch.randn(300, width + 5, generator=gen) * 4).to(device, dtype)[:, 5:]  # rows strided
        got = ops.rms_norm_rows(rows, weight, 1e-6)
        want = reference.rms_norm_rows(rows, weight, 1e-6)
        assert got.dtype == dtype and got.shape == rows.shape
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.double(), want.double(), rtol=tolerance, atol=tolerance), (width, seed)
        alone = ops.rms_norm_rows(rows[7:8], weight, 1e-6)
        for num_rows in (1, 17, 65, 300):
            place = random.Random(seed + num_rows).randrange(num_rows)
            block = (torch.randn(num_rows, width, generator=gen) * 4).to(device, dtype)
            block[place] = rows[7]
            assert torch.equal(ops.rms_norm_rows(block, weight, 1e-6)[place], alone[0]), (width, num_rows, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_leading_dims_and_opcheck(device):
    x = torch.randn(3, 4, 64, device=device)
    weight = torch.rand(64, device=device)
    got = ops.rms_norm_rows(x, weight, 1e-5)
    assert got.shape == x.shape and torch.allclose(got, reference.rms_norm_rows(x, weight, 1e-5), atol=1e-5)
    torch.library.opcheck(torch.ops.ddtree.rms_norm_rows.default, (x.view(12, 64), weight, 1e-5))


def test_bad_arguments_say_what_is_wrong():
    x, weight = torch.randn(4, 8), torch.rand(8)
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got float16"):
        ops.rms_norm_rows(x.half(), weight.half(), 1e-6)
    with pytest.raises(RuntimeError, match="weight must be bfloat16 .x's dtype. or float32, got float16"):
        ops.rms_norm_rows(x.bfloat16(), weight.half(), 1e-6)
    with pytest.raises(RuntimeError, match="weight must hold D = x.size.1. = 8 entries, got 7"):
        ops.rms_norm_rows(x, weight[:7], 1e-6)
    with pytest.raises(RuntimeError, match="eps must be >= 0"):
        ops.rms_norm_rows(x, weight, -1.0)
