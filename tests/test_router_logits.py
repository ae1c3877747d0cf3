"""ops.router_logits (csrc/cpu/router_logits.cpp, csrc/cuda/router_logits.cu), the MoE router's float32 logits, on
fresh random rows: kernels/reference.py's float64 within the rounding of H terms; bit for bit an independent numpy
emulation of the order the contract names (32 fused-multiply-add chains, then the butterfly), on inputs where float64
computes each fused multiply-add exactly; each row's bits the same alone and inside any call (batch-invariant); on the
GPU bit for bit the CPU kernel, strided, unaligned and over many row tiles; opcheck, no host sync and the errors."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from host_sync import assert_no_host_sync

from kernels import ops, reference

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
DTYPES = [torch.float32, torch.bfloat16]
LANES, CHUNK = 32, 4  # the contract's chains and the columns a chain takes at a time


def _rows(num_rows: int, width: int, dtype: torch.dtype, gen: torch.Generator, offset: int = 0,
          device: str = "cpu") -> torch.Tensor:
    """x [num_rows, width] of dtype on device; a column offset makes its rows strided and, for most offsets,
    unaligned (sliced on the device: a copy there would be a fresh, aligned tensor)."""
    return torch.randn(num_rows, width + offset, generator=gen).to(device, dtype)[:, offset:]


def _emulated(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The contract's order in numpy: chain l's fused multiply-adds over its columns, each one product plus sum in
    float64 rounded once to float32 (exact as one fused operation where float64 holds a * b + c exactly), then the
    butterfly in float32."""
    width = x.shape[1]
    step = CHUNK if width % CHUNK == 0 else 1
    chains = np.zeros((LANES, x.shape[0], w.shape[0]), dtype=np.float32)
    for lane in range(LANES):
        for start in range(lane * step, width, LANES * step):
            for h in range(start, start + step):
                product = np.outer(x[:, h].astype(np.float64), w[:, h].astype(np.float64))
                chains[lane] = (chains[lane].astype(np.float64) + product).astype(np.float32)
    for offset in (16, 8, 4, 2, 1):
        chains = chains + chains[np.arange(LANES) ^ offset]
    return chains[0]


def _exactly_fusable(shape: tuple[int, int], mantissa_bits: int, rng: np.random.Generator) -> np.ndarray:
    """+-(1 + m / 2^bits) * 2^e, e in -2..2: products of a bfloat16 x and such a w keep under 30 bits and every sum
    of up to 256 of them stays under 2^14, so float64 holds each a * b + c exactly."""
    mantissa = 1 + rng.integers(0, 2**mantissa_bits, shape) / 2**mantissa_bits
    return (rng.choice([-1.0, 1.0], shape) * mantissa * 2.0 ** rng.integers(-2, 3, shape)).astype(np.float32)


@pytest.mark.parametrize("width", [1, 7, 64, 100, 130, 256])
def test_the_cpu_kernel_reduces_in_the_contracts_order(width):
    rng = np.random.default_rng(random.randrange(2**31))
    num_rows, num_experts = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    x = _exactly_fusable((num_rows, width), 7, rng)  # bfloat16's 8 significant bits: exact in x's dtype
    w = _exactly_fusable((num_experts, width), 20, rng)
    got = ops.router_logits(torch.from_numpy(x).bfloat16(), torch.from_numpy(w))
    np.testing.assert_array_equal(got.numpy(), _emulated(x, w))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_matches_float64_and_each_row_keeps_its_bits_in_any_call(device, dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for width, num_experts in ((1, 3), (6, 5), (64, 8), (7168, 384), (7170, 33)):
        num_rows = rng.choice([1, rng.randint(2, 40)])
        x = _rows(num_rows, width, dtype, gen, rng.choice([0, 0, 1, 4]), device)
        w = torch.randn(num_experts, width, generator=gen).to(device) / width**0.5
        got = ops.router_logits(x, w)
        where = (width, num_experts, num_rows, seed)
        assert got.shape == (num_rows, num_experts) and got.dtype == torch.float32 and got.is_contiguous(), where
        want = reference.router_logits(x, w)
        bound = (x.double().abs() @ w.double().abs().T) * (width + LANES) * 2.0**-24
        assert ((got.double() - want).abs() <= bound + 1e-30).all(), where
        order = torch.randperm(num_rows, generator=gen).to(device)
        assert torch.equal(ops.router_logits(x[order], w), got[order]), where
        for n in (0, num_rows - 1):
            assert torch.equal(ops.router_logits(x[n:n + 1], w), got[n:n + 1]), where


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "bfloat16"])
def test_cuda_equals_the_cpu_kernel_bit_for_bit(dtype):
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    # every tile of the kernel (1 x 4 rows to 32, 4 x 4 to 96, 4 x 8 to 192, 8 x 8), experts past a tile's end
    for width, num_experts, num_rows, offset in ((7168, 384, 1, 0), (7168, 384, 17, 0), (7168, 384, 257, 0),
                                                 (7168, 384, 33, 1), (7168, 384, 65, 0), (7168, 70, 129, 0),
                                                 (4096, 8, 5, 4), (130, 70, 40, 0), (130, 37, 200, 4),
                                                 (7, 5, 3, 0), (1, 1, 1, 0)):
        x = _rows(num_rows, width, dtype, gen, offset, "cuda")
        w = torch.randn(num_experts, width, generator=gen).cuda() / width**0.5
        assert torch.equal(ops.router_logits(x, w).cpu(), ops.router_logits(x.cpu(), w.cpu())), \
            (width, num_experts, num_rows, offset, seed)
    unaligned = torch.randn(1 + 8 * 72, generator=gen).cuda()[1:].view(8, 72)  # contiguous, 4 bytes past 16
    x = _rows(3, 72, dtype, gen, 0, "cuda")
    assert torch.equal(ops.router_logits(x, unaligned).cpu(), ops.router_logits(x.cpu(), unaligned.cpu()))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows_and_opcheck(device):
    x, w = torch.randn(5, 24, device=device), torch.randn(7, 24, device=device)
    assert ops.router_logits(x[:0], w).shape == (0, 7)
    torch.library.opcheck(ops._ops().router_logits.default, (x, w))
    torch.library.opcheck(ops._ops().router_logits.default, (x.bfloat16(), w))


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    assert_no_host_sync(ops._ops().router_logits, (torch.randn(9, 7168, device="cuda").bfloat16(),
                                                   torch.randn(384, 7168, device="cuda")))


def test_bad_arguments_say_what_is_wrong():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="weight \\(the router, float32\\) must be float32, got bfloat16"):
        ops.router_logits(x, w.bfloat16())
    with pytest.raises(RuntimeError, match="weight \\[E, H\\] must have x's H = 8 columns"):
        ops.router_logits(x, torch.randn(3, 9))
    with pytest.raises(RuntimeError, match="weight must be contiguous"):
        ops.router_logits(x, torch.randn(8, 3).t())
    with pytest.raises(RuntimeError, match="x must be float32 or bfloat16, got float16"):
        ops.router_logits(x.half(), w)
    with pytest.raises(RuntimeError, match="x's rows must be contiguous"):
        ops.router_logits(torch.randn(8, 4).t(), torch.randn(3, 4))
    with pytest.raises(RuntimeError, match="weight \\[E, H\\] needs at least one expert"):
        ops.router_logits(x, torch.randn(0, 8))
    with pytest.raises(RuntimeError, match="x must be 2-dim"):
        ops.router_logits(torch.randn(8), w)
