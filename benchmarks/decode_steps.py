"""How bench_decode measures one decoder: eager steps timed with CUDA events (perf_counter on the CPU), steps with
the stage timers on for each stage's share, and CUDA-graph replays on a second decoder; the tokens each one
committed, for the greedy-exact check; and a DFlash drafter's forward and context update, each captured alone as a
CUDA graph on the first decoder once its decode ran (drafter_replays). The steps run through the decoder's device
path (Decoder.advance / capture_graph): the per-step record is host bookkeeping outside what is measured."""
from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from benchmarks.common import Budget, guarded, time_replays
from benchmarks.graph_kernels import profile_steps
from engine.decoding.budget import choose, confidence_prior, learn_confidence
from engine.decoding.decoder import Decoder
from engine.timers import StepTimer
from kernels import ops
from kernels.graph_switch import graph_switch, side_stream

CHUNK = 16  # steps timed between two reads of the committed count, past num_steps
DRAFTER_REPLAYS = Budget(warmup=3, min_reps=30, max_reps=30, target_ms=0.0)  # a drafter part's replays: the median

STAGES = {  # table column -> collapsed StepTimer range names whose times add up to it
    "draft": ["step/draft"], "draft_update": ["step/draft_update"], "drafter": ["step/draft", "step/draft_update"],
    "tree_build": ["step/tree_build"], "verify": ["step/verify"],
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
    dflash_layers: int  # the learned drafter's layers
    dflash_block_size: int  # the block it drafts (Kimi-K2.5-DFlash's: 8)
    auto_tokens: int = 0  # an auto-budget decoder is timed until it commits this many tokens (at least num_steps)

    @property
    def max_dd_steps(self) -> int:
        return max(self.warmup + self.num_steps + self.num_profiled, 2 * self.warmup + self.num_steps)

    @property
    def max_new_tokens(self) -> int:
        """Enough for every DDTree decoder, each step committing at most block_size tokens, and for an auto decoder's
        token window (timed in chunks of CHUNK steps)."""
        return 1 + self.block_size * (self.max_dd_steps + CHUNK) + self.auto_tokens


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
    num_steps: int
    total_ms: float

    @classmethod
    def measure(cls, dec: Decoder, step: Callable[[], object], num_steps: int, min_tokens: int = 0) -> Steps:
        """num_steps timed steps, then more in chunks of CHUNK (the count read between chunks, outside the timed
        steps) until min_tokens were committed."""
        before = int(dec.num_generated)
        samples = time_steps(step, num_steps, dec.model.device)
        while int(dec.num_generated) - before < min_tokens:
            samples += time_steps(step, CHUNK, dec.model.device)
        p10, p50, p90 = np.percentile(samples, [10, 50, 90])
        return cls(float(p50), float(p10), float(p90), (int(dec.num_generated) - before) / len(samples),
                   len(samples), float(sum(samples)))

    @property
    def tokens_per_s(self) -> float:
        """Tokens over the time of all timed steps: the steps of an auto budget differ (drafted, AR), so a median
        step would misstate them."""
        return self.tau * self.num_steps / self.total_ms * 1e3


def eager_and_profile(dec: Decoder, plan: Plan, min_tokens: int = 0) -> tuple[Steps, dict[str, float], dict | None]:
    """Timed eager steps (and an auto budget's choices in them), then steps with the stage timers on: mean ms per
    range ("layerN" -> "layer*")."""
    device = dec.model.device
    for _ in range(plan.warmup):
        dec.advance()
    before = budget_policy(dec)
    eager = Steps.measure(dec, dec.advance, plan.num_steps, min_tokens)
    policy = budget_policy(dec, before)
    dec.timer = StepTimer(device)
    stage_ms: dict[str, float] = {}
    for _ in range(plan.num_profiled):
        with dec.timer.range("step"):
            dec.advance()
        for name, ns in dec.timer.results_ns().items():
            key = re.sub(r"layer\d+", "layer*", name)
            stage_ms[key] = stage_ms.get(key, 0.0) + ns / 1e6 / plan.num_profiled
    dec.timer = StepTimer(device, enabled=False)
    return eager, stage_ms, policy


def graph_steps(dec: Decoder, plan: Plan, min_tokens: int, kernel_steps: int = 0) -> dict:
    """Timed replays of the captured step, then kernel_steps more under torch.profiler (graph_kernels)."""
    for _ in range(plan.warmup):
        dec.advance()
    dec.capture_graph()
    for _ in range(plan.warmup):
        dec.advance()
    before = budget_policy(dec)
    steps = Steps.measure(dec, dec.advance, plan.num_steps, min_tokens)
    policy = budget_policy(dec, before)
    kernels = profile_steps(dec.advance, kernel_steps) if kernel_steps else None
    return {"steps": steps, "generated": committed(dec), "policy": policy, "kernels": kernels}


def budget_policy(dec: Decoder, before: dict | None = None) -> dict | None:
    """An auto-budget decoder's steps per verified budget (0: an AR step without a draft) since `before` (an earlier
    call's result)."""
    counts = getattr(dec, "budget_counts", None)
    if counts is None:
        return None
    dec.settle_timing()
    earlier = (before or {}).get("total", {})
    return {"counts": {b: n - earlier.get(b, 0) for b, n in sorted(counts.items()) if n - earlier.get(b, 0)},
            "total": dict(counts)}


def choice_cost_us(device: torch.device, buckets: tuple[int, ...], num_depths: int = 7, num_reps: int = 200) -> float:
    """Device time one auto-budget choice adds to a drafted step, in us: on CUDA, graph replays of the choice over a
    tree built at the largest bucket, a switch over one branch per bucket and the confidence update in the branch,
    against the same graph with its one small kernel run directly (per step: budget_choose, the switch's setting
    kernel and its conditional node, confidence_learn); on the CPU, the same two ops."""
    draft = torch.log_softmax(torch.randn(num_depths, 4096, device=device) * 3, -1)
    tree = ops.tree_build(draft, torch.tensor(0, device=device), buckets[-1])
    realised, predicted = confidence_prior(num_depths, device)
    bucket_index = torch.tensor(buckets, device=device)
    seconds = torch.rand(len(buckets), device=device).sort().values + 1.0
    path = torch.full((num_depths + 1,), -1, device=device)
    path[0] = 0
    x = torch.zeros(256, device=device)
    steps = 20  # per replay, so that the replay's own launch is spread thin

    def learn() -> None:
        x.add_(1)
        learn_confidence(realised, predicted, tree.parents, tree.depths, tree.ranks, tree.scores, path)

    if device.type != "cuda":
        start = time.perf_counter()
        for _ in range(num_reps):
            choose(tree, realised, predicted, bucket_index, seconds)
            learn_confidence(realised, predicted, tree.parents, tree.depths, tree.ranks, tree.scores, path)
        return (time.perf_counter() - start) / num_reps * 1e6

    stream = side_stream(device)  # made before any capture

    def chosen_step(pool):
        choice = choose(tree, realised, predicted, bucket_index, seconds)
        graph_switch(choice.chosen, [learn] * len(buckets), pool, stream)

    graphs = []
    for body in (lambda pool: x.add_(1), chosen_step):
        graph, pool = torch.cuda.CUDAGraph(), torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=pool):
            for _ in range(steps):
                body(pool)
        graphs.append(graph)
    ms = []
    for graph in graphs:
        graph.replay()
        ms.append(sum(time_steps(graph.replay, num_reps, device)))
    return (ms[1] - ms[0]) / (num_reps * steps) * 1e3


def drafter_replays(dec: Decoder) -> dict:
    """A DFlash decoder's drafter after its decode ran (its cache holds the decode's context), its two parts each
    captured alone as a CUDA graph: ms per replay, the median of DRAFTER_REPLAYS's. The forward is block_logprobs of
    a root; the context update write_context of the L + 1 rows a commit writes (random target states of the
    concatenated width) at the valid length, which it does not move. None on the CPU or where a capture fails."""
    model = dec.drafter.model
    out = {"drafter_forward_graph_ms": None, "drafter_update_graph_ms": None}
    if model.length.device.type != "cuda":
        return out
    cfg, device = model.cfg, model.length.device
    root = torch.zeros((), dtype=torch.int64, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    hidden = torch.randn(model.num_draft_positions + 1, len(cfg.target_layer_ids) * cfg.hidden_size, generator=gen,
                         device=device, dtype=model.w.dtype)  # [L + 1, ids * d]
    parts = {"forward": lambda _: model.block_logprobs(root),
             "update": lambda _: model.write_context(hidden, model.length)}
    for part, fn in parts.items():
        timing = time_replays(fn, [None], DRAFTER_REPLAYS, num_calls=1)
        out[f"drafter_{part}_graph_ms"] = None if timing is None else timing.median_us / 1e3
    return out


def committed(dec: Decoder) -> list[int]:
    return dec.generated[: int(dec.num_generated)].cpu().tolist()


def measure_decoder(make: Callable[[bool], Decoder], plan: Plan, cuda: bool, min_tokens: int = 0,
                    after_eager: Callable[[Decoder], dict] | None = None, kernel_steps: int = 0) -> dict:
    """Eager + profiled steps on one decoder, graph replays on a second (CUDA only), each timed until it committed
    min_tokens (an auto budget's window); the tokens each committed, and an auto budget's choices over the last
    timed window. A failed graph capture leaves the eager numbers standing (graph_error says why). after_eager(dec)
    adds fields from the first decoder once its steps ran (dflash_rows: drafter_replays). kernel_steps > 0 profiles
    that many graph steps after the timed ones: "kernels" (graph_kernels.profile_steps; None without graphs)."""
    dec = make(False)
    eager, stage_ms, policy = eager_and_profile(dec, plan, min_tokens)
    generated = [committed(dec)]
    inspected = after_eager(dec) if after_eager else {}
    del dec
    graph, graph_error, kernels = None, None, None
    if cuda:
        replayed = guarded({}, lambda: graph_steps(make(True), plan, min_tokens, kernel_steps))
        graph, graph_error, kernels = replayed.get("steps"), replayed.get("error"), replayed.get("kernels")
        generated += [replayed["generated"]] if graph else []
        policy = replayed.get("policy", policy)
        torch.cuda.empty_cache()
    step_ms = stage_ms["step"]
    return {
        "eager": asdict(eager), "graph": asdict(graph) if graph else None, "generated": generated,
        "graph_error": graph_error, "kernels": kernels,
        "eager_step_ms": eager.median_ms, "graph_step_ms": graph.median_ms if graph else None,
        "tau_eager": eager.tau, "tau_graph": graph.tau if graph else None,
        "eager_tokens_per_s": eager.tokens_per_s, "graph_tokens_per_s": graph.tokens_per_s if graph else None,
        "profiled_step_ms": step_ms, "stage_ms": stage_ms, "policy": policy,
        "stage_share": {col: sum(stage_ms.get(n, 0.0) for n in names) / step_ms for col, names in STAGES.items()},
        **inspected,
    }
