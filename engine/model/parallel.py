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
from datetime import timedelta

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


RENDEZVOUS_TIMEOUT_ENV = "DDTREE_RENDEZVOUS_TIMEOUT_S"  # seconds every rank waits for the others to join
RENDEZVOUS_TIMEOUT_S = 120.0


def _env_int(name: str, default: int, minimum: int) -> int:
    raw = os.environ.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ParallelError(f"{name}={raw!r} in the environment: expected an integer >= {minimum} (torchrun sets it; "
                            "unset WORLD_SIZE, RANK and LOCAL_RANK to run one process)")
    return value


def _rendezvous_timeout() -> float:
    raw = os.environ.get(RENDEZVOUS_TIMEOUT_ENV, str(RENDEZVOUS_TIMEOUT_S))
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ParallelError(f"{RENDEZVOUS_TIMEOUT_ENV}={raw!r}: expected a number of seconds > 0")
    return seconds


def _store(rank: int, world: int) -> dist.TCPStore:
    """The rendezvous torchrun describes (MASTER_ADDR, MASTER_PORT), waiting at most the rendezvous timeout for
    every rank: a mistyped launch (WORLD_SIZE=2 with one process) fails fast instead of waiting half an hour."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise ParallelError(f"WORLD_SIZE={world} but MASTER_ADDR / MASTER_PORT are not set: launch with torchrun "
                            "(it sets them), or unset WORLD_SIZE to run one process")
    seconds = _rendezvous_timeout()
    hosts = rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"  # torchrun's agent hosts it
    try:
        store = dist.TCPStore(addr, _env_int("MASTER_PORT", 0, 1), world, is_master=hosts,
                              timeout=timedelta(seconds=seconds), wait_for_workers=True)
    except (RuntimeError, OSError) as exc:  # DistStoreError (a RuntimeError): nobody came, or no connection
        raise ParallelError(f"rank {rank} of WORLD_SIZE={world}: the other ranks did not join at {addr}:{port} "
                            f"within {seconds:g} s ({str(exc).splitlines()[0]}); start all {world} processes "
                            f"(torchrun --nproc-per-node {world}), or unset WORLD_SIZE to run one. "
                            f"{RENDEZVOUS_TIMEOUT_ENV} sets the wait") from exc
    store.set_timeout(dist.default_pg_timeout)  # the rendezvous is done: later waits are the collectives' own
    return store


def init_from_env(device: str) -> Shard | None:
    """Join the process group torchrun describes (WORLD_SIZE > 1 in the environment): NCCL for CUDA, each rank on
    cuda:LOCAL_RANK; gloo for the CPU. None when the process runs alone. The environment is checked first and
    the rendezvous waits at most DDTREE_RENDEZVOUS_TIMEOUT_S (ParallelError naming the variable otherwise)."""
    world = _env_int("WORLD_SIZE", 1, 1)
    if world == 1:
        return None
    rank = _env_int("RANK", 0, 0)
    if rank >= world:
        raise ParallelError(f"RANK={rank} with WORLD_SIZE={world}: a rank is in [0, {world}); fix the launch")
    if device == "cuda":
        local = _env_int("LOCAL_RANK", 0, 0)
        if local >= torch.cuda.device_count():
            raise ParallelError(f"LOCAL_RANK {local}: this machine has {torch.cuda.device_count()} CUDA devices; "
                                f"start at most that many processes per node")
        torch.cuda.set_device(local)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device == "cuda" else "gloo", store=_store(rank, world), rank=rank,
                                world_size=world)
    return current_shard()


def leave() -> None:
    """Leave the process group init_from_env joined once every rank is done (nothing for a process alone): a rank
    that exited while another still wrote its report could be aborted at interpreter exit by gloo's threads."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


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
