"""Config validation: every field's range, JSON round trip, and DecodeConfig's knobs."""
from __future__ import annotations

import dataclasses

import pytest

from engine.config import ConfigError, DecodeConfig, ModelConfig
from engine.fixtures import tiny_config


def test_json_round_trip():
    cfg = tiny_config()
    assert ModelConfig.from_json(cfg.to_json()) == cfg


@pytest.mark.parametrize("field,value,needle", [
    ("vocab_size", 0, "vocab_size=0"),
    ("hidden_size", -3, "hidden_size"),
    ("qk_rope_head_dim", 7, "even"),
    ("n_group", 3, "divisor of n_routed_experts"),
    ("topk_group", 5, "topk_group"),
    ("num_experts_per_tok", 9, "num_experts_per_tok"),
    ("scoring_func", "relu", "scoring_func"),
    ("rms_norm_eps", float("nan"), "rms_norm_eps"),
    ("first_k_dense_replace", 9, "first_k_dense_replace"),
    ("rope_scaling", {"type": "linear", "factor": 2}, "yarn"),
    ("q_lora_rank", 0, "q_lora_rank"),
])
def test_model_config_rejects_out_of_range(field, value, needle):
    with pytest.raises(ConfigError, match=needle):
        dataclasses.replace(tiny_config(), **{field: value})


def test_model_config_json_errors():
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json("{")
    data = tiny_config().to_dict()
    with pytest.raises(ConfigError, match="unknown"):
        ModelConfig.from_dict({**data, "bogus": 1})
    del data["vocab_size"]
    with pytest.raises(ConfigError, match="missing"):
        ModelConfig.from_dict(data)


@pytest.mark.parametrize("kwargs,needle", [
    ({"budget": -1}, "budget"), ({"budget": 1025}, "budget"), ({"block_size": 1}, "block_size"),
    ({"block_size": 33}, "block_size"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"device": "tpu"}, "device"),
    ({"dtype": "float16"}, "dtype"), ({"budget": 2.5}, "budget"),
])
def test_decode_config_rejects_out_of_range(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        DecodeConfig(**kwargs)


def test_decode_config_bounds_are_inclusive():
    assert DecodeConfig(budget=0, block_size=2).num_draft_positions == 1
    assert DecodeConfig(budget=1024, block_size=32).num_draft_positions == 31
