"""Kernel benchmarks at Kimi-K2 shapes, each side by side with its baseline.

verify_attn: ours vs the plain-torch absorbed attention (einsum scores + masked_fill + softmax + einsum) on
the same inputs: time, TB/s, TFLOP/s, roofline fraction, torch/ours; beside them the batch-invariant mode
(batch_invariant=True) and its ratio to ours; where FlashInfer imports (never a requirement), its MLA prefix
pass alone and the whole verify done with it (benchmarks/flashinfer_mla.py), each against ours and checked
against the float64 reference; elsewhere each run prints that it is skipped. tree_build: ours vs a Python heapq build
of the same algorithm over torch.topk, and vs our CPU op on a CPU copy, at V=163840 and again at the tiny
fixture's V=512 (tree_build_tiny). tree_accept and kv_compact: ours vs the plain-torch references of
kernels/reference.py. verify_attn_splits: the batch-invariant verify_attn at each split target beside the fast one
(benchmarks/exact_splits_section.py). linear_rows: the batch-invariant mode's matmul vs torch's at the Kimi-K2
projections' shapes, each against its floor (benchmarks/linear_rows_section.py). On CUDA, "ours" and the torch
attention are timed as CUDA-graph replays (device time) and as eager calls (CUDA events, launch gaps included). On an
H100/H200 the verify_attn table also times the mma.sync kernel (DDTREE_VERIFY_ATTN_KERNEL=mma) beside the automatic
choice (wgmma), and on CUDA the tree_build table times the op with the heap's serial pops (DDTREE_TREE_BUILD=heap)
beside the automatic choice (the threshold build).

    python -m benchmarks.bench_kernels [--device cuda|cpu] [--quick] [--out DIR] [--sections verify_attn,...]
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from benchmarks.baselines import (
    HEADS,
    RANK,
    ROPE,
    SCALE,
    AttnSet,
    attn_cost,
    attn_sets,
    exact_attention,
    float64_attention,
    heapq_tree_build,
    ours_attention,
    torch_attention,
)
from benchmarks.common import (
    FULL,
    QUICK,
    Budget,
    Ceilings,
    Column,
    guarded,
    markdown_table,
    num_failed,
    num_input_sets,
    op_setting,
    parse_args,
    ratio,
    resolve_device,
    start_run,
    text_table,
    time_calls,
    time_replays,
    time_wall,
    write_results,
)
from benchmarks.exact_splits_section import SPLITS_COLUMNS, bench_exact_splits
from benchmarks.flashinfer_mla import FlashInferVerify
from benchmarks.flashinfer_mla import load as load_flashinfer
from benchmarks.linear_rows_section import LINEAR_COLUMNS, bench_linear_rows
from kernels import ops, reference

CPU_FULL = Budget(warmup=2, min_reps=5, max_reps=200, target_ms=500.0)


@dataclass(slots=True, frozen=True)
class Grid:
    attn_nodes: tuple[int, ...]  # N
    attn_rows: tuple[int, ...]  # S (prefix_len = S - N)
    vocab: int  # V
    draft_depths: int  # L
    build_budgets: tuple[int, ...]
    accept_budgets: tuple[int, ...]
    cache_layers: int
    cache_rows: int
    tiny_vocab: int = 512  # the tiny fixture's V: tree_build_tiny times the build budgets there too


def make_grid(device: torch.device, quick: bool) -> Grid:
    if quick:
        return Grid((1, 8), (256, 1024), 163840, 15, (16, 256), (64,), 2, 1024)
    if device.type == "cuda":
        return Grid((1, 8, 32, 65, 129, 257), (1024, 4096, 16384, 32768), 163840, 15, (16, 64, 256, 1024),
                    (64, 1024), 8, 32768)
    return Grid((1, 8, 32, 65), (256, 1024, 4096), 163840, 15, (16, 64, 256, 1024), (64, 1024), 8, 8192)


@dataclass(slots=True)
class Measured:
    """Ours or a baseline: the headline time (graph replay on CUDA when it captures) and the eager time."""

    us: float
    eager_us: float | None
    timings: dict


def measure(fn: Callable[[Any], object], sets: Sequence[Any], device: torch.device, budget: Budget,
            graph: bool = True) -> Measured:
    if device.type != "cuda":
        t = time_calls(fn, sets, device, budget)
        return Measured(t.median_us, None, {"wall": t.to_dict()})
    if not graph:  # ends on the host: wall time, device synchronised around each call
        t = time_wall(fn, sets, device, budget)
        return Measured(t.median_us, None, {"wall": t.to_dict()})
    eager = time_calls(fn, sets, device, budget)
    replay = time_replays(fn, sets, budget)
    timings = {"events": eager.to_dict(), "graph": replay.to_dict() if replay else None}
    return Measured(replay.median_us if replay else eager.median_us, eager.median_us, timings)


def random_draft(depth: int, vocab: int, device: torch.device, sharpness: float) -> torch.Tensor:
    """[depth, vocab] float32 log-probs of random logits times sharpness: the larger, the more peaked the
    distributions and the deeper the best-first tree (a trained drafter's trees are several levels deep)."""
    return torch.log_softmax(sharpness * torch.randn(depth, vocab, device=device), dim=-1)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    ref = ref.double()
    return float((x.double() - ref).norm() / ref.norm())


# -- verify_attn ---------------------------------------------------------------------------------------------

def verify_attn_case(n: int, s: int, device: torch.device, dtype: torch.dtype, budget: Budget, ceil: Ceilings,
                     rng: np.random.Generator, flashinfer=None) -> dict:
    sets = attn_sets(n, s, dtype, device, rng)
    one = sets[0]
    num_bytes, flops = attn_cost(n, s, dtype.itemsize, int(one.block_mask.sum()))
    ref_o, ref_lse = float64_attention(one)
    o, lse = ours_attention(one)
    errors = {"err_ours": rel_err(o, ref_o), "err_torch": rel_err(torch_attention(one), ref_o),
              "err_exact": rel_err(exact_attention(one)[0], ref_o),
              "lse_max_abs_err_ours": float((lse.double() - ref_lse).abs().max())}
    fi, fi_timings = flashinfer_case(flashinfer, one, sets, ref_o, device, budget) if flashinfer else ({}, {})
    del ref_o, ref_lse, o, lse
    ours = measure(ours_attention, sets, device, budget)
    base = measure(torch_attention, sets, device, budget)
    exact = measure(exact_attention, sets, device, budget)
    mma = None
    if ops.wgmma_runs(device, dtype):  # the previous tensor-core kernel (mma.sync), for the record
        with op_setting("DDTREE_VERIFY_ATTN_KERNEL", "mma"):
            mma = measure(ours_attention, sets, device, budget)
    floor_us = ceil.floor_us(num_bytes, flops)
    extra_text = f"  mma.sync {mma.us:9.1f} us" if mma else ""
    for name in ("prefix", "verify"):
        if f"fi_{name}_us" in fi:
            extra_text += f"  FlashInfer {name} {fi[f'fi_{name}_us']:9.1f} us"
    if "fi_error" in fi:
        extra_text += f"  FlashInfer failed: {fi['fi_error']}"
    print(f"  verify_attn N={n:4d} S={s:6d}: ours {ours.us:9.1f} us  torch {base.us:9.1f} us  "
          f"torch/ours {base.us / ours.us:5.2f}  batch-invariant {exact.us:9.1f} us{extra_text}", flush=True)
    return {
        "N": n, "S": s, "prefix_len": s - n, "dtype": str(dtype).removeprefix("torch."),
        "ours_us": ours.us, "torch_us": base.us, "speedup": ratio(base.us, ours.us),
        "exact_us": exact.us, "exact_over_ours": ratio(exact.us, ours.us),
        "mma_us": mma.us if mma else None, "mma_over_ours": ratio(mma.us, ours.us) if mma else None,
        **fi, "ours_over_fi_prefix": ratio(ours.us, fi["fi_prefix_us"]) if "fi_prefix_us" in fi else None,
        "ours_eager_us": ours.eager_us, "torch_eager_us": base.eager_us,
        "speedup_eager": ratio(base.eager_us, ours.eager_us),
        "ours_tbps": num_bytes / ours.us / 1e6, "ours_tflops": flops / ours.us / 1e6,
        "torch_tflops": flops / base.us / 1e6, "floor_us": floor_us,
        "ours_roofline": floor_us / ours.us, "torch_roofline": floor_us / base.us,
        "bytes": num_bytes, "flops": flops, "flop_per_byte": flops / num_bytes, **errors,
        "num_sets": len(sets),
        "timings": {"ours": ours.timings, "torch": base.timings, "exact": exact.timings,
                    **({"mma": mma.timings} if mma else {}),
                    **fi_timings},
    }


def flashinfer_case(flashinfer, one: AttnSet, sets: Sequence[AttnSet], ref_o: torch.Tensor, device: torch.device,
                    budget: Budget) -> tuple[dict, dict]:
    """FlashInfer's columns of one verify_attn case (each pass's error and time) and their timings; a pass that fails
    leaves its error (fi_error, the first one) and loses neither the other pass nor any of ours."""
    fields: dict = {}
    timings: dict = {}
    try:
        fi = FlashInferVerify(flashinfer, one)
    except Exception as err:  # noqa: BLE001  (whatever FlashInfer raises, ours stands)
        return {"fi_error": f"{type(err).__name__}: {err}"}, {}
    passes = (("prefix", lambda a: fi.prefix(a)[0], lambda: float64_attention(prefix_only(one))[0]),
              ("verify", fi.verify, lambda: ref_o))
    for name, run, expected in passes:
        try:
            error = rel_err(run(one), expected())
            timed = measure(run, sets, device, budget)
        except Exception as err:  # noqa: BLE001
            fields.setdefault("fi_error", f"{type(err).__name__}: {err}")
            continue
        fields[f"err_fi_{name}"], fields[f"fi_{name}_us"], timings[f"fi_{name}"] = error, timed.us, timed.timings
    return fields, timings


def prefix_only(a: AttnSet) -> AttnSet:
    """The same nodes over the committed rows alone (what FlashInfer's prefix pass computes)."""
    n = a.q_lat.shape[0]
    visible = torch.cat([a.visible[:, :a.prefix], torch.zeros(n, n, dtype=torch.bool, device=a.visible.device)], 1)
    return AttnSet(a.q_lat, a.q_pe, a.ckv, a.kpe, a.prefix_len, torch.zeros_like(a.block_mask), visible, a.prefix)


def bench_verify_attn(g: Grid, device: torch.device, dtype: torch.dtype, budget: Budget, ceil: Ceilings,
                      rng: np.random.Generator) -> list[dict]:
    flashinfer = load_flashinfer()[0] if device.type == "cuda" else None
    return [guarded({"N": n, "S": s},
                    lambda n=n, s=s: verify_attn_case(n, s, device, dtype, budget, ceil, rng, flashinfer))
            for s in g.attn_rows for n in g.attn_nodes]


ATTN_COLUMNS = [
    Column("N", "N", "{}"), Column("S", "S", "{}"), Column("ours_us", "ours us", "{:.1f}"),
    Column("torch_us", "torch us", "{:.1f}"), Column("speedup", "torch/ours", "{:.2f}"),
    Column("exact_us", "batch-inv. us", "{:.1f}"), Column("exact_over_ours", "batch-inv./ours", "{:.2f}"),
    Column("mma_us", "mma.sync us", "{:.1f}"), Column("mma_over_ours", "mma.sync/ours", "{:.2f}"),
    Column("fi_prefix_us", "FlashInfer prefix us", "{:.1f}"), Column("fi_verify_us", "FlashInfer verify us", "{:.1f}"),
    Column("ours_over_fi_prefix", "ours/FI prefix", "{:.2f}"),
    Column("ours_tbps", "ours TB/s", "{:.3g}"), Column("ours_tflops", "ours TFLOP/s", "{:.3g}"),
    Column("ours_roofline", "ours roofline", "{:.0%}"), Column("torch_tflops", "torch TFLOP/s", "{:.3g}"),
    Column("torch_roofline", "torch roofline", "{:.0%}"), Column("ours_eager_us", "ours eager us", "{:.1f}"),
    Column("torch_eager_us", "torch eager us", "{:.1f}"), Column("err_ours", "err ours", "{:.1e}"),
    Column("err_torch", "err torch", "{:.1e}"), Column("err_exact", "err batch-inv.", "{:.1e}"),
    Column("err_fi_prefix", "err FI prefix", "{:.1e}"), Column("err_fi_verify", "err FI verify", "{:.1e}"),
]


# -- tree_build ----------------------------------------------------------------------------------------------

def bench_tree_build(g: Grid, vocab: int, device: torch.device, budget: Budget, ceil: Ceilings,
                     rng: np.random.Generator) -> list[dict]:
    set_bytes = g.draft_depths * vocab * 4
    num_sets = num_input_sets(set_bytes, max_sets=32)
    drafts = [random_draft(g.draft_depths, vocab, device, sharpness=4.0) for _ in range(num_sets)]
    cpu_drafts = [d.cpu() for d in drafts]
    root_id = int(rng.integers(vocab))
    root, cpu_root = torch.tensor(root_id, device=device), torch.tensor(root_id)

    def case(b: int) -> dict:
        same = [np.array_equal(x.cpu().numpy(), y)
                for x, y in zip(ops.tree_build(drafts[0], root, b), heapq_tree_build(drafts[0], root_id, b),
                                strict=True)]
        ours = measure(lambda d: ops.tree_build(d, root, b), drafts, device, budget)
        pops = None  # the same op with the heap's serial pops in place of the threshold build
        if device.type == "cuda":
            with op_setting("DDTREE_TREE_BUILD", "heap"):
                pops = measure(lambda d: ops.tree_build(d, root, b), drafts, device, budget)
        topk = measure(lambda d: torch.topk(d, min(b, vocab), dim=-1), drafts, device, budget)
        heap = measure(lambda d: heapq_tree_build(d, root_id, b), drafts, device, budget, graph=False)
        cpu_op = (measure(lambda d: ops.tree_build(d, cpu_root, b), cpu_drafts, torch.device("cpu"), budget)
                  if device.type == "cuda" else None)
        floor_us = ceil.floor_us(set_bytes, 0)
        print(f"  tree_build V={vocab:6d} B={b:5d}: ours {ours.us:9.1f} us  heapq {heap.us:9.1f} us  "
              f"heapq/ours {heap.us / ours.us:6.1f}" + (f"  heap pops {pops.us:9.1f} us" if pops else ""), flush=True)
        return {
            "B": b, "V": vocab, "L": g.draft_depths, "ours_us": ours.us, "ours_eager_us": ours.eager_us,
            "topk_us": topk.us, "pops_us": pops.us if pops else None,
            "pops_over_ours": ratio(pops.us, ours.us) if pops else None, "heapq_us": heap.us,
            "cpu_op_us": cpu_op.us if cpu_op else None,
            "heapq_over_ours": ratio(heap.us, ours.us),
            "cpu_op_over_ours": ratio(cpu_op.us, ours.us) if cpu_op else None,
            "floor_us": floor_us, "ours_roofline": floor_us / ours.us, "match_heapq": all(same),
            "num_sets": len(drafts),
            "timings": {"ours": ours.timings, "topk": topk.timings, "pops": pops.timings if pops else None,
                        "heapq": heap.timings,
                        "cpu_op": cpu_op.timings if cpu_op else None},
        }

    return [guarded({"V": vocab, "B": b}, lambda b=b: case(b)) for b in g.build_budgets]


BUILD_COLUMNS = [
    Column("V", "V", "{}"), Column("B", "B", "{}"), Column("ours_us", "ours us", "{:.1f}"),
    Column("topk_us", "torch.topk us", "{:.1f}"),
    Column("pops_us", "heap pops us", "{:.1f}"), Column("pops_over_ours", "pops/ours", "{:.2f}"),
    Column("heapq_us", "heapq us", "{:.1f}"), Column("heapq_over_ours", "heapq/ours", "{:.1f}"),
    Column("cpu_op_us", "CPU op us", "{:.1f}"), Column("cpu_op_over_ours", "CPU op/ours", "{:.1f}"),
    Column("ours_eager_us", "ours eager us", "{:.1f}"), Column("ours_roofline", "ours roofline", "{:.1%}"),
    Column("match_heapq", "same tree", "{}"),
]


# -- tree_accept and kv_compact ------------------------------------------------------------------------------

def accept_set(b: int, depth: int, device: torch.device, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
    """A best-first tree of b + 1 nodes and targets that accept down the first children to a leaf (the
    longest walk)."""
    draft = random_draft(depth, 4096, torch.device("cpu"), sharpness=6.0)
    tokens, parents, *_ = heapq_tree_build(draft, int(rng.integers(4096)), b)
    target = rng.integers(4096, size=b + 1)
    for c in range(len(parents) - 1, 0, -1):  # children after parents: the lowest index child wins
        if parents[c] >= 0:
            target[parents[c]] = tokens[c]
    return tuple(torch.from_numpy(np.asarray(x, dtype=np.int64)).to(device) for x in (tokens, parents, target))


def bench_tree_accept(g: Grid, device: torch.device, budget: Budget, rng: np.random.Generator) -> list[dict]:
    def case(b: int) -> dict:
        sets = [accept_set(b, g.draft_depths, device, rng) for _ in range(8)]  # tiny inputs: L2 cannot be avoided
        got = ops.tree_accept(*sets[0], g.draft_depths)
        want = reference.tree_accept(*sets[0], g.draft_depths)
        ours = measure(lambda s: ops.tree_accept(*s, g.draft_depths), sets, device, budget)
        ref = measure(lambda s: reference.tree_accept(*s, g.draft_depths), sets, device, budget, graph=False)
        return {"B": b, "L": g.draft_depths, "path_len": int(got.path_len), "ours_us": ours.us,
                "ours_eager_us": ours.eager_us, "ref_us": ref.us, "ref_over_ours": ratio(ref.us, ours.us),
                "match_ref": all(torch.equal(x.cpu(), y.cpu()) for x, y in zip(got, want, strict=True)),
                "num_sets": len(sets), "timings": {"ours": ours.timings, "ref": ref.timings}}

    return [guarded({"B": b}, lambda b=b: case(b)) for b in g.accept_budgets]


def bench_kv_compact(g: Grid, device: torch.device, dtype: torch.dtype, budget: Budget, ceil: Ceilings,
                     rng: np.random.Generator) -> list[dict]:
    ckv = torch.randn(g.cache_layers, g.cache_rows, RANK, device=device, dtype=dtype)  # [layers, S, R]
    kpe = torch.randn(g.cache_layers, g.cache_rows, ROPE, device=device, dtype=dtype)  # [layers, S, P]
    path_len = g.draft_depths + 1  # a fully accepted path: the most rows to move
    moved_bytes = 2 * path_len * g.cache_layers * (RANK + ROPE) * dtype.itemsize  # each row read and written

    def make_set(b: int) -> tuple[torch.Tensor, torch.Tensor]:  # prefix_len, a path into the b + 1 tree rows
        prefix = int(rng.integers(0, g.cache_rows - b - 1))
        path = np.concatenate([[0], np.sort(rng.choice(np.arange(1, b + 1), path_len - 1, replace=False))])
        return torch.tensor(prefix, device=device), torch.from_numpy(path).to(device)

    def case(b: int) -> dict:
        sets = [make_set(b) for _ in range(num_input_sets(moved_bytes))]
        mine, theirs = (ckv.clone(), kpe.clone()), (ckv.clone(), kpe.clone())
        ops.kv_compact(*mine, *sets[0])
        reference.kv_compact(*theirs, *sets[0])
        match = torch.equal(mine[0], theirs[0]) and torch.equal(mine[1], theirs[1])
        del mine, theirs
        ours = measure(lambda s: ops.kv_compact(ckv, kpe, *s), sets, device, budget)
        ref = measure(lambda s: reference.kv_compact(ckv, kpe, *s), sets, device, budget, graph=False)
        floor_us = ceil.floor_us(moved_bytes, 0)
        return {"B": b, "num_layers": g.cache_layers, "S": g.cache_rows, "path_len": path_len,
                "dtype": str(dtype).removeprefix("torch."), "ours_us": ours.us, "ours_eager_us": ours.eager_us,
                "ref_us": ref.us, "ref_over_ours": ratio(ref.us, ours.us), "bytes": moved_bytes,
                "ours_tbps": moved_bytes / ours.us / 1e6, "floor_us": floor_us, "ours_roofline": floor_us / ours.us,
                "match_ref": match, "num_sets": len(sets), "timings": {"ours": ours.timings, "ref": ref.timings}}

    return [guarded({"B": b}, lambda b=b: case(b)) for b in g.accept_budgets]


SMALL_COLUMNS = [
    Column("B", "B", "{}"), Column("path_len", "path", "{}"), Column("ours_us", "ours us", "{:.1f}"),
    Column("ref_us", "reference us", "{:.1f}"), Column("ref_over_ours", "reference/ours", "{:.1f}"),
    Column("ours_eager_us", "ours eager us", "{:.1f}"), Column("ours_tbps", "ours TB/s", "{:.3g}"),
    Column("match_ref", "same result", "{}"),
]


SECTIONS = ("verify_attn", "verify_attn_splits", "tree_build", "tree_build_tiny", "tree_accept", "kv_compact",
            "linear_rows")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args("ddtree kernel benchmarks at Kimi-K2 shapes, each against its baseline", argv,
                      lambda p: p.add_argument("--sections", default=None,
                                               help=f"comma-separated subset of {', '.join(SECTIONS)} (default: all)"))
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    budget = QUICK if args.quick else (FULL if device.type == "cuda" else CPU_FULL)
    info = start_run("bench_kernels", "benchmarks.bench_kernels", argv, device, dtype, args.quick)
    grid, ceil = make_grid(device, args.quick), info.ceilings
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    results: dict = {"grid": asdict(grid), "num_threads": torch.get_num_threads(),
                     "attention": {"heads": HEADS, "kv_lora_rank": RANK, "rope_dim": ROPE, "scale": SCALE}}
    print(f"torch threads: {torch.get_num_threads()}", flush=True)
    sections = {
        "verify_attn": (ATTN_COLUMNS, lambda: bench_verify_attn(grid, device, dtype, budget, ceil, rng)),
        "verify_attn_splits": (SPLITS_COLUMNS, lambda: bench_exact_splits(grid.attn_nodes, grid.attn_rows, device,
                                                                            dtype, budget, rng, measure)),
        "tree_build": (BUILD_COLUMNS, lambda: bench_tree_build(grid, grid.vocab, device, budget, ceil, rng)),
        "tree_build_tiny": (BUILD_COLUMNS, lambda: bench_tree_build(grid, grid.tiny_vocab, device, budget, ceil, rng)),
        "tree_accept": (SMALL_COLUMNS, lambda: bench_tree_accept(grid, device, budget, rng)),
        "kv_compact": (SMALL_COLUMNS, lambda: bench_kv_compact(grid, device, dtype, budget, ceil, rng)),
        "linear_rows": (LINEAR_COLUMNS, lambda: bench_linear_rows(device, dtype, args.quick, budget, ceil, measure)),
    }
    if args.sections:
        wanted = args.sections.split(",")
        unknown = sorted(set(wanted) - set(sections))
        if unknown:
            raise SystemExit(f"--sections: unknown {unknown}; choose from {', '.join(sections)}")
        sections = {name: sections[name] for name in wanted}
    print(load_flashinfer()[1] if device.type == "cuda" else "FlashInfer: skipped (its MLA kernel is CUDA-only)",
          flush=True)
    tables = {}
    for name, (columns, run) in sections.items():
        outcome = guarded({}, lambda run=run: {"rows": run()})
        results[name] = outcome.get("rows", [outcome])  # a section whose setup failed: one row with the error
        print(f"\n{name}\n{text_table(results[name], columns)}\n", flush=True)
        tables[name] = markdown_table(results[name], columns)
    failed = {name: num_failed(results[name]) for name in sections if num_failed(results[name])}
    results["failed"] = failed
    json_path, md_path = write_results(args.out, f"kernels-{device.type}", info, results, tables)
    print(f"wrote {json_path} and {md_path}" + (f"; FAILED cases: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
