"""Tensor and expert parallelism over torch.distributed: which slice of the target each rank holds, and the one
collective the forward needs.

The layout (the serving engines' TP attention + EP MoE at data-parallel size 1):
- Attention heads are split: rank r owns heads [r H/W, (r+1) H/W) of q_b, W_UK, W_UV and o_proj's columns.
  kv_a (the latent projection) is replicated, so every rank writes the same latent cache rows: the cache is
  per rank and identical, and verify_attn runs over the rank's own heads. The o_proj outputs are partial sums,
  all-reduced ("attn/allreduce").
- Routed experts are split: rank r owns experts [r E/W, (r+1) E/W). Every rank holds every token after the
  attention all-reduce, so dispatch moves no bytes: each rank routes all tokens (the same routing everywhere)
  and runs the assignments that fall on its experts ("moe/dispatch"). The partial outputs are combined with one
  all-reduce ("moe/combine"). All-to-all pays off when each rank holds different tokens (data-parallel
  attention over many sequences); a DDTree step verifies one sequence's B + 1 nodes, which every rank holds.
- The shared expert and the dense layers' MLP are split along their intermediate width (gate / up rows,
  down columns), and their partial sums ride in the same all-reduce as the routed experts'.
- The embedding, the final norm, lm_head and the router are replicated: every rank gets the full logits, so
  each builds the same tree, accepts the same path and compacts the same rows, with nothing broadcast.

Every rank's hidden states after an all-reduce are the same bytes (a ring all-reduce ends with every rank
holding the one reduced copy), so the ranks stay identical step after step; tests/test_parallel.py checks it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from engine.config import ModelConfig

ATTN_REDUCE = "allreduce"  # .../attn/allreduce and .../mlp/allreduce: the partial outputs summed over the ranks
MOE_DISPATCH = "dispatch"  # .../moe/dispatch: this rank's share of the routing (local: no bytes move)
MOE_COMBINE = "combine"  # .../moe/combine: the experts' partial outputs summed over the ranks
COLLECTIVES = (ATTN_REDUCE, MOE_COMBINE)  # the ranges that communicate


def is_collective(range_name: str) -> bool:
    """Whether a StepTimer range (full name, e.g. step/verify/layer3/moe/combine) is a collective's."""
    return range_name.rsplit("/", 1)[-1] in COLLECTIVES


class ParallelError(ValueError):
    """The model cannot be split this way, or the process group is not what the run needs."""


@dataclass(frozen=True, slots=True)
class Shard:
    """This process's place in the parallel layout: rank in [0, world)."""

    rank: int
    world: int

    def part(self, total: int, what: str) -> slice:
        """This rank's contiguous share of `total` items (heads, experts, intermediate columns)."""
        if total % self.world:
            raise ParallelError(f"{what} = {total} does not split over {self.world} ranks: run with a world size "
                                f"that divides it")
        size = total // self.world
        return slice(self.rank * size, (self.rank + 1) * size)

    def check(self, cfg: ModelConfig) -> None:
        """Every count this layout splits divides by the world size (ParallelError naming the first that does not)."""
        moe = [i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
        self.part(cfg.num_attention_heads, "num_attention_heads")
        if len(moe) < cfg.num_hidden_layers:
            self.part(cfg.intermediate_size, "intermediate_size")
        if moe:
            self.part(cfg.n_routed_experts, "n_routed_experts")
            if cfg.n_shared_experts:
                self.part(cfg.n_shared_experts * cfg.moe_intermediate_size, "the shared experts' width")

    def layout(self, num_heads: int, num_experts: int) -> dict:
        """What a report says of the layout: world size, backend, heads and routed experts per rank."""
        return {"world_size": self.world, "backend": str(dist.get_backend()), "heads_per_rank": num_heads // self.world,
                "experts_per_rank": num_experts // self.world}

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of x over the ranks, in place (x's dtype)."""
        dist.all_reduce(x)
        return x


def current_shard() -> Shard | None:
    """The Shard of the initialised default process group, or None for a single process."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return Shard(dist.get_rank(), dist.get_world_size())


def init_from_env(device: str) -> Shard | None:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment): NCCL for CUDA, each rank on
    cuda:LOCAL_RANK; gloo for the CPU. None when the process runs alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return None
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise ParallelError(f"LOCAL_RANK {local}: this machine has {torch.cuda.device_count()} CUDA devices; "
                                f"start at most that many processes per node")
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo")
    return current_shard()


def is_leader() -> bool:
    """Whether this process writes reports and prints: rank 0, or a single process."""
    shard = current_shard()
    return shard is None or shard.rank == 0


def gather_to_leader(obj: object) -> list | None:
    """Every rank's obj in rank order on rank 0, None on the others ([obj] for a single process)."""
    shard = current_shard()
    if shard is None:
        return [obj]
    gathered: list | None = [None] * shard.world if shard.rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered
