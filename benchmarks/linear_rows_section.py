"""bench_kernels' linear_rows section: the batch-invariant mode's matmul (kernels.ops.linear_rows) beside torch's
(F.linear, the per-head einsum, torch._grouped_mm for the routed experts: what the fast mode runs) at the Kimi-K2
projections' shapes and M = 1 (an AR step), 17, 65 and 257 rows (DDTree at B = 16, 64, 256). Each is shown against
its floor: the weights it reads (experts as touched) plus its rows in and out at the run's copy bandwidth, or its
FLOPs at the run's matmul rate where that is longer. On an H100/H200 the mma.sync kernel is timed beside the
automatic (wgmma) one. "rows == alone" says whether a call keeps a row's bits: its first row against the same row
in a call of its own. On the CPU (float32) the widths are a quarter of Kimi-K2's and the head is left out."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.common import Budget, Ceilings, Column, guarded, num_input_sets, op_setting, ratio
from kernels import ops

ERR_COLUMNS = 4096


@dataclass(slots=True, frozen=True)
class LinearShape:
    name: str
    groups: int  # G: per-head maps, or the routed experts (grouped: each row through one)
    out_features: int  # N
    depth: int  # K
    grouped: bool = False
    top_k: int = 8  # grouped: experts per token


KIMI_SHAPES = (
    LinearShape("x_proj (q_a, kv_a)", 1, 2112, 7168), LinearShape("q_b", 1, 12288, 1536),
    LinearShape("absorb (W_UK)", 64, 512, 128), LinearShape("expand (W_UV)", 64, 128, 512),
    LinearShape("o_proj", 1, 7168, 8192), LinearShape("experts gate_up (64 held)", 64, 4096, 7168, grouped=True),
    LinearShape("lm_head", 1, 163840, 7168),
)
CPU_SHAPES = (
    LinearShape("x_proj (q_a, kv_a)", 1, 528, 1792), LinearShape("absorb (W_UK)", 16, 128, 32),
    LinearShape("o_proj", 1, 1792, 2048), LinearShape("experts gate_up (16 held)", 16, 1024, 1792, grouped=True),
)
QUICK_SHAPES = (LinearShape("x_proj (q_a, kv_a)", 1, 264, 896), LinearShape("experts gate_up", 8, 128, 896, True))


@dataclass(slots=True)
class LinearSet:
    x: torch.Tensor  # [M, G, K] (grouped: [M k, 1, K], sorted by expert)
    weight: torch.Tensor  # [G, N, K]
    packed: torch.Tensor
    ends: torch.Tensor | None  # grouped: int32 [G]
    touched: int  # the groups whose weights the call reads


def _make_set(shape: LinearShape, num_rows: int, device: torch.device, dtype: torch.dtype,
              gen: torch.Generator) -> LinearSet:
    weight = (torch.randn(shape.groups, shape.out_features, shape.depth, generator=gen, device=device, dtype=dtype)
              / shape.depth ** 0.5)
    if not shape.grouped:
        x = torch.randn(num_rows, shape.groups, shape.depth, generator=gen, device=device, dtype=dtype)
        return LinearSet(x, weight, ops.pack_linear_rows(weight, dtype), None, shape.groups)
    scores = torch.rand(num_rows, shape.groups, generator=gen, device=device)
    flat = scores.topk(shape.top_k, dim=-1).indices.reshape(-1).sort().values  # the assignments by expert
    ends = torch.searchsorted(flat, torch.arange(shape.groups, device=device), right=True, out_int32=True)
    x = torch.randn(len(flat), 1, shape.depth, generator=gen, device=device, dtype=dtype)
    return LinearSet(x, weight, ops.pack_linear_rows(weight, dtype), ends, int(flat.unique().numel()))


def ours(s: LinearSet) -> torch.Tensor:
    return ops.linear_rows(s.x, s.packed, s.weight.shape[1], s.ends)


def torch_linear(s: LinearSet) -> torch.Tensor:
    """What the fast mode runs for the same rows: F.linear, the per-head einsum, or the grouped GEMM."""
    if s.ends is not None:
        return torch._grouped_mm(s.x[:, 0], s.weight.transpose(1, 2), offs=s.ends) if s.x.is_cuda else \
            torch.cat([F.linear(s.x[int(b):int(e), 0], w) for b, e, w in zip(
                torch.cat([s.ends.new_zeros(1), s.ends[:-1]]), s.ends, s.weight, strict=True)])
    if s.weight.shape[0] == 1:
        return F.linear(s.x[:, 0], s.weight[0])
    return torch.einsum("mgk,gnk->mgn", s.x, s.weight)


def _first_row_alone(fn: Callable[[LinearSet], torch.Tensor], s: LinearSet) -> bool:
    """Whether the call's first row has the bits it has in a call of that row alone."""
    full = fn(s).reshape(s.x.shape[0], -1)[0]
    if s.ends is None:
        one = LinearSet(s.x[:1], s.weight, s.packed, None, s.touched)
    else:
        ends = (s.ends > 0).int()  # the first row's expert: the first group with rows
        one = LinearSet(s.x[:1], s.weight, s.packed, ends, 1)
    return bool(torch.equal(fn(one).reshape(1, -1)[0], full))


def linear_case(shape: LinearShape, num_rows: int, device: torch.device, dtype: torch.dtype, budget: Budget,
                ceil: Ceilings, measure, gen: torch.Generator) -> dict:
    one = _make_set(shape, num_rows, device, dtype, gen)
    rows = one.x.shape[0]
    weight_bytes = one.touched * shape.out_features * shape.depth * dtype.itemsize
    num_bytes = weight_bytes + rows * (shape.depth + shape.out_features) * dtype.itemsize * (
        1 if shape.grouped else shape.groups)
    flops = 2 * rows * shape.out_features * shape.depth * (1 if shape.grouped else shape.groups)
    sets = [one] + [_make_set(shape, num_rows, device, dtype, gen) for _ in range(num_input_sets(num_bytes) - 1)]
    err = None
    if not shape.grouped:  # against float64 on the first ERR_COLUMNS columns (the head's 163840 would take 9 GB)
        want = torch.einsum("mgk,gnk->mgn", one.x.double(), one.weight[:, :ERR_COLUMNS].double())
        err = float((ours(one)[..., :ERR_COLUMNS].double() - want).norm() / want.norm())
    mine, base = measure(ours, sets, device, budget), measure(torch_linear, sets, device, budget)
    mma = None
    if ops.wgmma_runs(device, dtype):  # the mma.sync kernel, which other GPUs run, for the record
        with op_setting("DDTREE_LINEAR_ROWS_KERNEL", "mma"):
            mma = measure(ours, sets, device, budget)
    floor_us = ceil.floor_us(num_bytes, flops)
    print(f"  linear_rows {shape.name:28s} M={num_rows:4d}: ours {mine.us:9.1f} us  torch {base.us:9.1f} us  "
          f"floor {floor_us:8.1f} us" + (f"  mma.sync {mma.us:9.1f} us" if mma else ""), flush=True)
    return {"shape": shape.name, "G": shape.groups, "N": shape.out_features, "K": shape.depth, "M": num_rows,
            "rows": rows, "touched": one.touched, "dtype": str(dtype).removeprefix("torch."), "ours_us": mine.us,
            "torch_us": base.us, "ours_over_torch": ratio(mine.us, base.us), "floor_us": floor_us,
            "ours_over_floor": ratio(mine.us, floor_us), "torch_over_floor": ratio(base.us, floor_us),
            "mma_us": mma.us if mma else None, "mma_over_ours": ratio(mma.us, mine.us) if mma else None,
            "ours_eager_us": mine.eager_us, "bytes": num_bytes, "err_ours": err,
            "ours_invariant": _first_row_alone(ours, one), "torch_invariant": _first_row_alone(torch_linear, one),
            "num_sets": len(sets),
            "timings": {"ours": mine.timings, "torch": base.timings, **({"mma": mma.timings} if mma else {})}}


def bench_linear_rows(device: torch.device, dtype: torch.dtype, quick: bool, budget: Budget, ceil: Ceilings,
                      measure) -> list[dict]:
    shapes = QUICK_SHAPES if quick else (KIMI_SHAPES if device.type == "cuda" else CPU_SHAPES)
    counts = (1, 17) if quick else ((1, 17, 65, 257) if device.type == "cuda" else (1, 17, 65))
    gen = torch.Generator(device=device).manual_seed(0)
    return [guarded({"shape": s.name, "M": m}, lambda s=s, m=m: linear_case(s, m, device, dtype, budget, ceil,
                                                                            measure, gen))
            for s in shapes for m in counts]


LINEAR_COLUMNS = [
    Column("shape", "matmul", "{}"), Column("G", "G", "{}"), Column("N", "N", "{}"), Column("K", "K", "{}"),
    Column("M", "M", "{}"), Column("touched", "weights read", "{}"), Column("ours_us", "ours us", "{:.1f}"),
    Column("torch_us", "torch us", "{:.1f}"), Column("ours_over_torch", "ours/torch", "{:.2f}"),
    Column("floor_us", "floor us", "{:.1f}"), Column("ours_over_floor", "ours/floor", "{:.2f}"),
    Column("torch_over_floor", "torch/floor", "{:.2f}"), Column("mma_us", "mma.sync us", "{:.1f}"),
    Column("ours_invariant", "ours rows == alone", "{}"),
    Column("torch_invariant", "torch rows == alone", "{}"), Column("err_ours", "err ours", "{:.1e}"),
]
