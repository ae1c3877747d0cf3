"""What the batch-invariant mode costs on the shipped pair: its decode steps beside the fast mode's.

For AR and DDTree at B = 16 and 64 (the pair's DFlash drafter) on one held-out prompt: the median ms of a step in
each mode, the two modes' decoders interleaved in --rounds rounds (so that a slow moment of the machine hits both
alike), their ratio, and whether every decode committed its mode's AR tokens (the batch-invariant ones must, bit
for bit; the fast ones up to a numerics near tie). On CUDA the steps replay a captured graph. The batch-invariant
mode computes every row as AR does (engine/model/batch_rows.py: every matmul one row-invariant kernels.ops.linear_rows
call over all rows, on the CPU and CUDA), so this is the price of DDTree == AR bit for bit.

    python -m benchmarks.bench_exact [--device cuda|cpu] [--quick] [--rounds N] [--steps N] [--out DIR]
"""
from __future__ import annotations

import statistics
import sys
from collections.abc import Sequence

import torch

from benchmarks.common import (
    Column,
    markdown_table,
    parse_args,
    ratio,
    resolve_device,
    start_run,
    text_table,
    write_results,
)
from benchmarks.decode_steps import time_steps
from engine.config import DecodeConfig
from engine.decoding.session import make_decoder
from engine.drafters import DrafterSpec
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.loading import load_model
from engine.loaders.shipped import DEFAULT_MODEL
from engine.model.target import TargetModel

ROWS = (("ar", 0), ("ddtree", 16), ("ddtree", 64))
NEW_TOKENS = 600  # room for the decodes' steps (at most 16 tokens a step)


def timed_steps(ckpt, model: TargetModel, prompt: list[int], cfg: DecodeConfig, mode: str, spec: DrafterSpec,
                 num_steps: int) -> tuple[list[float], list[int]]:
    """ms of num_steps steps after a first one (on CUDA captured as a graph after it), and the tokens committed."""
    dec = make_decoder(ckpt, prompt, cfg, mode, spec, model=model, continuation=[], cuda_graph=cfg.device == "cuda")
    dec.advance()
    if cfg.device == "cuda":
        dec.capture_graph()
    ms = time_steps(dec.advance, num_steps, model.device)
    return ms, dec.generated[: int(dec.num_generated)].tolist()


def same_prefix(ar: list[int], run: list[int]) -> bool:
    """Whether a decode's tokens are AR's over the tokens both committed."""
    n = min(len(ar), len(run))
    return ar[:n] == run[:n]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args("the batch-invariant mode's decode steps beside the fast mode's, on the shipped pair", argv,
                      lambda p: (p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)"),
                                 p.add_argument("--steps", type=int, default=8, help="timed steps per decode")))
    if args.rounds < 1 or args.steps < 1:
        raise SystemExit(f"--rounds and --steps must be >= 1, got {args.rounds} and {args.steps}")
    device = resolve_device(args.device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    info = start_run("bench_exact", "benchmarks.bench_exact", argv, device, getattr(torch, dtype), args.quick)
    rows_plan, rounds, steps = (ROWS[:2], 1, 2) if args.quick else (ROWS, args.rounds, args.steps)
    ckpt = load_model(DEFAULT_MODEL)
    model = TargetModel.from_checkpoint(ckpt, device.type, dtype)
    spec = DrafterSpec("dflash", model=str(dflash_dir_beside(DEFAULT_MODEL)))
    prompt = ckpt.tokenizer.encode(ckpt.prompt_texts[0])
    times: dict[tuple, list[float]] = {}
    tokens: dict[tuple, list[int]] = {}
    for _ in range(rounds):
        for mode, budget in rows_plan:
            for exact in (False, True):
                cfg = DecodeConfig(budget=budget, block_size=16, max_new_tokens=NEW_TOKENS, device=device.type,
                                   dtype=dtype, batch_invariant=exact)
                ms, committed = timed_steps(ckpt, model, prompt, cfg, mode, spec, steps)
                times.setdefault((mode, budget, exact), []).extend(ms)
                tokens[(mode, budget, exact)] = committed
    rows = []
    for mode, budget in rows_plan:
        fast, exact = (statistics.median(times[(mode, budget, e)]) for e in (False, True))
        rows.append({"mode": "AR" if mode == "ar" else "DDTree", "budget": budget or None, "fast_ms": fast,
                     "exact_ms": exact, "ratio": ratio(exact, fast),
                     "fast_tokens_match_ar": same_prefix(tokens[("ar", 0, False)], tokens[(mode, budget, False)]),
                     "exact_tokens_match_ar": same_prefix(tokens[("ar", 0, True)], tokens[(mode, budget, True)])})
    columns = [Column("mode", "mode"), Column("budget", "B", "{}"), Column("fast_ms", "fast ms/step", "{:.2f}"),
               Column("exact_ms", "batch-invariant ms/step", "{:.2f}"), Column("ratio", "batch-inv. / fast", "{:.2f}"),
               Column("fast_tokens_match_ar", "fast == AR"), Column("exact_tokens_match_ar", "batch-inv. == AR")]
    setup = (f"{DEFAULT_MODEL.name} + its DFlash drafter (block 16), held-out prompt 0, {device.type} {dtype}; median "
             f"of {rounds} x {steps} steps per mode, the modes interleaved; "
             f"{'graph replays' if device.type == 'cuda' else 'eager'}")
    print(f"\n{setup}\n\n{text_table(rows, columns)}\n")
    json_path, md_path = write_results(args.out, f"exact-{device.type}", info, {"setup": setup, "rows": rows},
                                       {"setup": setup, "steps": markdown_table(rows, columns)})
    failed = [f"{r['mode']} B={r['budget']}" for r in rows if not r["exact_tokens_match_ar"]]
    print(f"wrote {json_path} and {md_path}" + (f"; batch-invariant tokens left AR's: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
