"""End-to-end decode on a "k2-mini" model: AR vs DDTree step time, tokens/s, speedup and each stage's share.

k2-mini has Kimi-K2's attention and expert widths (hidden 7168, 64 heads, q_lora 1536, kv_lora 512, qk_nope
128, rope 64, v 128, expert width 2048, dense width 18432, vocab 163840, YaRN) but two layers (one dense, one
MoE with 8 routed experts, top-2, one shared expert), random bf16 weights made on the device. The lm_head is a
permuted copy of the embedding, so each greedy token is decided by a wide margin whatever the random layers
add: bf16 rounding cannot flip an argmax between the AR run and the tree verify, so the exact oracle's first
choice is always the target's. Nothing else depends on the weights' values: a step's work is fixed by its
shapes.

AR and DDTree decoders (B x {exact, noisy oracle}) step the same prompt, timed eagerly (CUDA events around
each step), as CUDA-graph replays, and with the stage timers on (StepTimer ranges) for the stage shares. The
steps run through the decoder's device path (Decoder.advance / capture_graph): the per-step record, which
reads the [B+1, V] logits back and sorts them, is host bookkeeping outside the step measured here.

    python -m benchmarks.bench_decode [--device cuda|cpu] [--quick] [--out DIR]
"""
from __future__ import annotations

import functools
import math
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from engine.config import DecodeConfig, ModelConfig
from engine.decode import ARDecoder, DDTreeDecoder, Decoder
from engine.drafters.oracle import OracleDrafter
from engine.model import TargetModel
from engine.timers import StepTimer
from engine.weights import lm_head_name, weight_shapes

from .common import (
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

NOISY = 0.3  # the noisy oracle's chance to demote the true token at a position
STAGES = {  # table column -> collapsed StepTimer range names whose times add up to it
    "draft": ["step/draft"], "tree_build": ["step/tree_build"], "verify": ["step/verify"],
    "verify_attn": ["step/verify/layer*/attn/verify_attn"], "attn_total": ["step/verify/layer*/attn"],
    "ffn": ["step/verify/layer*/mlp", "step/verify/layer*/moe"], "lm_head": ["step/verify/lm_head"],
    "tree_accept": ["step/tree_accept"], "kv_compact": ["step/kv_compact"], "commit": ["step/commit"],
}


@dataclass(slots=True, frozen=True)
class Plan:
    prompt_len: int
    budgets: tuple[int, ...]
    noises: tuple[float, ...]
    block_size: int
    warmup: int  # eager steps before timing (and graph replays after the capture)
    num_steps: int  # timed steps per decoder and mode
    num_profiled: int  # steps with the stage timers on

    @property
    def max_dd_steps(self) -> int:
        return max(self.warmup + self.num_steps + self.num_profiled, 2 * self.warmup + self.num_steps)

    @property
    def max_new_tokens(self) -> int:
        """Enough for every DDTree decoder, each step committing at most block_size tokens."""
        return 1 + self.block_size * self.max_dd_steps


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


def random_tensors(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int
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


def random_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int) -> TargetModel:
    return TargetModel(cfg, random_tensors(cfg, device, dtype, seed))


def time_steps(step: Callable[[], object], num_steps: int, device: torch.device) -> list[float]:
    """ms per step: CUDA events around each step on a GPU, perf_counter on the CPU."""
    if device.type != "cuda":
        out = []
        for _ in range(num_steps):
            start = time.perf_counter_ns()
            step()
            out.append((time.perf_counter_ns() - start) / 1e6)
        return out
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(num_steps)]
    torch.cuda.synchronize()
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in events]


@dataclass(slots=True)
class Steps:
    """Timed steps of one decoder in one mode."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    tau: float  # tokens committed per timed step

    @classmethod
    def measure(cls, dec: Decoder, step: Callable[[], object], num_steps: int) -> Steps:
        before = int(dec.num_generated)
        samples = time_steps(step, num_steps, dec.model.device)
        p10, p50, p90 = np.percentile(samples, [10, 50, 90])
        return cls(float(p50), float(p10), float(p90), (int(dec.num_generated) - before) / num_steps)

    @property
    def tokens_per_s(self) -> float:
        return self.tau / self.median_ms * 1e3


def eager_and_profile(dec: Decoder, plan: Plan) -> tuple[Steps, dict[str, float]]:
    """Timed eager steps, then steps with the stage timers on: mean ms per range ("layerN" -> "layer*")."""
    device = dec.model.device
    for _ in range(plan.warmup):
        dec.advance()
    eager = Steps.measure(dec, dec.advance, plan.num_steps)
    dec.timer = StepTimer(device)
    stage_ms: dict[str, float] = {}
    for _ in range(plan.num_profiled):
        with dec.timer.range("step"):
            dec.advance()
        for name, ns in dec.timer.results_ns().items():
            key = re.sub(r"layer\d+", "layer*", name)
            stage_ms[key] = stage_ms.get(key, 0.0) + ns / 1e6 / plan.num_profiled
    dec.timer = StepTimer(device, enabled=False)
    return eager, stage_ms


def graph_steps(dec: Decoder, plan: Plan) -> dict:
    for _ in range(plan.warmup):
        dec.advance()
    dec.capture_graph()
    for _ in range(plan.warmup):
        dec.advance()
    return {"steps": Steps.measure(dec, dec.advance, plan.num_steps), "generated": committed(dec)}


def committed(dec: Decoder) -> list[int]:
    return dec.generated[: int(dec.num_generated)].cpu().tolist()


def measure_decoder(make: Callable[[bool], Decoder], plan: Plan, cuda: bool) -> dict:
    """Eager + profiled steps on one decoder, graph replays on a second (CUDA only); the tokens each committed.
    A failed graph capture leaves the eager numbers standing (graph_error says why)."""
    dec = make(False)
    eager, stage_ms = eager_and_profile(dec, plan)
    generated = [committed(dec)]
    del dec
    graph, graph_error = None, None
    if cuda:
        replayed = guarded({}, lambda: graph_steps(make(True), plan))
        graph, graph_error = replayed.get("steps"), replayed.get("error")
        generated += [replayed["generated"]] if graph else []
        torch.cuda.empty_cache()
    step_ms = stage_ms["step"]
    return {
        "eager": asdict(eager), "graph": asdict(graph) if graph else None, "generated": generated,
        "graph_error": graph_error,
        "eager_step_ms": eager.median_ms, "graph_step_ms": graph.median_ms if graph else None,
        "tau_eager": eager.tau, "tau_graph": graph.tau if graph else None,
        "eager_tokens_per_s": eager.tokens_per_s, "graph_tokens_per_s": graph.tokens_per_s if graph else None,
        "profiled_step_ms": step_ms, "stage_ms": stage_ms,
        "stage_share": {col: sum(stage_ms.get(n, 0.0) for n in names) / step_ms for col, names in STAGES.items()},
    }


def ddtree_decoder(model: TargetModel, prompt: list[int], cfg: DecodeConfig, drafter: OracleDrafter,
                   cuda_graph: bool) -> Decoder:
    return DDTreeDecoder(model, prompt, cfg, drafter, cuda_graph=cuda_graph)


def run_decode(cfg: ModelConfig, plan: Plan, device: torch.device, dtype: torch.dtype) -> dict:
    """The AR row first (its tokens are the oracle's continuation), then one row per budget and oracle."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(cfg.vocab_size, size=plan.prompt_len).tolist()
    model = random_model(cfg, device, dtype, seed=0)
    cuda = device.type == "cuda"
    need = plan.max_new_tokens + plan.block_size  # continuation the drafters look into
    dtype_name = str(dtype).removeprefix("torch.")

    def decode_cfg(budget: int, max_new_tokens: int) -> DecodeConfig:
        return DecodeConfig(budget=budget, block_size=plan.block_size, max_new_tokens=max_new_tokens,
                            device=device.type, dtype=dtype_name)

    ar_cfg = decode_cfg(0, need + plan.block_size)
    ar_dec = ARDecoder(model, prompt, ar_cfg)
    prefill_ms = ar_dec.prefill_ns / 1e6
    while int(ar_dec.num_generated) < need:  # the AR continuation, untimed
        ar_dec.advance()
    continuation = ar_dec.generated[:need].cpu().tolist()
    del ar_dec
    ar = measure_decoder(lambda graph: ARDecoder(model, prompt, ar_cfg, cuda_graph=graph), plan, cuda)
    rows = [{"mode": "AR", "budget": 0, "noise": None, **ar}]
    for noise in plan.noises:
        drafter = OracleDrafter(continuation, cfg.vocab_size, plan.block_size - 1, noise=noise, seed=0,
                                num_positions=plan.max_new_tokens + plan.block_size, device=device)
        for budget in plan.budgets:
            make = functools.partial(ddtree_decoder, model, prompt, decode_cfg(budget, plan.max_new_tokens), drafter)
            key = {"mode": "DDTree", "budget": budget, "noise": noise}
            rows.append(guarded(key, lambda key=key, make=make: {**key, **measure_decoder(make, plan, cuda)}))
            if "error" not in rows[-1]:
                print(f"  DDTree B={budget:4d} noise={noise}: eager {rows[-1]['eager_step_ms']:.3f} ms/step, "
                      f"tau {rows[-1]['tau_eager']:.2f}", flush=True)
    for row in (r for r in rows if "error" not in r):  # greedy-exact: every decoder commits the AR tokens
        row["tokens_match_ar"] = all(tokens == continuation[: len(tokens)] for tokens in row.pop("generated"))
        for mode in ("eager", "graph"):
            row[f"speedup_{mode}"] = ratio(row[f"{mode}_tokens_per_s"], ar[f"{mode}_tokens_per_s"])
            row[f"step_over_ar_{mode}"] = ratio(row[f"{mode}_step_ms"], ar[f"{mode}_step_ms"])
    weight_bytes = sum(math.prod(s) for n, s in weight_shapes(cfg).items() if n != "model.embed_tokens.weight")
    return {"prefill_ms": prefill_ms, "prompt_len": plan.prompt_len, "rows": rows,
            "weight_bytes_per_step": weight_bytes * dtype.itemsize}


STEP_COLUMNS = [
    Column("mode", "mode"), Column("budget", "B", "{}"), Column("noise", "noise", "{:g}"),
    Column("tau_eager", "tau", "{:.2f}"), Column("eager_step_ms", "eager ms/step", "{:.3f}"),
    Column("graph_step_ms", "graph ms/step", "{:.3f}"), Column("eager_tokens_per_s", "eager tok/s", "{:.0f}"),
    Column("graph_tokens_per_s", "graph tok/s", "{:.0f}"), Column("speedup_eager", "speedup eager", "{:.2f}"),
    Column("speedup_graph", "speedup graph", "{:.2f}"), Column("step_over_ar_eager", "step/AR eager", "{:.2f}"),
    Column("step_over_ar_graph", "step/AR graph", "{:.2f}"), Column("tokens_match_ar", "tokens == AR"),
]
SHARE_COLUMNS = [Column("mode", "mode"), Column("budget", "B", "{}"), Column("noise", "noise", "{:g}"),
                 Column("profiled_step_ms", "step ms (timed stages)", "{:.3f}")]
SHARE_COLUMNS += [Column(f"share_{name}", name, "{:.1%}") for name in STAGES]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args("AR vs DDTree decode steps on the k2-mini model (tiny model with --quick)", argv)
    device = resolve_device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    info = start_run("bench_decode", "benchmarks.bench_decode", argv, device, dtype, args.quick)
    cfg = tiny() if args.quick else k2_mini()
    plan = (Plan(16, (4, 16), (0.0, NOISY), 4, 1, 3, 2) if args.quick
            else Plan(256, (16, 64, 256), (0.0, NOISY), 16, 3, 20, 5))
    torch.manual_seed(0)
    results = {"model_name": "tiny" if args.quick else "k2-mini", "model": cfg.to_dict(), "plan": asdict(plan),
               **run_decode(cfg, plan, device, dtype)}
    results["ar_floor_ms"] = results["weight_bytes_per_step"] / (info.ceilings.copy_tbps * 1e12) * 1e3
    rows = [{**row, **{f"share_{k}": v for k, v in row.get("stage_share", {}).items()}} for row in results["rows"]]
    setup = (f"{results['model_name']}, {info.ceilings.dtype}, prompt {plan.prompt_len} tokens (prefill "
             f"{results['prefill_ms']:.1f} ms), block size {plan.block_size}, {plan.num_steps} timed steps per "
             f"decoder; AR step floor (weights read once at the copy bandwidth) {results['ar_floor_ms']:.3f} ms")
    tables = {"setup": setup, "steps": markdown_table(rows, STEP_COLUMNS),
              "stage shares (eager, stage timers on)": markdown_table(rows, SHARE_COLUMNS)}
    print(f"\n{setup}\n\n{text_table(rows, STEP_COLUMNS)}\n\n{text_table(rows, SHARE_COLUMNS)}\n")
    json_path, md_path = write_results(args.out, f"decode-{device.type}", info, results, tables)
    for row in results["rows"]:
        if row.get("graph_error"):
            print(f"FAILED graph replay of {row['mode']} B={row['budget']} noise={row['noise']}: {row['graph_error']}")
    failed = num_failed(results["rows"]) + sum(bool(r.get("graph_error")) for r in results["rows"])
    print(f"wrote {json_path} and {md_path}" + (f"; {failed} FAILED" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
