"""ops.context_write (csrc/cpu/context_write.cpp, csrc/cuda/context_write.cu) on fresh random rows, on the CPU and,
where there is one, on the GPU: the written cache rows bit for bit those of the launches it fuses (the positions'
add, the angles' gather, ops.head_norm_rope and two index_copy_) with every other row untouched, and
kernels/reference.py's float64 within a tolerance; kv a column view of a wider output; on the GPU positions outside
the cache skipped, no host sync and a captured graph replayed at new starts; the CPU's position and argument errors
(nothing written), opcheck."""
from __future__ import annotations

import random
import re

import pytest
import torch
from host_sync import assert_no_host_sync

from kernels import ops, reference
from kernels.graph_capture import capture

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
CASES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float32)]
IDS = ["float32", "bfloat16", "bfloat16-norm-float32"]
EPS = 1e-6


def _write(rng: random.Random, gen: torch.Generator, device: str, dtype: torch.dtype, norm_dtype: torch.dtype,
           num_rows: int, num_layers: int, num_kv_heads: int, dim: int) -> dict:
    """One context write, in the op's argument order: kv the last 2 G D columns of a wider output, a start at random
    with room for the n rows in both the cache and the angle table, the cache filled with noise."""
    groups = num_layers * num_kv_heads
    lead = rng.choice([0, 3, 64])
    wide = (torch.randn(num_rows, lead + 2 * groups * dim, generator=gen) * 3).to(device, dtype)
    num_cache_rows = num_rows + rng.randint(0, 40)
    num_angles = num_cache_rows + rng.randint(-rng.randint(0, num_cache_rows - num_rows), 9)
    angles = torch.rand(num_angles, dim // 2, generator=gen) * 100
    shape = (num_layers, num_cache_rows, num_kv_heads, dim)
    return {
        "kv": wide[:, lead:],
        "k_norm": (torch.rand(groups, dim, generator=gen) + 0.5).to(device, norm_dtype),
        "rope": torch.stack([angles.cos(), angles.sin()]).to(device),
        "start": torch.tensor(rng.randint(0, min(num_cache_rows, num_angles) - num_rows), device=device),
        "eps": EPS,
        "keys": torch.randn(shape, generator=gen).to(device, dtype),
        "values": torch.randn(shape, generator=gen).to(device, dtype),
    }


def _unfused(write: dict, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The launches context_write fuses, on copies of the cache (the rows where valid is True, when given)."""
    kv, keys, values = write["kv"], write["keys"].clone(), write["values"].clone()
    num_layers, _, num_kv_heads, dim = keys.shape
    n, width = kv.shape[0], num_layers * num_kv_heads * dim
    positions = write["start"] + torch.arange(n, device=kv.device)
    if valid is not None:
        kv, positions = kv[valid], positions[valid]
        n = kv.shape[0]
    cos, sin = write["rope"][:, positions.clamp(0, write["rope"].shape[1] - 1)]
    turned = ops.head_norm_rope(kv[:, :width].view(n, -1, dim), write["k_norm"], cos, sin, write["eps"])
    shape = (n, num_layers, num_kv_heads, dim)
    keys.index_copy_(1, positions, turned.view(shape).transpose(0, 1))
    values.index_copy_(1, positions, kv[:, width:].reshape(shape).transpose(0, 1))
    return keys, values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "norm_dtype"), CASES, ids=IDS)
def test_matches_the_launches_it_fuses_bit_for_bit(device, dtype, norm_dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for num_layers, num_kv_heads, dim in [(6, 8, 128), (1, 1, 2), (3, 2, 64), (2, 4, 512), (5, 3, 10)]:
        num_rows = rng.choice([1, 9, rng.randint(2, 70)])
        write = _write(rng, gen, device, dtype, norm_dtype, num_rows, num_layers, num_kv_heads, dim)
        want_keys, want_values = _unfused(write)
        before_keys = write["keys"].clone()
        ops.context_write(**write)
        where = (num_rows, num_layers, num_kv_heads, dim, seed)
        assert torch.equal(write["keys"], want_keys), where
        assert torch.equal(write["values"], want_values), where
        start = int(write["start"])
        untouched = torch.ones(write["keys"].shape[1], dtype=torch.bool)
        untouched[start:start + num_rows] = False
        assert torch.equal(write["keys"][:, untouched], before_keys[:, untouched]), where


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "norm_dtype"), CASES, ids=IDS)
def test_matches_the_float64_reference(device, dtype, norm_dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for num_layers, num_kv_heads, dim in [(6, 8, 128), (2, 3, 16)]:
        write = _write(rng, gen, device, dtype, norm_dtype, rng.randint(1, 40), num_layers, num_kv_heads, dim)
        want = write | {"keys": write["keys"].clone(), "values": write["values"].clone()}
        ops.context_write(**write)
        reference.context_write(**want)
        for name in ("keys", "values"):
            got, expected = write[name].double(), want[name].double()
            assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance), (name, dim, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_skips_positions_outside_the_cache_or_the_angles():
    """Where the CPU op raises, the CUDA one writes the rows that fit and leaves the cache alone past them."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(12):
        write = _write(rng, gen, "cuda", torch.bfloat16, torch.float32, rng.randint(2, 30), 2, 4, 128)
        n, limit = write["kv"].shape[0], min(write["keys"].shape[1], write["rope"].shape[1])
        start = rng.choice([-rng.randint(1, n - 1), limit - rng.randint(1, n - 1)])
        write["start"].fill_(start)
        positions = start + torch.arange(n, device="cuda")
        want_keys, want_values = _unfused(write, (positions >= 0) & (positions < limit))
        ops.context_write(**write)
        assert torch.equal(write["keys"], want_keys) and torch.equal(write["values"], want_values), (case, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    write = _write(random.Random(0), torch.Generator().manual_seed(0), "cuda", torch.bfloat16, torch.bfloat16, 9, 6, 8,
                   128)
    assert_no_host_sync(ops.context_write, tuple(write.values()))


@pytest.mark.cuda
@needs_cuda
def test_cuda_writes_rows_in_a_replayed_graph():
    """Captured once over fixed buffers; each replay writes new rows at a new start."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    write = _write(rng, gen, "cuda", torch.bfloat16, torch.bfloat16, 9, 6, 8, 128)
    graph, _ = capture(lambda: ops.context_write(**(write | {"keys": write["keys"].clone(),
                                                            "values": write["values"].clone()})),
                       lambda: ops.context_write(**write))
    limit = min(write["keys"].shape[1], write["rope"].shape[1])
    for replay in range(6):
        write["kv"].copy_(torch.randn(write["kv"].shape, generator=gen).to("cuda", torch.bfloat16))
        write["start"].fill_(rng.randint(0, limit - 9))
        want_keys, want_values = _unfused(write)
        graph.replay()
        assert torch.equal(write["keys"], want_keys) and torch.equal(write["values"], want_values), (replay, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    write = _write(random.Random(0), torch.Generator().manual_seed(0), device, torch.float32, torch.float32, 5, 2, 3,
                   8)
    op = ops._ops().context_write.default  # through the loader, so the op and its fake exist when this test runs alone
    torch.library.opcheck(op, tuple(write.values()))


def _small() -> dict:
    """n = 3 rows, 2 layers x 1 head of D = 4, S = 6 cache rows, angles of 8 positions, start 2; float32."""
    write = _write(random.Random(1), torch.Generator().manual_seed(1), "cpu", torch.float32, torch.float32, 3, 2, 1, 4)
    angles = torch.rand(8, 2)
    return write | {"rope": torch.stack([angles.cos(), angles.sin()]), "start": torch.tensor(2),
                    "keys": torch.randn(2, 6, 1, 4), "values": torch.randn(2, 6, 1, 4)}


BAD = [
    (lambda w: w | {"start": torch.tensor(4)}, "the positions start .. start + n - 1 = 4 .. 6 must lie in [0, 6)"),
    (lambda w: w | {"start": torch.tensor(-1)}, "the positions start .. start + n - 1 = -1 .. 1 must lie in [0, 6)"),
    (lambda w: w | {"rope": w["rope"][:, :4].contiguous()}, "must lie in [0, 4): the cache holds S = 6 rows"),
    (lambda w: w | {"start": torch.tensor([2])}, "start must be a 0-dim int64 tensor"),
    (lambda w: w | {"start": torch.tensor(2.0)}, "start must be a 0-dim int64 tensor"),
    (lambda w: w | {"kv": w["kv"][:, :-1]}, "kv must hold 2 G D = 2 x 2 x 4 = 16 columns"),
    (lambda w: w | {"kv": w["kv"].double()}, "kv must be float32 or bfloat16, got float64"),
    (lambda w: w | {"kv": w["kv"].t().contiguous().t()}, "kv's rows must be contiguous"),
    (lambda w: w | {"keys": w["keys"].bfloat16()}, "keys must be float32, got bfloat16"),
    (lambda w: w | {"values": w["values"][:, :5].contiguous()}, "values must have keys' shape"),
    (lambda w: w | {"keys": w["keys"][:, ::2]}, "keys must be contiguous"),
    (lambda w: w | {"keys": w["keys"][..., :3].contiguous(), "values": w["values"][..., :3].contiguous()},
     "the head dim D = keys.size(3) must be even"),
    (lambda w: w | {"k_norm": w["k_norm"][:1]}, "k_norm must be [G, D] = [2, 4], got [1, 4]"),
    (lambda w: w | {"k_norm": w["k_norm"].bfloat16()}, "weight"),
    (lambda w: w | {"rope": w["rope"][:1]}, "rope must be [2, P, D/2] with D/2 = 2"),
    (lambda w: w | {"rope": w["rope"].double()}, "rope must be float32, got float64"),
    (lambda w: w | {"eps": -1.0}, "eps must be >= 0"),
]


@pytest.mark.parametrize(("change", "message"), BAD)
def test_the_cpu_op_refuses_bad_arguments_and_writes_nothing(change, message):
    write = change(_small())
    keys, values = write["keys"].clone(), write["values"].clone()
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ops.context_write(**write)
    assert torch.equal(write["keys"], keys) and torch.equal(write["values"], values)
