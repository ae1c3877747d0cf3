"""Shared by the MoE tests: small random MoE configs and expert stacks, and the tolerance they are held to."""
from __future__ import annotations

import random

import torch

from engine.config import ModelConfig
from engine.model.moe import Experts

TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2}  # max |sparse - reference| over max |reference|


def moe_config(rng: random.Random, **over) -> ModelConfig:
    """A small random MoE model: 4 to 32 experts in 1, 2 or 4 groups, top-1 to top-6."""
    n_group = rng.choice([1, 2, 4])
    experts = n_group * rng.choice([2, 4, 8])
    topk_group = rng.randint(1, n_group)
    fields = dict(
        vocab_size=61, hidden_size=24, num_hidden_layers=rng.randint(1, 3), num_attention_heads=2, q_lora_rank=None,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, intermediate_size=40,
        moe_intermediate_size=rng.choice([8, 16]), n_routed_experts=experts, n_shared_experts=rng.randint(0, 1),
        num_experts_per_tok=rng.randint(1, min(6, topk_group * experts // n_group)), n_group=n_group,
        topk_group=topk_group, routed_scaling_factor=2.0, norm_topk_prob=rng.random() < 0.5,
        scoring_func=rng.choice(["sigmoid", "softmax"]), first_k_dense_replace=0, max_position_embeddings=160)
    return ModelConfig(**{**fields, **over})


def random_experts(num: int, hidden: int, inter: int, dtype: torch.dtype, gen: torch.Generator) -> Experts:
    return Experts((torch.randn(num, 2 * inter, hidden, generator=gen) / hidden ** 0.5).to(dtype),
                   (torch.randn(num, hidden, inter, generator=gen) / inter ** 0.5).to(dtype))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())
