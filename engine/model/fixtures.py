"""The tiny seeded model every test and the dashboard's demo mode run on, and the `make-fixture` command.

The fixture is a pure function of its seed: the same seed gives byte-identical .kdtr files, so the committed
models/model_tiny.kdtr can be checked by regenerating it.
"""
from __future__ import annotations

import numpy as np

from engine.config import ModelConfig
from engine.loaders.checkpoint import Checkpoint
from engine.model.reference import greedy_generate
from engine.model.weights import weight_shapes

# Weight scale: std = GAIN / sqrt(fan_in), so each layer's output is of the order of its input and the greedy
# continuation depends on context (it does not settle into repeating one token). lm_head gets LOGIT_GAIN so the
# logits are peaked (std ~3) with clear top-1/top-2 gaps: a float32 model reproduces the golden argmaxes.
GAIN = 1.5
LOGIT_GAIN = 3.0
EMBED_STD = 1.0
NORM_NOISE = 0.1
BIAS_STD = 0.05


def tiny_config() -> ModelConfig:
    return ModelConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        intermediate_size=128, moe_intermediate_size=32,
        n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid", first_k_dense_replace=1,
        rope_interleave=True, rope_scaling=None, max_position_embeddings=256,
    )


def random_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    """Seeded float32 weights for every tensor of weight_shapes(cfg), drawn in the table's order."""
    rng = np.random.default_rng(seed)
    weights = {}
    for name, shape in weight_shapes(cfg).items():
        if name.endswith("e_score_correction_bias"):
            w = BIAS_STD * rng.standard_normal(shape)
        elif len(shape) == 1:  # RMSNorm weights
            w = 1.0 + NORM_NOISE * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            w = EMBED_STD * rng.standard_normal(shape)
        elif name == "lm_head.weight":
            w = LOGIT_GAIN / np.sqrt(shape[1]) * rng.standard_normal(shape)
        else:
            w = GAIN / np.sqrt(shape[1]) * rng.standard_normal(shape)
        weights[name] = w.astype(np.float32)
    return weights


def make_fixture(seed: int = 0, prompt_len: int = 8, num_golden: int = 24) -> Checkpoint:
    """The tiny model with seed's weights, a seeded prompt, and its greedy continuation per the golden model."""
    cfg = tiny_config()
    weights = random_weights(cfg, seed)
    prompt = np.random.default_rng([seed, 1]).integers(0, cfg.vocab_size, size=prompt_len, dtype=np.int64)
    tokens, logits = greedy_generate(cfg, weights, prompt, num_golden)
    return Checkpoint(config=cfg, weights=weights, source=f"make_fixture(seed={seed})", prompt=prompt,
                      golden_tokens=tokens, golden_logits=logits.astype(np.float32))
