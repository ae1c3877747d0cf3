"""Random DFlash drafters of the Kimi-K2.5 layout at small widths, fitted to a small target, for the tests."""
from __future__ import annotations

import random

from engine.config import ModelConfig
from engine.loaders.dflash_config import DFlashConfig
from engine.model.dflash_fixtures import kimi_k25_layout

# RoPE variants the forward is checked under: plain, Kimi-K2.5's YaRN (attention factor 1), and a YaRN whose
# attention factor is not 1 (factor only) with its ramp inside the positions a test decode reaches.
ROPES = {
    "plain": None,
    "kimi-yarn": kimi_k25_layout().rope_scaling,
    "yarn-factor": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
}


def small_layout(target: ModelConfig, rope: str = "kimi-yarn", **overrides) -> DFlashConfig:
    """Kimi-K2.5's layout at small widths for `target`: 2 layers, 4 query / 2 key-value heads of head_dim 24
    (not hidden_size / heads, so a mix-up shows), random distinct target layers, a mask id near the end of the
    vocabulary."""
    num_ids = random.randint(1, target.num_hidden_layers)
    fields = dict(
        hidden_size=target.hidden_size, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, vocab_size=target.vocab_size, num_target_layers=target.num_hidden_layers,
        mask_token_id=target.vocab_size - 1 - random.randrange(8),
        target_layer_ids=tuple(random.sample(range(target.num_hidden_layers), num_ids)), rope_scaling=ROPES[rope])
    return kimi_k25_layout(**(fields | overrides))
