"""What DDTree does to a real MoE: Kimi-K2 layers on one GPU, AR vs DDTree steps against their memory floor.

The model has Kimi-K2's real widths (hidden 7168, 64 heads, q_lora 1536, kv_lora 512, qk_nope 128, rope 64, v 128,
384 routed experts top-8 plus 1 shared of width 2048, the first layer dense of width 18432, vocab 163840, YaRN as in
its config) and as many layers as fit the GPU's memory less HEADROOM_BYTES: 34 GB per MoE layer, so 1 dense + 3 MoE
layers on an H200 (about 108 GB) and 1 + 1 on an H100 (40 GB; layers_that_fit says). Random weights are made on the
device and streamed into the model (bench_decode.target_tensors: the lm_head is a permuted embedding, so every
greedy argmax wins by a wide margin and DDTree must commit exactly the AR tokens).

After a 4096-token prompt (its prefill time is the median over the run's prefills), AR and DDTree at B in
{16, 64, 256} with the exact and the noisy oracle step the same decode, then the learned drafter (a random-weight
DFlash drafter of Kimi-K2.5-DFlash's widths, 6 layers, block 8: bench_decode.dflash_rows) as the chain and at each
budget, timed eagerly and as CUDA-graph replays (decode_steps.measure_decoder); "speedup vs budget" draws each
drafter's speedup over AR against B, where the turn shows. A separate decoder per row then steps with its records
on, for the routed experts
each verify touched per MoE layer (StepRecord.experts) and the prefix length: each stage's floor is the bytes it
must read (profiling/stage_floor.py: the verify every weight once, the embedding's N rows, the routed experts as
touched x one expert's bytes, N + prefix_len latent cache rows per layer; the drafter its weights, the target's
lm_head and its context rows) at the measured copy bandwidth, and a step's floor is its stages' sum. The drafter
table sets each DFlash row's drafter (forward + context update, stage-timed) against its floor and as a share of the
step, measured and at Kimi-K2's 61 layers (stage_floors.add_drafter_shares); beside it the chain row's two drafter
parts, each captured alone as a CUDA graph on the chain's eager decoder once its decode ran (the cache holds its
context) and replayed (decode_steps.drafter_replays: block_logprobs; write_context of the L + 1 rows a commit
writes, at the valid length), each against its stage's floor ("draft", "draft_update"); "-" on the CPU. Uniform
routing would touch E (1 - (1 - k/E)^(B+1)) experts: the "uniform" column. The "moe layer" table times one MoE layer's
routed experts alone at N tokens (CUDA-graph replays on a GPU): sparse through the engine's grouped matmul
(engine/model/moe.py grouped_matmul: ours on an H100/H200) and through torch._grouped_mm, and the dense all-experts
reference, each against the floor of the weights it reads.

    python -m benchmarks.bench_moe [--device cuda|cpu] [--quick] [--out DIR] [--layers N]
    torchrun --nproc-per-node W -m benchmarks.bench_moe ...    # the model split over W ranks (engine/model/parallel.py)

--quick runs a small model of the same shape on the CPU in seconds (for the tests). --layers fixes the layer count
(default: what fits one GPU, so runs at W = 1, 2, 4, 8 time the same model). Under torchrun every rank decodes its
shard and rank 0 writes moe-<device>-w<W>.{json,md}: the steps table gains the share of the step in collectives
(comm), the floors are left out (they count one device reading the whole model) and so is the moe-layer table.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict

import numpy as np
import torch

from benchmarks.bench_decode import NOISY, ddtree_decoder, dflash_rows, k2_mini, random_model
from benchmarks.common import (
    FULL,
    QUICK,
    Ceilings,
    Column,
    guarded,
    markdown_table,
    num_failed,
    parse_args,
    ratio,
    resolve_device,
    start_run,
    text_table,
    time_calls,
    time_replays,
    write_results,
)
from benchmarks.decode_steps import Plan, choice_cost_us, measure_decoder
from benchmarks.graph_kernels import KERNEL_COLUMNS, kernel_rows
from benchmarks.stage_floors import (
    add_drafter_shares,
    add_rooflines,
    add_stage_floors,
    drafter_columns,
    floor_columns,
    stage_bytes,
    verify_flops,
)
from engine.config import DecodeConfig, ModelConfig, buckets_up_to
from engine.decoding.auto_budget import MAX_BACKOFF, AutoBudgetDecoder
from engine.decoding.decoder import ARDecoder, Decoder
from engine.drafters.oracle import OracleDrafter
from engine.model.moe import dense_moe, grouped_matmul, route, sparse_moe
from engine.model.parallel import init_from_env, is_collective, leave
from engine.model.read_bytes import TargetBytes
from engine.model.target import TargetModel
from engine.model.weights import weight_shapes

HEADROOM_BYTES = 30 * 10**9  # of the GPU's memory left to activations, the cache, the drafter and graphs
DFLASH_LAYERS, DFLASH_BLOCK = 6, 8  # the learned drafter's rows: Kimi-K2.5-DFlash's widths and block, 6 layers
LAYER_TOKENS = (1, 17, 65, 257)  # rows of the moe-layer table: AR and the verify of B = 16, 64, 256
AUTO_TOKENS = 2 * (MAX_BACKOFF + 1)  # an auto row's timed window: two of its longest back-offs and their probes
KERNEL_STEPS = 4  # graph steps profiled for the kernels table (AR and the largest exact-oracle tree)
KERNEL_TABLE = (f"kernels of a graph step (torch.profiler over the replays of {KERNEL_STEPS} steps; AR and the largest "
                "exact tree)")


def kimi_k2(num_layers: int) -> ModelConfig:
    """Kimi-K2's widths and routing (its config.json) with num_layers layers, the first dense."""
    return dataclasses.replace(k2_mini(), num_hidden_layers=num_layers, n_routed_experts=384, num_experts_per_tok=8)


def quick_k2() -> ModelConfig:
    """The same shape, small: 3 layers (the first dense), 32 routed experts top-4 + 1 shared."""
    return ModelConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=32, n_shared_experts=1, num_experts_per_tok=4, routed_scaling_factor=2.827,
        first_k_dense_replace=1, max_position_embeddings=4096)


def model_bytes(cfg: ModelConfig, itemsize: int) -> int:
    """Device bytes of the model: every weight in the run's dtype, plus the float32 router copies."""
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    weights = sum(math.prod(s) for s in weight_shapes(cfg).values()) * itemsize
    return weights + num_moe * cfg.n_routed_experts * cfg.hidden_size * 4


def layers_that_fit(budget: int, itemsize: int) -> int:
    """The most Kimi-K2 layers (at least 2: one dense, one MoE) whose weights fit in budget bytes."""
    layers = 2
    while model_bytes(kimi_k2(layers + 1), itemsize) <= budget:
        layers += 1
    return layers


def uniform_touched(cfg: ModelConfig, num_nodes: int) -> float:
    """Experts per MoE layer that num_nodes tokens touch when each picks k distinct experts uniformly."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    return e * (1 - (1 - k / e) ** num_nodes)


def auto_decoder(model: TargetModel, prompt: list[int], cfg: DecodeConfig, drafter: OracleDrafter,
                 cuda_graph: bool) -> Decoder:
    return AutoBudgetDecoder(model, prompt, cfg, drafter, cuda_graph=cuda_graph)


def count_experts(dec: Decoder, num_steps: int) -> dict:
    """Step with records on: mean touched experts per MoE layer and in all, mean prefix length and verified nodes,
    and the prefill."""
    records = [dec.step() for _ in range(num_steps)]
    touched = np.mean([r.experts.touched for r in records], axis=0)
    return {**stage_bytes(dec, records), **verify_flops(dec, records), "touched_per_layer": touched.tolist(),
            "touched": float(touched.sum()), "prefix_len": float(np.mean([r.prefix_len for r in records])),
            "prefill_ms": dec.prefill_ns / 1e6, "nodes_verified": float(np.mean([r.tree.num_nodes for r in records]))}


def decode_rows(model: TargetModel, plan: Plan, num_counted: int, device: torch.device) -> tuple[list[dict], list]:
    """The AR row (its tokens are the oracle's continuation), then one row per budget and oracle; the prefills."""
    cfg, cuda = model.cfg, device.type == "cuda"
    prompt = np.random.default_rng(0).integers(cfg.vocab_size, size=plan.prompt_len).tolist()
    need = plan.max_new_tokens + plan.block_size
    dtype = str(model.dtype).removeprefix("torch.")

    def decode_cfg(budget: int, max_new_tokens: int) -> DecodeConfig:
        return DecodeConfig(budget=budget, block_size=plan.block_size, max_new_tokens=max_new_tokens,
                            device=device.type, dtype=dtype)

    ar_cfg = decode_cfg(0, need + plan.block_size)
    ar_dec = ARDecoder(model, prompt, ar_cfg)
    while int(ar_dec.num_generated) < need:  # the AR continuation, untimed
        ar_dec.advance()
    continuation = ar_dec.generated[:need].cpu().tolist()
    del ar_dec
    makers = [({"mode": "AR", "budget": 0, "noise": None, "drafter": None},
               lambda graph: ARDecoder(model, prompt, ar_cfg, cuda_graph=graph))]

    def after_row(make) -> dict:
        """The experts a fresh decoder's steps touch; after an auto-budget row, AR timed again beside it (graphs
        where they run), so that the auto row meets AR in the machine's state of the moment."""
        dec = make(False)
        out = count_experts(dec, num_counted)
        if isinstance(dec, AutoBudgetDecoder):
            del dec
            beside = measure_decoder(makers[0][1], dataclasses.replace(plan, num_profiled=1), cuda)
            out["ar_beside_tokens_per_s"] = beside["graph_tokens_per_s"] or beside["eager_tokens_per_s"]
        return out
    for noise in plan.noises:
        drafter = OracleDrafter(continuation, cfg.vocab_size, plan.block_size - 1, noise=noise, seed=0,
                                num_positions=plan.max_new_tokens + plan.block_size, device=device)
        makers += [({"mode": "DDTree", "budget": b, "noise": noise, "drafter": "oracle"},
                    functools.partial(ddtree_decoder, model, prompt, decode_cfg(b, plan.max_new_tokens), drafter))
                   for b in plan.budgets]
        makers.append(({"mode": "DDTree", "budget": "auto", "noise": noise, "drafter": "oracle"},
                       functools.partial(auto_decoder, model, prompt,
                                         decode_cfg(max(plan.budgets), plan.max_new_tokens), drafter)))
    rows = []
    for key, make in makers:
        window = plan.auto_tokens if key["budget"] == "auto" else 0
        kernel_steps = KERNEL_STEPS if key["budget"] in (0, max(plan.budgets)) and not key["noise"] else 0
        rows.append(guarded(key, lambda key=key, make=make, window=window, kernel_steps=kernel_steps: {
            **key, **measure_decoder(make, plan, cuda, window, kernel_steps=kernel_steps), **after_row(make)}))
        if "error" not in rows[-1]:
            print(f"  {key['mode']} B={key['budget']!s:>4} noise={key['noise']}: eager {rows[-1]['eager_step_ms']:.3f} "
                  f"ms/step, tau {rows[-1]['tau_eager']:.2f}, {rows[-1]['touched']:.1f} experts touched", flush=True)
    if plan.dflash_layers:  # the learned drafter (random Kimi-K2.5-DFlash-shaped weights): chain, then each budget
        _, learned = dflash_rows(model, prompt, plan, lambda budget, max_new, block: dataclasses.replace(
            decode_cfg(budget, max_new), block_size=block), cuda, after_row)
        rows += learned
    for row in rows:  # the verify's rows: AR's root, the chain's block, the tree's B + 1 (auto: the mean verified)
        row["num_nodes"] = (plan.dflash_block_size if row["mode"] == "chain" else row.get("nodes_verified", 1)
                            if row["budget"] == "auto" else row["budget"] + 1)
    for row in (r for r in rows if "error" not in r):  # greedy-exact: every decoder commits the AR tokens
        row["tokens_match_ar"] = all(tokens == continuation[: len(tokens)] for tokens in row.pop("generated"))
    return rows, [r["prefill_ms"] for r in rows if "error" not in r]


def add_expert_traffic(rows: list[dict], cfg: ModelConfig, itemsize: int) -> None:
    """Each row's uniform-routing expectation, touched experts per MoE layer and expert GB per step."""
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    expert = expert_bytes(cfg, itemsize)
    for row in (r for r in rows if "error" not in r):
        row["uniform_touched"] = uniform_touched(cfg, row["num_nodes"])
        row["touched_mean"] = row["touched"] / num_moe
        row["expert_gb"] = row["touched"] * expert / 1e9


def add_speedups(rows: list[dict]) -> None:
    """Each row's tokens/s over the AR row's, eager and graph."""
    ar = rows[0]
    for row in (r for r in rows if "error" not in r):
        for mode in ("eager", "graph"):
            row[f"speedup_{mode}"] = ratio(row[f"{mode}_tokens_per_s"], ar.get(f"{mode}_tokens_per_s"))


def auto_against_best(rows: list[dict], choice_us: float) -> list[dict]:
    """Per drafter: the auto budget's tokens/s over the best of AR and every fixed budget (graph where it ran), the
    budgets its timed steps verified and the device time of its choice (choice_cost_us)."""
    out = []
    for series in sorted({(r["drafter"], r["noise"]) for r in rows if r.get("budget") == "auto"}, key=str):
        same = [r for r in rows if "error" not in r and (r["drafter"], r["noise"]) == series]
        auto = next((r for r in same if r["budget"] == "auto"), None)
        mode = "graph" if auto and auto.get("graph_tokens_per_s") else "eager"
        ar = dict(rows[0])
        if auto and auto.get("ar_beside_tokens_per_s"):  # AR timed right after the auto row
            ar[f"{mode}_tokens_per_s"] = auto["ar_beside_tokens_per_s"]
        fixed = [ar, *(r for r in same if r["budget"] != "auto" and r["mode"] != "chain")]
        policy = (auto or {}).get("policy") or {}
        best = max((r for r in fixed if r.get(f"{mode}_tokens_per_s")), key=lambda r: r[f"{mode}_tokens_per_s"])
        out.append({"drafter": series[0], "noise": series[1], "timing": mode,
                    "best_fixed": "AR" if best is ar else f"B={best['budget']}",
                    "ar_first": rows[0].get(f"{mode}_tokens_per_s"), "ar_beside": ar[f"{mode}_tokens_per_s"],
                    "auto_over_best": ratio(auto and auto.get(f"{mode}_tokens_per_s"), best[f"{mode}_tokens_per_s"]),
                    "num_steps": (auto or {}).get(mode, {}).get("num_steps"),
                    "chosen": " ".join(f"{b}:{n}" for b, n in policy.get("counts", {}).items()),
                    "choice_us": choice_us})
    return out


def expert_bytes(cfg: ModelConfig, itemsize: int) -> int:
    """One routed expert's weight bytes."""
    return next(la.expert for la in TargetBytes.of(cfg, itemsize).layers if la.expert)


def add_floors(rows: list[dict], ceilings: Ceilings) -> None:
    """Each row's floor per stage and of the whole step (ms: the bytes its stages read, benchmarks/stage_floors.py),
    its roofline floor (the verify's compute-bound parts at the matmul rate), its step times over each, and the
    speedups."""
    add_speedups(rows)
    add_stage_floors(rows, ceilings.copy_tbps * 1e12)
    add_rooflines(rows, ceilings.copy_tbps * 1e12, ceilings.matmul_tflops * 1e12)
    for row in (r for r in rows if "error" not in r):
        for mode in ("eager", "graph"):
            row[f"{mode}_over_floor"] = ratio(row[f"{mode}_step_ms"], row["floor_ms"])
        row["graph_over_roofline"] = ratio(row["graph_step_ms"], row.get("roofline_ms"))


def layer_rows(model: TargetModel, device: torch.device, copy_tbps: float, quick: bool) -> list[dict]:
    """One MoE layer's routed experts at N tokens (routed by its own router): sparse through the engine's grouped
    matmul here and through torch._grouped_mm, and the dense reference, against the bytes each reads (sparse: the
    touched experts; dense: all of them). CUDA-graph replays on a GPU, as the steps run."""
    cfg = model.cfg
    layer = next(la for la in model.layers if la["moe"])
    expert = expert_bytes(cfg, model.dtype.itemsize)
    gen = torch.Generator(device=device).manual_seed(1)
    budget = QUICK if quick else FULL
    matmul = grouped_matmul(device, model.dtype)

    def timed(fn, routed) -> float:
        timing = time_replays(fn, [routed], budget) if device.type == "cuda" else None
        return (timing or time_calls(fn, [routed], device, budget)).median_us

    rows = []
    for n in LAYER_TOKENS:
        x = torch.randn(n, cfg.hidden_size, generator=gen, device=device, dtype=model.dtype)
        routed = (x, *route(cfg, x.float() @ layer["router"].T, layer["router_bias"]))  # x, idx, weights
        touched = len(torch.unique(routed[1]))
        row = {"tokens": n, "touched": touched, "matmul": matmul,
               "sparse_us": timed(lambda r: sparse_moe(*r, layer["experts"], matmul=matmul), routed),
               "grouped_mm_us": timed(lambda r: sparse_moe(*r, layer["experts"], matmul="grouped_mm"), routed),
               "dense_us": timed(lambda r: dense_moe(*r, layer["experts"]), routed),
               "sparse_floor_us": touched * expert / copy_tbps / 1e6,
               "dense_floor_us": cfg.n_routed_experts * expert / copy_tbps / 1e6}
        row["sparse_over_floor"] = row["sparse_us"] / row["sparse_floor_us"]
        row["grouped_mm_over_floor"] = row["grouped_mm_us"] / row["sparse_floor_us"]
        row["dense_over_sparse"] = row["dense_us"] / row["sparse_us"]
        rows.append(row)
    return rows


STEP_COLUMNS = [
    Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}"), Column("noise", "noise", "{:g}"),
    Column("tau_eager", "tau", "{:.2f}"), Column("eager_step_ms", "eager ms/step", "{:.3f}"),
    Column("graph_step_ms", "graph ms/step", "{:.3f}"), Column("floor_ms", "floor ms", "{:.3f}"),
    Column("eager_over_floor", "eager/floor", "{:.2f}"), Column("graph_over_floor", "graph/floor", "{:.2f}"),
    Column("roofline_ms", "roofline ms", "{:.3f}"), Column("graph_over_roofline", "graph/roofline", "{:.2f}"),
    Column("eager_tokens_per_s", "eager tok/s", "{:.0f}"), Column("graph_tokens_per_s", "graph tok/s", "{:.0f}"),
    Column("speedup_eager", "speedup eager", "{:.2f}"), Column("speedup_graph", "speedup graph", "{:.2f}"),
    Column("tokens_match_ar", "tokens == AR"),
]
FLOOR_COLUMNS = floor_columns([Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}"),
                               Column("noise", "noise", "{:g}")])
DRAFTER_COLUMNS = drafter_columns([Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}")])
DRAFTER_TABLE = ("the drafter against its floor, and its share at Kimi-K2's depth (stage timers on; the chain's "
                 "forward and update alone as CUDA-graph replays)")
PARALLEL_STEP_COLUMNS = [c for c in STEP_COLUMNS if "floor" not in c.key] + [Column("comm_share", "comm", "{:.1%}")]
EXPERT_COLUMNS = [
    Column("mode", "mode"), Column("drafter", "drafter"), Column("budget", "B", "{}"), Column("noise", "noise", "{:g}"),
    Column("touched_mean", "experts touched / MoE layer", "{:.1f}"), Column("uniform_touched", "uniform", "{:.1f}"),
    Column("touched", "touched, all layers", "{:.1f}"), Column("expert_gb", "expert GB / step", "{:.2f}"),
]
AUTO_COLUMNS = [
    Column("drafter", "drafter"), Column("noise", "noise", "{:g}"), Column("timing", "timing"),
    Column("ar_first", "AR tok/s (first row)", "{:.0f}"), Column("ar_beside", "AR tok/s (beside)", "{:.0f}"),
    Column("best_fixed", "best of AR and fixed B"), Column("auto_over_best", "auto / best", "{:.3f}"),
    Column("num_steps", "timed steps", "{}"), Column("chosen", "budgets verified (B:steps; 0 = AR, no draft)"),
    Column("choice_us", "choice us (device)", "{:.1f}"),
]
LAYER_COLUMNS = [
    Column("tokens", "tokens", "{}"), Column("touched", "experts touched", "{}"), Column("matmul", "engine's matmul"),
    Column("sparse_us", "sparse us", "{:.1f}"), Column("sparse_floor_us", "sparse floor us", "{:.1f}"),
    Column("sparse_over_floor", "sparse/floor", "{:.2f}"), Column("grouped_mm_us", "torch._grouped_mm us", "{:.1f}"),
    Column("grouped_mm_over_floor", "torch._grouped_mm/floor", "{:.2f}"), Column("dense_us", "dense us", "{:.1f}"),
    Column("dense_floor_us", "dense floor us", "{:.1f}"), Column("dense_over_sparse", "dense/sparse", "{:.2f}"),
]


def speedup_chart(rows: list[dict], width: int = 40) -> str:
    """Speedup over AR against the budget, one series per drafter (graph replays where they ran, else eager), as
    text bars: where a bigger tree stops paying for the experts it reads, the bars turn down."""
    mode = "graph" if any(r.get("speedup_graph") for r in rows) else "eager"
    done = [r for r in rows if "error" not in r and r["mode"] != "AR" and r.get(f"speedup_{mode}")]
    if not done:
        return "(no speculative row ran)"
    top = max(r[f"speedup_{mode}"] for r in done)
    lines = [f"speedup over AR ({mode}), 1x = AR; bar length relative to the best ({top:.2f}x)"]
    for r in done:
        series = r["drafter"] if r["drafter"] == "dflash" else f"oracle noise {r['noise']:g}"
        where = "chain" if r["mode"] == "chain" else f"B={r['budget']}"
        value = r[f"speedup_{mode}"]
        lines.append(f"{series:<18}{where:>7}  {'#' * max(1, round(width * value / top)):<{width}}  {value:.2f}x")
    return "```\n" + "\n".join(lines) + "\n```"


def layers_option(p) -> None:
    p.add_argument("--layers", type=int, default=None, metavar="N",
                   help="Kimi-K2 layers, the first dense (default: as many as fit the GPU's memory less "
                        "HEADROOM_BYTES)")


def add_comm_share(rows: list[dict]) -> None:
    """A parallel run's rows: the share of the stage-timed step spent in collectives."""
    for row in (r for r in rows if "error" not in r):
        row["comm_share"] = sum(ms for name, ms in row["stage_ms"].items() if is_collective(name)) / row["stage_ms"][
            "step"]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args("What DDTree does to an MoE: Kimi-K2 layers, AR vs DDTree (small model with --quick)", argv,
                      layers_option)
    device = resolve_device(args.device)
    if device.type == "cpu" and not args.quick:
        raise SystemExit("bench_moe on the CPU runs only with --quick: the Kimi-K2 layers take over 100 GB of "
                         "memory; run it with --device cuda on an H200")
    if args.layers is not None and not 2 <= args.layers <= 61:
        raise SystemExit(f"--layers {args.layers}: expected 2..61 (one dense layer and at least one MoE layer)")
    shard = init_from_env(device.type)
    world = shard.world if shard else 1
    if shard is not None and shard.rank > 0:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - rank 0 alone prints; the others still decode
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    info = start_run("bench_moe", "benchmarks.bench_moe", argv, device, dtype, args.quick)
    if args.quick:
        cfg = quick_k2() if args.layers is None else dataclasses.replace(quick_k2(), num_hidden_layers=args.layers)
    else:
        budget = torch.cuda.get_device_properties(device).total_memory - HEADROOM_BYTES
        cfg = kimi_k2(args.layers or layers_that_fit(budget, dtype.itemsize))
    plan = (Plan(32, (4, 16), (0.0, NOISY), 4, 1, 3, 2, dflash_layers=1, dflash_block_size=4) if args.quick
            else Plan(4096, (16, 64, 256), (0.0, NOISY), 16, 2, 12, 3, dflash_layers=DFLASH_LAYERS,
                      dflash_block_size=DFLASH_BLOCK, auto_tokens=AUTO_TOKENS))
    num_counted = 2 if args.quick else 4
    torch.manual_seed(0)
    model = random_model(cfg, device, dtype, seed=0, shard=shard)
    size = model_bytes(cfg, dtype.itemsize)
    rows, prefills = decode_rows(model, plan, num_counted, device)
    add_expert_traffic(rows, cfg, dtype.itemsize)
    if shard is None:
        add_floors(rows, info.ceilings)
    else:
        add_speedups(rows)
        add_comm_share(rows)
    layers = layer_rows(model, device, info.ceilings.copy_tbps, args.quick) if shard is None else []
    if shard is None:
        add_drafter_shares(rows, cfg)
    name = "k2-quick" if args.quick else f"kimi-k2-{cfg.num_hidden_layers}-layers"
    results = {"model_name": name, "model": cfg.to_dict(), "model_bytes": size, "moe_path": model.moe_path,
               "plan": asdict(plan), "num_counted": num_counted, "world_size": world, "parallel": model.layout(),
               "prefill_ms": statistics.median(prefills) if prefills else None, "rows": rows, "layer": layers}
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    split = f", split over {world} ranks ({shard and model.layout()['backend']})" if shard else ""
    setup = (f"{results['model_name']}: {cfg.num_hidden_layers} layers ({cfg.first_k_dense_replace} dense, {num_moe} "
             f"MoE of {cfg.n_routed_experts} experts top-{cfg.num_experts_per_tok}), {size / 1e9:.1f} GB of "
             f"{info.ceilings.dtype} weights{split}, {model.moe_path} MoE; prompt {plan.prompt_len} tokens (prefill "
             f"{results['prefill_ms'] or 0:.1f} ms, median of {len(prefills)}), block size {plan.block_size}, "
             f"{plan.num_steps} timed steps per decoder, experts counted over {num_counted} more")
    columns = STEP_COLUMNS if shard is None else PARALLEL_STEP_COLUMNS
    auto = auto_against_best(rows, choice_cost_us(device, buckets_up_to(max(plan.budgets))))
    results["auto"] = auto
    tables = {"setup": setup, "steps": markdown_table(rows, columns), "speedup vs budget": speedup_chart(rows),
              "auto budget": markdown_table(auto, AUTO_COLUMNS), "experts": markdown_table(rows, EXPERT_COLUMNS)}
    drafting = [r for r in rows if "drafter_ms" in r]
    if shard is None:
        tables["stages against their floor (stage timers on; floor: the bytes each stage reads)"] = markdown_table(
            rows, FLOOR_COLUMNS)
        tables[DRAFTER_TABLE] = markdown_table(drafting, DRAFTER_COLUMNS)
    if layers:
        tables["moe layer"] = markdown_table(layers, LAYER_COLUMNS)
    kernels = [k for r in rows if r.get("kernels") for k in kernel_rows(
        "AR" if r["mode"] == "AR" else f"B={r['budget']}", r["kernels"], r["graph_step_ms"])]
    if kernels:
        tables[KERNEL_TABLE] = markdown_table(kernels, KERNEL_COLUMNS)
    print(f"\n{setup}\n\n{text_table(rows, columns)}\n\n{speedup_chart(rows)}\n\n{text_table(auto, AUTO_COLUMNS)}\n\n"
          f"{text_table(rows, EXPERT_COLUMNS)}\n")
    if shard is None:
        print(f"stages against their floor (ms; x: stage time / floor)\n{text_table(rows, FLOOR_COLUMNS)}\n\n"
              f"{DRAFTER_TABLE}\n{text_table(drafting, DRAFTER_COLUMNS)}\n")
    if layers:
        print(f"{text_table(layers, LAYER_COLUMNS)}\n")
    if kernels:
        print(f"{KERNEL_TABLE}\n{text_table(kernels, KERNEL_COLUMNS)}\n")
    failed = num_failed(rows) + sum(bool(r.get("graph_error")) for r in rows)
    if shard is None or shard.rank == 0:
        stem = f"moe-{device.type}" + (f"-w{world}" if shard else "")
        json_path, md_path = write_results(args.out, stem, info, results, tables)
        print(f"wrote {json_path} and {md_path}" + (f"; {failed} FAILED" if failed else ""))
    leave()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
