"""ops.latent_write (csrc/cpu/latent_write.cpp, csrc/cuda/latent_write.cu) on fresh random blocks, on the CPU and,
where there is one, on the GPU: the written cache rows bit for bit those of the ops it fuses (ops.rms_norm_rows and
ops.head_norm_rope, then index_copy_) with every other row untouched, and kernels/reference.py's float64 within a
tolerance; kv a strided column view of a wider projection, rows at a stride; on the GPU rows outside the cache skipped,
no host sync and a captured graph replayed over new blocks; the CPU's row and argument errors (nothing written),
opcheck."""
from __future__ import annotations

import itertools
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
IDS = ["float32", "bfloat16", "bfloat16-weight-float32"]
EPS = 1e-6  # the target's LATENT_NORM_EPS


def _block(rng: random.Random, gen: torch.Generator, device: str, dtype: torch.dtype, weight_dtype: torch.dtype,
           num_rows: int, lat_dim: int, rope_dim: int, interleave: bool, strided_rows: bool
           ) -> dict[str, torch.Tensor | float | bool]:
    """One layer's write, in the op's argument order: kv the c_kv | k_pe columns of a wider projection output
    [N, q_rows + R + P] (q_rows random, so kv's rows are not always 16-byte aligned), N distinct cache rows drawn at
    random from S >= N, the cache filled with noise; with strided_rows, rows every other entry of a longer tensor."""
    q_rows = rng.choice([0, 3, 24, 192])
    wide = (torch.randn(num_rows, q_rows + lat_dim + rope_dim, generator=gen) * 3).to(device, dtype)
    angles = torch.rand(num_rows, rope_dim // 2, generator=gen) * 100
    num_cache_rows = num_rows + rng.randint(0, 2 * num_rows + 5)
    rows = torch.randperm(num_cache_rows, generator=gen)[:num_rows]
    if strided_rows:
        longer = torch.full((2 * num_rows,), -1)
        longer[::2] = rows
        rows = longer.to(device)[::2]
    return {
        "kv": wide[:, q_rows:],
        "weight": (torch.rand(lat_dim, generator=gen) + 0.5).to(device, weight_dtype),
        "cos": angles.cos().to(device),
        "sin": angles.sin().to(device),
        "eps": EPS,
        "interleave": interleave,
        "ckv": torch.randn(num_cache_rows, lat_dim, generator=gen).to(device, dtype),
        "kpe": torch.randn(num_cache_rows, rope_dim, generator=gen).to(device, dtype),
        "rows": rows.to(device),
    }


def _unfused(block: dict, valid: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The four launches latent_write fuses, on copies of the cache: ops.rms_norm_rows of kv's first R columns and
    ops.head_norm_rope (no weight) of its last P, each row alone in both ops, written with index_copy_ (only the
    rows where valid is True, when given)."""
    kv, ckv, kpe, rows = block["kv"], block["ckv"].clone(), block["kpe"].clone(), block["rows"]
    lat_dim = ckv.shape[1]
    c = ops.rms_norm_rows(kv[:, :lat_dim], block["weight"], block["eps"])
    k = ops.head_norm_rope(kv[:, None, lat_dim:], None, block["cos"], block["sin"], 0.0, block["interleave"])[:, 0]
    if valid is not None:
        c, k, rows = c[valid], k[valid], rows[valid]
    ckv.index_copy_(0, rows, c)
    kpe.index_copy_(0, rows, k)
    return ckv, kpe


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "weight_dtype"), CASES, ids=IDS)
def test_matches_the_ops_it_fuses_bit_for_bit(device, dtype, weight_dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    shapes = itertools.product((512, 64, 24), (64, 8), (False, True))
    for case, (lat_dim, rope_dim, interleave) in enumerate(shapes):
        num_rows = (1, rng.randint(2, 64), rng.randint(280, 320))[case % 3]
        block = _block(rng, gen, device, dtype, weight_dtype, num_rows, lat_dim, rope_dim, interleave, case % 4 >= 2)
        want_ckv, want_kpe = _unfused(block)
        before_ckv, before_kpe = block["ckv"].clone(), block["kpe"].clone()
        ops.latent_write(**block)
        where = (num_rows, lat_dim, rope_dim, interleave, seed)
        assert torch.equal(block["ckv"], want_ckv), where
        assert torch.equal(block["kpe"], want_kpe), where
        untouched = torch.ones(block["ckv"].shape[0], dtype=torch.bool, device=device)
        untouched[block["rows"]] = False
        assert torch.equal(block["ckv"][untouched], before_ckv[untouched]), where
        assert torch.equal(block["kpe"][untouched], before_kpe[untouched]), where


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("dtype", "weight_dtype"), CASES, ids=IDS)
def test_matches_the_float64_reference(device, dtype, weight_dtype):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for lat_dim, rope_dim, interleave in [(512, 64, True), (64, 8, False), (24, 64, False), (512, 8, True)]:
        num_rows = rng.randint(1, 80)
        block = _block(rng, gen, device, dtype, weight_dtype, num_rows, lat_dim, rope_dim, interleave, False)
        want = block | {"ckv": block["ckv"].clone(), "kpe": block["kpe"].clone()}
        ops.latent_write(**block)
        reference.latent_write(**want)
        where = (num_rows, lat_dim, rope_dim, interleave, seed)
        for name in ("ckv", "kpe"):
            got, expected = block[name].double(), want[name].double()
            assert torch.allclose(got, expected, rtol=tolerance, atol=tolerance), (name, *where)


@pytest.mark.cuda
@needs_cuda
def test_cuda_skips_rows_outside_the_cache():
    """Where the CPU op raises, the CUDA one writes the other rows and leaves the cache alone at the bad ones."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(20):
        block = _block(rng, gen, "cuda", torch.bfloat16, torch.float32, rng.randint(2, 40), 512, 64, case % 2 == 1,
                       case % 4 >= 2)
        num_rows, num_cache_rows = block["kv"].shape[0], block["ckv"].shape[0]
        bad = rng.sample(range(num_rows), rng.randint(1, num_rows))
        for i in bad:
            block["rows"][i] = rng.choice([-1, -5, num_cache_rows, num_cache_rows + 9])
        valid = torch.ones(num_rows, dtype=torch.bool, device="cuda")
        valid[bad] = False
        want_ckv, want_kpe = _unfused(block, valid)
        ops.latent_write(**block)
        assert torch.equal(block["ckv"], want_ckv) and torch.equal(block["kpe"], want_kpe), (case, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    block = _block(random.Random(0), torch.Generator().manual_seed(0), "cuda", torch.bfloat16, torch.bfloat16, 9, 512,
                   64, True, False)
    assert_no_host_sync(ops.latent_write, tuple(block.values()))


@pytest.mark.cuda
@needs_cuda
def test_cuda_writes_blocks_in_a_replayed_graph():
    """Captured once over fixed buffers; each replay writes a new block's kv at new cache rows."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    block = _block(rng, gen, "cuda", torch.bfloat16, torch.bfloat16, 16, 512, 64, True, False)
    graph, _ = capture(lambda: ops.latent_write(**(block | {"ckv": block["ckv"].clone(), "kpe": block["kpe"].clone()})),
                       lambda: ops.latent_write(**block))
    for replay in range(6):
        fresh = _block(rng, gen, "cuda", torch.bfloat16, torch.bfloat16, 16, 512, 64, True, False)
        for name in ("kv", "cos", "sin"):
            block[name].copy_(fresh[name])
        block["rows"].copy_(torch.randperm(block["ckv"].shape[0], generator=gen)[:16])
        want_ckv, want_kpe = _unfused(block)
        graph.replay()
        assert torch.equal(block["ckv"], want_ckv) and torch.equal(block["kpe"], want_kpe), (replay, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_arguments_on_two_devices_raise():
    block = _block(random.Random(0), torch.Generator().manual_seed(0), "cuda", torch.float32, torch.float32, 3, 8, 4,
                   False, False)
    with pytest.raises(RuntimeError, match="rows is on cpu but kv is on cuda"):
        ops.latent_write(**(block | {"rows": block["rows"].cpu()}))
    with pytest.raises(RuntimeError, match="ckv is on cuda:0 but kv is on cpu"):
        ops.latent_write(**(block | {"kv": block["kv"].cpu(), "weight": block["weight"].cpu(),
                                     "cos": block["cos"].cpu(), "sin": block["sin"].cpu(), "kpe": block["kpe"].cpu(),
                                     "rows": block["rows"].cpu()}))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    block = _block(random.Random(0), torch.Generator().manual_seed(0), device, torch.float32, torch.float32, 5, 24, 8,
                   True, True)
    op = ops._ops().latent_write.default  # through the loader, so the op and its fake exist when this test runs alone
    torch.library.opcheck(op, tuple(block.values()))


def _small_block() -> dict:
    """N = 3 rows, R = 8, P = 4, S = 6 cache rows, float32; kv columns 5 .. 16 of a wider row."""
    return _block(random.Random(1), torch.Generator().manual_seed(1), "cpu", torch.float32, torch.float32, 3, 8, 4,
                  False, False) | {"kv": torch.randn(3, 17)[:, 5:], "ckv": torch.randn(6, 8), "kpe": torch.randn(6, 4),
                                   "rows": torch.tensor([4, 0, 2])}


def _with_row(i: int, value: int):
    def change(block):
        rows = block["rows"].clone()
        rows[i] = value
        return block | {"rows": rows}
    return change


def _bfloat16(block: dict) -> dict:
    return block | {name: block[name].bfloat16() for name in ("kv", "ckv", "kpe")}


@pytest.mark.parametrize("change, message", [
    (_with_row(1, 6), "rows[1] = 6 is not a cache row in [0, S = 6) (ckv.size(0))"),
    (_with_row(2, -1), "rows[2] = -1 is not a cache row in [0, S = 6)"),
    (lambda b: b | {"kv": b["kv"].half()}, "kv must be float32 or bfloat16, got float16"),
    (lambda b: b | {"kv": b["kv"][None]}, "kv must be 2-dim [N, R + P]"),
    (lambda b: b | {"kv": torch.randn(3, 24)[:, ::2]}, "kv's rows must be contiguous (its last stride 1)"),
    (lambda b: b | {"kv": b["kv"][:, :11]}, "kv must hold R + P = 8 + 4 = 12 columns (ckv's R, then kpe's P)"),
    (lambda b: b | {"ckv": b["ckv"].bfloat16()}, "ckv (kv's dtype) must be float32, got bfloat16"),
    (lambda b: _bfloat16(b) | {"kpe": b["kpe"]}, "kpe (kv's dtype) must be bfloat16, got float32"),
    (lambda b: b | {"ckv": b["ckv"][None]}, "ckv must be 2-dim [S, R]"),
    (lambda b: b | {"ckv": torch.randn(8, 6).t()}, "ckv must be contiguous"),
    (lambda b: b | {"kpe": b["kpe"][:, ::2]}, "kpe must be contiguous"),
    (lambda b: b | {"kpe": b["kpe"][:5]}, "kpe [S, P] and ckv [S, R] must have the same S"),
    (lambda b: b | {"ckv": b["ckv"][:, :0]}, "ckv [S, R] needs R >= 1 latent dims"),
    (lambda b: b | {"kpe": torch.randn(6, 3)}, "the rope dim P = kpe.size(1) must be even and in [2, 512], got 3"),
    (lambda b: b | {"kpe": torch.randn(6, 514)}, "the rope dim P = kpe.size(1) must be even and in [2, 512], got 514"),
    (lambda b: _bfloat16(b) | {"weight": b["weight"].half()},
     "weight must be bfloat16 (kv's dtype) or float32, got float16"),
    (lambda b: b | {"weight": b["weight"][:7]}, "weight must hold R = ckv.size(1) = 8 entries, got 7"),
    (lambda b: b | {"weight": b["weight"][None]}, "weight must be 1-dim [R]"),
    (lambda b: b | {"weight": torch.rand(16)[::2]}, "weight must be contiguous"),
    (lambda b: b | {"cos": b["cos"][:2]}, "cos must be [N, P/2] = [3, 2], got [2, 2]"),
    (lambda b: b | {"sin": b["sin"].double()}, "sin must be float32, got float64"),
    (lambda b: b | {"cos": torch.rand(2, 3).t()}, "cos must be contiguous"),
    (lambda b: b | {"rows": b["rows"].int()}, "rows must be int64, got int32"),
    (lambda b: b | {"rows": b["rows"][None]}, "rows must be 1-dim [N]"),
    (lambda b: b | {"rows": b["rows"][:2]}, "rows must hold one cache row per row of kv (N = 3), got 2"),
    (lambda b: b | {"eps": -1.0}, "eps must be >= 0, got -1"),
])
def test_cpu_errors_say_what_is_wrong_and_write_nothing(change, message):
    block = change(_small_block())
    before = {name: t.clone() for name, t in block.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ops.latent_write(**block)
    for name, t in before.items():
        assert torch.equal(block[name], t), name
