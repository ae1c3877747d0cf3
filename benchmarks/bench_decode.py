"""End-to-end decode on a "k2-mini" model: AR vs DDTree step time, tokens/s, speedup and each stage's share.

k2-mini has Kimi-K2's attention and expert widths (hidden 7168, 64 heads, q_lora 1536, kv_lora 512, qk_nope
128, rope 64, v 128, expert width 2048, dense width 18432, vocab 163840, YaRN) but two layers (one dense, one
MoE with 8 routed experts, top-2, one shared expert), random bf16 weights made on the device. The lm_head is a
permuted copy of the embedding, so each greedy token is decided by a wide margin whatever the random layers
add: bf16 rounding cannot flip an argmax between the AR run and the tree verify, so the exact oracle's first
choice is always the target's. Nothing else depends on the weights' values: a step's work is fixed by its
shapes.

AR and DDTree decoders (B x {exact, noisy oracle}) step the same prompt, and so do the learned drafter's chain
and DDTree decoders (B again): a Kimi-K2.5-shaped DFlash drafter (hidden 7168, 64 / 8 heads, head_dim 128,
intermediate 18432, block 8; 6 layers on k2-mini, 1 tiny one with --quick) with random bf16 weights made on the
device, reading both of k2-mini's layers. Its random weights accept about nothing (tau near 1): its rows measure
what the drafter costs, its share of the step ("draft" + "draft_update"), not what a trained one gains; on a
two-layer target that share is far larger than beside Kimi-K2.5's 61 layers. Each decoder is timed as
benchmarks/decode_steps.py says: eagerly, as CUDA-graph replays, and with the stage timers on for the shares; a
fresh decoder's few steps with their records on count the bytes each stage reads, so each stage's time also shows
against its own floor at the copy bandwidth (benchmarks/stage_floors.py, profiling/stage_floor.py). The chain row's
drafter, once its eager decode ran, also times its forward and its context update each captured alone as a CUDA
graph, against the "draft" and "draft_update" floors (its JSON row's drafter_{forward,update}_{graph_ms,floor_ms,
over_floor}: None on the CPU; bench_moe's drafter table prints them).

    python -m benchmarks.bench_decode [--device cuda|cpu] [--quick] [--out DIR]
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict

import numpy as np
import torch

from benchmarks.common import (
    Column,
    guarded,
    markdown_table,
    num_failed,
    parse_args,
    ratio,
    resolve_device,
    start_run,
    text_table,
    write_results,
)
from benchmarks.decode_steps import STAGES, Plan, drafter_replays, measure_decoder
from benchmarks.stage_floors import add_drafter_part_floors, add_stage_floors, floor_columns, recorded_stage_bytes
from engine.config import DecodeConfig, ModelConfig
from engine.decoding.auto_budget import AutoBudgetDecoder
from engine.decoding.decoder import ARDecoder, DDTreeDecoder, Decoder
from engine.drafters.dflash import DFlashDrafter, context_capacity
from engine.drafters.oracle import OracleDrafter
from engine.loaders.dflash_config import DFlashConfig
from engine.model.dflash import DFlashWeights
from engine.model.dflash_fixtures import kimi_k25_layout, random_tensors
from engine.model.parallel import Shard
from engine.model.target import TargetModel
from engine.model.weights import lm_head_name, weight_shapes
from engine.records import MODE_LABELS

NOISY = 0.3  # the noisy oracle's chance to demote the true token at a position
NUM_COUNTED = 2  # steps of a fresh decoder with its records on, for the bytes each stage reads


def k2_mini() -> ModelConfig:
    yarn = {"type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
            "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    return ModelConfig(
        vocab_size=163840, hidden_size=7168, num_hidden_layers=2, num_attention_heads=64, q_lora_rank=1536,
        kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, intermediate_size=18432,
        moe_intermediate_size=2048, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
        topk_group=1, routed_scaling_factor=2.827, norm_topk_prob=True, scoring_func="sigmoid",
        first_k_dense_replace=1, rope_theta=50000.0, rope_interleave=True, rope_scaling=yarn,
        max_position_embeddings=131072)


def tiny() -> ModelConfig:
    return ModelConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=32,
        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128,
        moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
        first_k_dense_replace=1, max_position_embeddings=4096)


def dflash_layout(cfg: ModelConfig, plan: Plan) -> DFlashConfig:
    """Kimi-K2.5-DFlash's widths on k2-mini (tiny widths on the tiny model), plan.dflash_layers layers and
    plan.dflash_block_size, reading every target layer (k2-mini has two)."""
    widths = {} if cfg.hidden_size == kimi_k25_layout().hidden_size else {
        "hidden_size": cfg.hidden_size, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16}
    return kimi_k25_layout(**widths, vocab_size=cfg.vocab_size, mask_token_id=cfg.vocab_size - 2,
                           num_hidden_layers=plan.dflash_layers, block_size=plan.dflash_block_size,
                           num_target_layers=cfg.num_hidden_layers,
                           target_layer_ids=tuple(range(cfg.num_hidden_layers)))


def target_tensors(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """Weights drawn in dtype on the device, one at a time in weight_shapes order (so TargetModel stacks each
    routed expert as it arrives and the device never holds the model twice): matrices with std 1/sqrt(fan_in),
    unit norms, a standard normal embedding, and lm_head[perm[t]] = embed[t] / sqrt(hidden), so the greedy
    successor of t is perm[t]."""
    gen = torch.Generator(device=device).manual_seed(seed)
    head = lm_head_name(cfg)
    embed = None
    for name, shape in weight_shapes(cfg).items():
        if name == head:
            continue
        if len(shape) == 1:
            w = (0.05 * torch.randn(shape, generator=gen, device=device) if name.endswith("correction_bias")
                 else torch.ones(shape, device=device))
            yield name, w.to(dtype)
            continue
        w = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        if name == "model.embed_tokens.weight":
            embed = w
        yield name, w if name == "model.embed_tokens.weight" else w.mul_(shape[1] ** -0.5)
        del w
    if head != "model.embed_tokens.weight":
        perm = torch.randperm(cfg.vocab_size, generator=gen, device=device)
        yield head, torch.empty_like(embed).index_copy_(0, perm, embed * cfg.hidden_size ** -0.5)


def random_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int,
                 shard: Shard | None = None) -> TargetModel:
    """The seeded random model (the same weights on every rank; each keeps its shard's part)."""
    return TargetModel(cfg, target_tensors(cfg, device, dtype, seed), shard=shard)


def ddtree_decoder(model: TargetModel, prompt: list[int], cfg: DecodeConfig, drafter: OracleDrafter,
                   cuda_graph: bool) -> Decoder:
    return DDTreeDecoder(model, prompt, cfg, drafter, cuda_graph=cuda_graph)


def dflash_rows(model: TargetModel, prompt: list[int], plan: Plan, decode_cfg: Callable[..., DecodeConfig],
                cuda: bool, extra: Callable[[Callable[[bool], Decoder]], dict] | None = None
                ) -> tuple[DFlashConfig, list[dict]]:
    """The learned drafter's chain row and one DDTree row per budget; each decoder gets a drafter of its own (the
    drafter keeps the decode's context), all over one set of random weights. The chain row also times its drafter's
    forward and context update as CUDA-graph replays once its eager decode ran (decode_steps.drafter_replays).
    extra(make) adds fields to a row (bench_moe: the experts a fresh decoder's verifies touch)."""
    layout = dflash_layout(model.cfg, plan)
    weights = DFlashWeights.from_tensors(layout, random_tensors(layout, 0, model.device, model.dtype))

    def make(mode: str, budget: int, graph: bool) -> Decoder:
        cfg = decode_cfg(budget, plan.max_new_tokens, layout.block_size)
        capacity = context_capacity(len(prompt), cfg.max_new_tokens, cfg.block_size)
        drafter = DFlashDrafter(layout, weights, model, cfg.num_draft_positions, capacity, "random Kimi-K2.5-shaped")
        if mode == "auto":  # the budget chosen every step, up to the largest fixed one
            return AutoBudgetDecoder(model, prompt, cfg, drafter, cuda_graph=graph)
        return Decoder(model, prompt, cfg, mode, drafter, cuda_graph=graph)

    rows = []
    largest = max(plan.budgets)
    for mode, budget in [("chain", None), *(("ddtree", b) for b in plan.budgets), ("auto", largest)]:
        key = {"mode": MODE_LABELS["ddtree" if mode == "auto" else mode], "budget": "auto" if mode == "auto"
               else budget, "noise": None, "drafter": "dflash"}
        build = functools.partial(make, mode, budget or 0)
        window = plan.auto_tokens if mode == "auto" else 0
        parts = drafter_replays if mode == "chain" else None
        rows.append(guarded(key, lambda key=key, build=build, window=window, parts=parts: {
            **key, **measure_decoder(build, plan, cuda, window, parts), **(extra(build) if extra else {})}))
        if "error" not in rows[-1]:
            share = rows[-1]["stage_share"]["drafter"]
            where = f" B={budget}" if budget is not None else ""
            graphs = "".join(f", {part} graph {rows[-1][f'drafter_{part}_graph_ms']:.3f} ms"
                             for part in ("forward", "update") if rows[-1].get(f"drafter_{part}_graph_ms"))
            print(f"  dflash {key['mode']}{where}: eager {rows[-1]['eager_step_ms']:.3f} ms/step, drafter "
                  f"{share:.1%} of the step{graphs}", flush=True)
    return layout, rows


def run_decode(cfg: ModelConfig, plan: Plan, device: torch.device, dtype: torch.dtype) -> dict:
    """The AR row first (its tokens are the oracle's continuation), then one row per budget and oracle, then the
    learned drafter's rows."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(cfg.vocab_size, size=plan.prompt_len).tolist()
    model = random_model(cfg, device, dtype, seed=0)
    cuda = device.type == "cuda"
    need = plan.max_new_tokens + plan.block_size  # continuation the drafters look into
    dtype_name = str(dtype).removeprefix("torch.")

    def decode_cfg(budget: int, max_new_tokens: int, block_size: int = plan.block_size,
                   batch_invariant: bool = False) -> DecodeConfig:
        return DecodeConfig(budget=budget, block_size=block_size, max_new_tokens=max_new_tokens,
                            device=device.type, dtype=dtype_name, batch_invariant=batch_invariant)

    def ar_continuation(ar_cfg: DecodeConfig) -> tuple[list[int], float]:
        """The AR tokens (untimed) the oracle reads and the rows are checked against, and the prefill's ms."""
        ar_dec = ARDecoder(model, prompt, ar_cfg)
        while int(ar_dec.num_generated) < need:
            ar_dec.advance()
        return ar_dec.generated[:need].cpu().tolist(), ar_dec.prefill_ns / 1e6

    ar_cfg = decode_cfg(0, need + plan.block_size)
    continuation, prefill_ms = ar_continuation(ar_cfg)
    def make_ar(graph: bool) -> Decoder:
        return ARDecoder(model, prompt, ar_cfg, cuda_graph=graph)

    ar = {**measure_decoder(make_ar, plan, cuda), **recorded_stage_bytes(make_ar, NUM_COUNTED)}
    rows = [{"mode": "AR", "budget": 0, "noise": None, "drafter": None, **ar}]
    for noise in plan.noises:
        drafter = OracleDrafter(continuation, cfg.vocab_size, plan.block_size - 1, noise=noise, seed=0,
                                num_positions=plan.max_new_tokens + plan.block_size, device=device)
        for budget in plan.budgets:
            make = functools.partial(ddtree_decoder, model, prompt, decode_cfg(budget, plan.max_new_tokens), drafter)
            key = {"mode": "DDTree", "budget": budget, "noise": noise, "drafter": "oracle"}
            rows.append(guarded(key, lambda key=key, make=make: {**key, **measure_decoder(make, plan, cuda),
                                                                 **recorded_stage_bytes(make, NUM_COUNTED)}))
            if "error" not in rows[-1]:
                print(f"  DDTree B={budget:4d} noise={noise}: eager {rows[-1]['eager_step_ms']:.3f} ms/step, "
                      f"tau {rows[-1]['tau_eager']:.2f}", flush=True)
    layout, learned = dflash_rows(model, prompt, plan, decode_cfg, cuda,
                                  lambda make: recorded_stage_bytes(make, NUM_COUNTED))
    rows += learned
    for row in rows:
        row["batch_invariant"] = False
    # The batch-invariant mode beside the fast one: AR and the exact oracle at the middle budget.
    exact_cfg = decode_cfg(0, need + plan.block_size, batch_invariant=True)
    exact_continuation, _ = ar_continuation(exact_cfg)
    budget = plan.budgets[len(plan.budgets) // 2]
    oracle = OracleDrafter(exact_continuation, cfg.vocab_size, plan.block_size - 1, noise=0.0, seed=0,
                           num_positions=plan.max_new_tokens + plan.block_size, device=device)
    for key, make in (({"mode": "AR", "budget": 0, "noise": None, "drafter": None},
                       lambda graph: ARDecoder(model, prompt, exact_cfg, cuda_graph=graph)),
                      ({"mode": "DDTree", "budget": budget, "noise": 0.0, "drafter": "oracle"},
                       functools.partial(ddtree_decoder, model, prompt,
                                         decode_cfg(budget, plan.max_new_tokens, batch_invariant=True), oracle))):
        rows.append(guarded(key, lambda key=key, make=make: {**key, **measure_decoder(make, plan, cuda),
                                                             **recorded_stage_bytes(make, NUM_COUNTED)}))
        rows[-1]["batch_invariant"] = True
        fast = next(r for r in rows if not r["batch_invariant"] and all(r[k] == key[k] for k in key))
        for mode in ("eager", "graph"):
            rows[-1][f"over_fast_{mode}"] = ratio(rows[-1].get(f"{mode}_step_ms"), fast.get(f"{mode}_step_ms"))
        if "error" not in rows[-1]:
            print(f"  batch-invariant {key['mode']} B={key['budget']}: eager {rows[-1]['eager_step_ms']:.3f} ms/step, "
                  f"{rows[-1]['over_fast_eager']:.2f}x the fast mode's", flush=True)
    for row in (r for r in rows if "error" not in r):  # every decoder commits its mode's AR tokens
        reference = exact_continuation if row["batch_invariant"] else continuation
        row["tokens_match_ar"] = all(tokens == reference[: len(tokens)] for tokens in row.pop("generated"))
        for mode in ("eager", "graph"):
            row[f"speedup_{mode}"] = ratio(row[f"{mode}_tokens_per_s"], ar[f"{mode}_tokens_per_s"])
            row[f"step_over_ar_{mode}"] = ratio(row[f"{mode}_step_ms"], ar[f"{mode}_step_ms"])
    return {"prefill_ms": prefill_ms, "prompt_len": plan.prompt_len, "rows": rows, "dflash": layout.to_dict()}


STEP_COLUMNS = [
    Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}"), Column("noise", "noise", "{:g}"),
    Column("batch_invariant", "batch-inv."), Column("tau_eager", "tau", "{:.2f}"),
    Column("eager_step_ms", "eager ms/step", "{:.3f}"),
    Column("graph_step_ms", "graph ms/step", "{:.3f}"), Column("eager_tokens_per_s", "eager tok/s", "{:.0f}"),
    Column("graph_tokens_per_s", "graph tok/s", "{:.0f}"), Column("speedup_eager", "speedup eager", "{:.2f}"),
    Column("speedup_graph", "speedup graph", "{:.2f}"), Column("step_over_ar_eager", "step/AR eager", "{:.2f}"),
    Column("step_over_ar_graph", "step/AR graph", "{:.2f}"), Column("over_fast_eager", "vs fast eager", "{:.2f}"),
    Column("over_fast_graph", "vs fast graph", "{:.2f}"), Column("tokens_match_ar", "tokens == AR"),
]
SHARE_COLUMNS = [Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}"),
                 Column("noise", "noise", "{:g}"),
                 Column("profiled_step_ms", "step ms (timed stages)", "{:.3f}")]
SHARE_COLUMNS += [Column(f"share_{name}", name, "{:.1%}") for name in STAGES]
FLOOR_COLUMNS = floor_columns(SHARE_COLUMNS[:4] + [Column("floor_ms", "step floor ms", "{:.4f}")])


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args("AR vs DDTree decode steps on the k2-mini model (tiny model with --quick)", argv)
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    info = start_run("bench_decode", "benchmarks.bench_decode", argv, device, dtype, args.quick)
    cfg = tiny() if args.quick else k2_mini()
    plan = (Plan(16, (4, 16), (0.0, NOISY), 4, 1, 3, 2, dflash_layers=1, dflash_block_size=4) if args.quick
            else Plan(256, (16, 64, 256), (0.0, NOISY), 16, 3, 20, 5, dflash_layers=6, dflash_block_size=8))
    torch.manual_seed(0)
    results = {"model_name": "tiny" if args.quick else "k2-mini", "model": cfg.to_dict(), "plan": asdict(plan),
               **run_decode(cfg, plan, device, dtype)}
    add_stage_floors(results["rows"], info.ceilings.copy_tbps * 1e12)
    add_drafter_part_floors(results["rows"])
    results["ar_floor_ms"] = results["rows"][0].get("floor_ms")
    rows = [{**row, **{f"share_{k}": v for k, v in row.get("stage_share", {}).items()}} for row in results["rows"]]
    setup = (f"{results['model_name']}, {info.ceilings.dtype}, prompt {plan.prompt_len} tokens (prefill "
             f"{results['prefill_ms']:.1f} ms), {plan.num_steps} timed steps per "
             f"decoder, block size {plan.block_size} for the oracle, {results['dflash']['block_size']} for the "
             f"learned drafter ({results['dflash']['num_hidden_layers']} layers); AR step floor (the bytes its stages "
             f"read at the copy bandwidth) {results['ar_floor_ms'] or 0:.3f} ms")
    tables = {"setup": setup, "steps": markdown_table(rows, STEP_COLUMNS),
              "stage shares (eager, stage timers on)": markdown_table(rows, SHARE_COLUMNS),
              "stages against their floor (stage timers on; floor: the bytes each stage reads)":
                  markdown_table(rows, FLOOR_COLUMNS)}
    print(f"\n{setup}\n\n{text_table(rows, STEP_COLUMNS)}\n\n{text_table(rows, SHARE_COLUMNS)}\n\n"
          f"stages against their floor (ms; x: stage time / floor)\n{text_table(rows, FLOOR_COLUMNS)}\n")
    json_path, md_path = write_results(args.out, f"decode-{device.type}", info, results, tables)
    for row in results["rows"]:
        if row.get("graph_error"):
            print(f"FAILED graph replay of {row['mode']} B={row['budget']} noise={row['noise']}: {row['graph_error']}")
    failed = num_failed(results["rows"]) + sum(bool(r.get("graph_error")) for r in results["rows"])
    print(f"wrote {json_path} and {md_path}" + (f"; {failed} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
