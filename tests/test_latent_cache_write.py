"""The target's latent cache write (engine/model/target.py `_write_latent`): one ops.latent_write launch where the
op takes the RoPE, the separate norm, RoPE and copies where it does not. Both write the same cache bits in every
mode whose norm is ops.rms_norm_rows (the batch-invariant mode on the CPU, both modes on CUDA)."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_decode import make_config

import engine.model.target as target_module
from engine.loaders.checkpoint import Checkpoint
from engine.model.cache import LatentCache
from engine.model.fixtures import random_weights
from engine.model.target import TargetModel

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _forward_cache(model: TargetModel, tokens: torch.Tensor, prefix: int, batch_invariant: bool) -> LatentCache:
    cfg, n = model.cfg, tokens.shape[0]
    cache = LatentCache(cfg.num_hidden_layers, prefix + n + 3, cfg.kv_lora_rank, cfg.qk_rope_head_dim, model.device,
                        model.dtype, model.rope(prefix + n + 4))
    cache.prefix_len.fill_(prefix)
    causal = torch.ones(n, n, dtype=torch.bool, device=model.device).tril()
    model.forward(tokens, torch.arange(n, device=model.device), causal, cache, batch_invariant=batch_invariant)
    return cache


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleave", [False, True])
def test_the_fused_write_equals_the_separate_ops_bit_for_bit(device, interleave, monkeypatch):
    seed = random.randrange(2**16)
    cfg = make_config({"layers": 2, "heads": 2, "q_lora": 16, "kv_lora": 24, "rope": 8, "experts": (4, 1, 1, 2),
                       "norm_topk": True, "dense": 1, "interleave": interleave, "yarn": False})
    dtype = "bfloat16" if device == "cuda" else "float32"
    model = TargetModel.from_checkpoint(Checkpoint(cfg, random_weights(cfg, seed), "random"), device, dtype)
    tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, cfg.vocab_size, 7)).to(device)
    prefix = random.randrange(0, 5)
    invariant = device == "cpu"  # the CPU's fast mode norms in torch's float ops, not rms_norm_rows
    launches = []
    real_op = target_module.ops.latent_write
    monkeypatch.setattr(target_module.ops, "latent_write", lambda *args: launches.append(1) or real_op(*args))
    fused = _forward_cache(model, tokens, prefix, invariant)
    assert len(launches) == cfg.num_hidden_layers
    monkeypatch.setattr(target_module, "ROPE_OP_MAX_DIM", 0)  # as for a RoPE wider than the op takes
    separate = _forward_cache(model, tokens, prefix, invariant)
    assert len(launches) == cfg.num_hidden_layers
    written = slice(prefix, prefix + tokens.shape[0])
    assert fused.ckv[:, written].abs().sum() > 0 and fused.kpe[:, written].abs().sum() > 0
    assert torch.equal(fused.ckv, separate.ckv)
    assert torch.equal(fused.kpe, separate.kpe)
