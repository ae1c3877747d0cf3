"""Tensor and expert parallelism on the CPU with gloo (engine/model/parallel.py): 2 and 4 processes on this machine.

Each rank holds H / W heads and E / W experts; the sharded forward's logits equal the single-process forward's,
every rank builds, accepts and commits the same trees, and DDTree == AR token for token, greedy and sampled."""
from __future__ import annotations

import json
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import TINY_FIXTURE
from greedy import assert_greedy_equal, assert_sampled_equal
from masks import block_mask
from tolerance import assert_close_at_scale

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.kdtr import read_kdtr
from engine.loaders.shipped import DEFAULT_MODEL
from engine.model.cache import LatentCache
from engine.model.parallel import ParallelError, Shard, current_shard, init_from_env
from engine.model.target import TargetModel

# float32, of the largest logit (tests/tolerance.py): the ranks' partial sums add up in another order than one
# matmul's (measured: up to 1.6e-5 absolute with logits up to 12, so 1.3e-6 of the scale)
LOGIT_TOL = 1e-5


def _prefill_and_verify(model: TargetModel, prompt: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompt's causal logits, then a tree block's (mask [N, N], depths from the mask) over the cache."""
    cfg, n = model.cfg, len(prompt)
    cache = LatentCache(cfg.num_hidden_layers, n + len(tokens), cfg.kv_lora_rank, cfg.qk_rope_head_dim, "cpu",
                        model.dtype, model.rope(n + len(tokens)))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    prefill, _ = model.forward(prompt, torch.arange(n), causal, cache)
    cache.prefix_len.fill_(n)
    verify, _ = model.forward(tokens, mask.sum(-1) - 1, mask, cache)
    return prefill, verify


def _tree_signature(run) -> list:
    return [(s.tree.tokens, s.tree.parents, s.path, s.committed) for s in run.steps]


def _rank_main(rank: int, world: int, rendezvous: str, seed: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        ckpt = read_kdtr(TINY_FIXTURE)
        shard = current_shard()
        assert shard == Shard(rank, world)
        rng = random.Random(seed)
        vocab = ckpt.config.vocab_size
        prompt = torch.tensor([rng.randrange(vocab) for _ in range(rng.randrange(4, 12))])
        mask = block_mask("tree", rng.randrange(2, 17), rng)
        tokens = torch.tensor([rng.randrange(vocab) for _ in range(len(mask))])
        whole = TargetModel.from_checkpoint(ckpt)
        part = TargetModel.from_checkpoint(ckpt, shard=shard)
        assert part.layers[0]["attn"].w_uk.shape[0] == ckpt.config.num_attention_heads // world
        assert part.layers[-1]["experts"].down.shape[0] == ckpt.config.n_routed_experts // world
        for want, got in zip(_prefill_and_verify(whole, prompt, mask, tokens),
                             _prefill_and_verify(part, prompt, mask, tokens), strict=True):
            assert_close_at_scale(got, want, LOGIT_TOL, f"(world {world})")

        drafter = DrafterSpec(noise=rng.choice([0.3, 0.6]), seed=rng.randrange(1000))
        for cfg in (DecodeConfig(max_new_tokens=12, budget=rng.choice([4, 16]), block_size=4),
                    DecodeConfig(max_new_tokens=12, budget=8, block_size=4, temperature=0.7,
                                 seed=rng.randrange(2**31))):
            ar = decode(ckpt, prompt.tolist(), cfg, "ar", model=part)
            tree = decode(ckpt, prompt.tolist(), cfg, "ddtree", drafter, model=part)
            alone = decode(ckpt, prompt.tolist(), cfg, "ar", model=whole)
            if cfg.temperature == 0:
                assert_greedy_equal(ar.tokens, ar.logits, tree.tokens)
                assert_greedy_equal(alone.tokens, alone.logits, ar.tokens)
            else:
                assert_sampled_equal(ar, tree.tokens, cfg)
            signatures: list = [None] * world
            dist.all_gather_object(signatures, _tree_signature(tree))
            assert all(s == signatures[0] for s in signatures), "every rank builds and accepts the same trees"
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_the_sharded_forward_and_decode_match_one_process(world, tmp_path):
    mp.spawn(_rank_main, args=(world, str(tmp_path / "rendezvous"), random.randrange(2**31)), nprocs=world)


def _nccl_rank_main(rank: int, world: int, rendezvous: str, seed: int) -> None:
    """On GPU rank: the sharded bfloat16 decode, eager and as one CUDA graph per rank replayed, == AR (batch-invariant,
    so the comparison is exact: a sum of two ranks is order-free)."""
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        from engine.decoding.decoder import ARDecoder, Decoder
        from engine.drafters.oracle import OracleDrafter

        ckpt = read_kdtr(TINY_FIXTURE)
        model = TargetModel.from_checkpoint(ckpt, "cuda", "bfloat16", shard=current_shard())
        rng = random.Random(seed)
        prompt = [rng.randrange(ckpt.config.vocab_size) for _ in range(8)]
        cfg = DecodeConfig(max_new_tokens=16, budget=16, block_size=4, device="cuda", dtype="bfloat16",
                           batch_invariant=True)
        ar = ARDecoder(model, prompt, cfg).run().tokens
        for graph in (False, True):
            drafter = OracleDrafter(ar + [0] * cfg.block_size, ckpt.config.vocab_size, cfg.num_draft_positions,
                                    noise=0.3, seed=seed,
                                    num_positions=cfg.max_new_tokens + cfg.block_size, device=model.device)
            dec = Decoder(model, prompt, cfg, "ddtree", drafter, cuda_graph=graph)
            assert dec.run().tokens == ar, f"cuda_graph={graph}"
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs (torch sees fewer)")
def test_nccl_ranks_decode_as_ar_eager_and_as_cuda_graphs(tmp_path):
    mp.spawn(_nccl_rank_main, args=(2, str(tmp_path / "rendezvous"), random.randrange(2**31)), nprocs=2)


@pytest.mark.parametrize("total, world", [(4, 3), (8, 16), (6, 4)])
def test_a_layout_that_does_not_divide_is_refused(total, world):
    with pytest.raises(ParallelError, match=f"= {total} does not split over {world} ranks"):
        Shard(0, world).part(total, "num_attention_heads")


@pytest.mark.parametrize("world, what", [(3, "num_attention_heads = 4"), (8, "num_attention_heads = 4")])
def test_a_model_that_does_not_split_is_refused_before_loading(tiny_checkpoint, world, what):
    with pytest.raises(ParallelError, match=f"{what} does not split over {world} ranks"):
        TargetModel.from_checkpoint(tiny_checkpoint, shard=Shard(0, world))


def test_every_rank_gets_its_own_contiguous_share():
    world = random.randint(1, 8)
    total = world * random.randint(1, 6)
    shares = [Shard(r, world).part(total, "n_routed_experts") for r in range(world)]
    assert [i for s in shares for i in range(total)[s]] == list(range(total))


def test_torchrun_runs_the_cli_and_rank_0_writes_every_rank_into_the_trace(tmp_path):
    """`torchrun --nproc-per-node 2 -m engine run` on the shipped pair (its DFlash drafter): one report, and
    trace.json holds one process per rank and run, with the ranks' communication ranges."""
    out = tmp_path / "report"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "engine", "run", "--max-new-tokens", "8", "--budget", "8", "--report", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("tokens generated") == 1, "only rank 0 prints the summary"
    assert "rank 1" in proc.stdout and "communication" in proc.stdout
    trace = json.loads((out / "trace.json").read_text())
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert {n.split(":")[0] for n in names} == {"rank 0/2", "rank 1/2"}
    ranges = {e["args"]["range"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert any(r.endswith("/attn/allreduce") for r in ranges) and any(r.endswith("/moe/combine") for r in ranges)
    shipped = json.loads((DEFAULT_MODEL / "config.json").read_text())  # the pair run reads, split in two
    assert json.loads((out / "report.json").read_text())["config"]["parallel"] == {
        "world_size": 2, "backend": "gloo", "heads_per_rank": shipped["num_attention_heads"] // 2,
        "experts_per_rank": shipped["n_routed_experts"] // 2}


@pytest.mark.parametrize(("env", "message"), [
    ({"WORLD_SIZE": "abc"}, "WORLD_SIZE='abc'"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0'"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 with WORLD_SIZE=2"),
    ({"WORLD_SIZE": "2", "RANK": "0"}, "MASTER_ADDR / MASTER_PORT are not set"),
])
def test_a_mistyped_launch_environment_is_named(monkeypatch, env, message):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ParallelError, match=re.escape(message)):
        init_from_env("cpu")


def test_world_size_2_with_one_process_fails_within_the_rendezvous_timeout(tmp_path):
    """The CLI under WORLD_SIZE=2 with no second rank: exit 2 with the message in seconds, not a 30-minute wait."""
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "DDTREE_RENDEZVOUS_TIMEOUT_S": "3"}
    env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    started = time.monotonic()
    command = [sys.executable, "-m", "cli", "run", "--fixture", str(TINY_FIXTURE), "--max-new", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240,
                          cwd=pathlib.Path(__file__).parents[1])
    assert done.returncode == 2, done.stderr
    assert "did not join" in done.stderr and "torchrun --nproc-per-node 2" in done.stderr, done.stderr
    assert time.monotonic() - started < 200
