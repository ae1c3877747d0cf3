"""Config validation: every field's type and range, JSON round trip, and DecodeConfig's knobs."""
from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import (
    DECODE,
    DEVICES,
    MAX_TOTAL_EXPERTS,
    SAMPLING,
    ConfigError,
    DecodeConfig,
    ModelConfig,
    batch_invariant_default,
)
from engine.loaders.hf_config import ARCHITECTURE, config_from_hf, fp8_block_size
from engine.loaders.hf_import import HFLoadError
from engine.model import reference, rope
from engine.model.fixtures import tiny_config
from engine.model.weights import weight_shapes
from engine.settings import options_of

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


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


# Each of these passed the check once and then broke the model (ZeroDivisionError, TypeError, "math domain
# error", OverflowError in engine/model/rope.py, the golden model or the torch model) or asked for huge allocations.
BROKE_THE_MODEL = {
    "rope_theta 1 with YaRN": ({"rope_theta": 1.0, "rope_scaling": YARN}, r"rope_theta=1\.0 .*\(1, 1e\+12\]"),
    "beta_fast a string": ({"rope_scaling": {**YARN, "beta_fast": "x"}}, "rope_scaling.beta_fast='x'"),
    "mscale a string": ({"rope_scaling": {**YARN, "mscale": "x"}}, "rope_scaling.mscale='x'"),
    "beta_slow negative": ({"rope_scaling": {**YARN, "beta_slow": -1}}, "rope_scaling.beta_slow=-1"),
    "beta_fast subnormal": ({"rope_scaling": {**YARN, "beta_fast": 1e-320}}, "rope_scaling.beta_fast=1e-320"),
    "mscale_all_dim negative": ({"rope_scaling": {**YARN, "mscale_all_dim": -20.0}}, "mscale_all_dim=-20"),
    "attention_factor zero": ({"rope_scaling": {**YARN, "attention_factor": 0}}, "attention_factor=0"),
    "truncate a number": ({"rope_scaling": {**YARN, "truncate": 1}}, "rope_scaling.truncate=1 .*true or false"),
    "original max a float": ({"rope_scaling": {**YARN, "original_max_position_embeddings": 64.5}},
                             "original_max_position_embeddings=64.5"),
    "factor below 1": ({"rope_scaling": {**YARN, "factor": 0.5}}, r"rope_scaling.factor=0.5 .*\[1, 1024\]"),
    "factor missing": ({"rope_scaling": {"type": "yarn", "original_max_position_embeddings": 64}},
                       "rope_scaling needs 'factor'"),
    "unknown YaRN key": ({"rope_scaling": {**YARN, "low_freq_factor": 1.0}}, r"unknown key\(s\) \['low_freq_factor'\]"),
    "two types": ({"rope_scaling": {**YARN, "rope_type": "linear"}}, "rope_type='linear'"),
    "routed_scaling_factor 1e100": ({"routed_scaling_factor": 1e100}, r"routed_scaling_factor=1e\+100"),
    "rms_norm_eps 2**64": ({"rms_norm_eps": 2**64}, r"rms_norm_eps=18446744073709551616 .*\(0, 1\)"),
    "rms_norm_eps 1": ({"rms_norm_eps": 1}, "rms_norm_eps=1 "),
    "rope_theta inf": ({"rope_theta": math.inf}, "rope_theta=inf"),
    "layers 1e5": ({"num_hidden_layers": 10**5}, r"num_hidden_layers=100000 .*\[1, 1024\]"),
    "experts 1e8": ({"n_routed_experts": 10**8}, r"n_routed_experts=100000000 .*\[0, 4096\]"),
    "experts over all layers": ({"num_hidden_layers": 1000, "n_routed_experts": 4096, "n_group": 1},
                                f"at most {MAX_TOTAL_EXPERTS} routed experts over the 999 MoE layers"),
    "vocab 2**40": ({"vocab_size": 2**40}, "vocab_size=1099511627776"),
    "positions 2**40": ({"max_position_embeddings": 2**40}, "max_position_embeddings=1099511627776"),
    "hidden a bool": ({"hidden_size": True}, "hidden_size=True"),
    "layers a float": ({"num_hidden_layers": 3.0}, "num_hidden_layers=3.0"),
    "eps a bool": ({"rms_norm_eps": True}, "rms_norm_eps=True"),
    "interleave a number": ({"rope_interleave": 1}, "rope_interleave=1 .*true or false"),
    "scoring_func a list": ({"scoring_func": ["sigmoid"]}, "scoring_func"),
}


@pytest.mark.parametrize("case", sorted(BROKE_THE_MODEL))
def test_every_field_is_checked_once_for_kdtr_and_config_json(case):
    changes, message = BROKE_THE_MODEL[case]
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(tiny_config(), **changes)
    with pytest.raises(ConfigError, match=message):  # the .kdtr path: its header holds the config as JSON
        ModelConfig.from_json(json.dumps({**tiny_config().to_dict(), **changes}))
    hf = {"architectures": [ARCHITECTURE], "model_type": "deepseek_v3", **tiny_config().to_dict(), **changes}
    with pytest.raises(HFLoadError, match=message):  # config.json, through the same check
        config_from_hf(hf)


def test_numbers_are_stored_as_plain_ints_and_floats():
    cfg = dataclasses.replace(tiny_config(), vocab_size=np.int64(300), hidden_size=np.int32(64),
                              rms_norm_eps=np.float32(1e-5), rope_theta=20000,
                              rope_scaling={"rope_type": "yarn", "factor": 2, "original_max_position_embeddings":
                                            np.int16(64), "beta_fast": None, "truncate": False})
    assert type(cfg.vocab_size) is int and cfg.vocab_size == 300 and type(cfg.hidden_size) is int
    assert type(cfg.rms_norm_eps) is float and cfg.rms_norm_eps == float(np.float32(1e-5))
    assert type(cfg.rope_theta) is float and cfg.rope_theta == 20000.0
    assert cfg.rope_scaling == {"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 64,
                                "truncate": False}
    assert ModelConfig.from_json(cfg.to_json()) == cfg


_field_values = st.one_of(
    st.none(), st.booleans(), st.text(max_size=4), st.floats(allow_nan=True), st.integers(-2, 10),
    st.integers(-2**70, 2**70), st.sampled_from([1e-320, 1e-3, 0.5, 1.0, 1.0 + 1e-15, 2.0, 1e6, 1e12, 2**64]),
    st.dictionaries(st.sampled_from(["type", "factor", "original_max_position_embeddings", "beta_fast"]),
                    st.sampled_from(["yarn", 1, 2.5, 64, -1, "x", None]), max_size=4),
)
_yarn_values = st.fixed_dictionaries(
    {"type": st.just("yarn"), "factor": st.floats(0.5, 2000) | st.integers(-1, 5),
     "original_max_position_embeddings": st.integers(-1, 100) | st.just(2**21)},
    optional={k: _field_values for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor",
                                         "truncate")})


@settings(max_examples=300, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(sorted(tiny_config().to_dict())), _field_values, max_size=3),
       yarn=st.none() | _yarn_values)
def test_fuzz_an_accepted_config_builds_the_model_tables(changes, yarn):
    """Whatever a config holds, it is refused with a ConfigError or every number the models derive from it is
    finite: RoPE tables (torch and numpy), softmax scales, and a weight table of bounded size."""
    fields = {**tiny_config().to_dict(), "rope_scaling": yarn, **changes}
    try:
        cfg = ModelConfig.from_dict(fields)
    except ConfigError:
        return
    cos, sin, mscale = rope.rope_tables(cfg, 8, "cpu")
    assert cos.isfinite().all() and sin.isfinite().all() and math.isfinite(mscale)
    rcos, rsin = reference.rope_tables(cfg, 8)
    assert np.isfinite(rcos).all() and np.isfinite(rsin).all() and math.isfinite(reference.softmax_scale(cfg))
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    if num_moe * cfg.n_routed_experts < 10_000:
        assert len(weight_shapes(cfg)) <= 3 * MAX_TOTAL_EXPERTS + 16 * cfg.num_hidden_layers + 4


def test_model_config_json_errors():
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json("{")
    data = tiny_config().to_dict()
    with pytest.raises(ConfigError, match="unknown"):
        ModelConfig.from_dict({**data, "bogus": 1})
    del data["vocab_size"]
    with pytest.raises(ConfigError, match="missing"):
        ModelConfig.from_dict(data)


# The released config.json files (their model-defining keys), FP8 quantization_config included.
RELEASED = {
    "DeepSeek-V3": dict(
        model_type="deepseek_v3", vocab_size=129280, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_nextn_predict_layers=1, num_attention_heads=128,
        num_key_value_heads=128, n_shared_experts=1, n_routed_experts=256, ep_size=1, routed_scaling_factor=2.5,
        kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
        topk_method="noaux_tc", n_group=8, topk_group=4, num_experts_per_tok=8, moe_layer_freq=1,
        first_k_dense_replace=3, norm_topk_prob=True, scoring_func="sigmoid", aux_loss_alpha=0.001, seq_aux=True,
        hidden_act="silu", max_position_embeddings=163840, initializer_range=0.02, rms_norm_eps=1e-06,
        use_cache=True, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, rope_theta=10000,
        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                      "original_max_position_embeddings": 4096, "type": "yarn"},
        attention_bias=False, attention_dropout=0.0, torch_dtype="bfloat16", transformers_version="4.33.1"),
    "Kimi-K2": dict(
        model_type="kimi_k2", vocab_size=163840, hidden_size=7168, intermediate_size=18432,
        moe_intermediate_size=2048, num_hidden_layers=61, num_attention_heads=64, num_key_value_heads=64,
        n_shared_experts=1, n_routed_experts=384, routed_scaling_factor=2.827, kv_lora_rank=512, q_lora_rank=1536,
        qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, topk_method="noaux_tc", n_group=1, topk_group=1,
        num_experts_per_tok=8, moe_layer_freq=1, first_k_dense_replace=1, norm_topk_prob=True,
        scoring_func="sigmoid", hidden_act="silu", max_position_embeddings=131072, rms_norm_eps=1e-06,
        pad_token_id=163839, bos_token_id=163584, eos_token_id=163585, tie_word_embeddings=False,
        rope_theta=50000.0, rope_scaling={"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
                                          "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                                          "type": "yarn"},
        attention_bias=False, attention_dropout=0.0, torch_dtype="bfloat16", num_nextn_predict_layers=0),
}


@pytest.mark.parametrize("name", sorted(RELEASED))
def test_released_configs_are_within_the_limits(name):
    data = {"architectures": [ARCHITECTURE], **RELEASED[name],
            "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                    "weight_block_size": [128, 128]}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = config_from_hf(data)
    assert fp8_block_size(data) == (128, 128)
    assert (cfg.num_hidden_layers, cfg.n_routed_experts, cfg.vocab_size) == (61, data["n_routed_experts"],
                                                                           data["vocab_size"])
    assert cfg.rope_scaling["factor"] == data["rope_scaling"]["factor"]


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


def test_every_decode_field_carries_its_setting():
    options = options_of(DecodeConfig)
    assert [o.name for o in options] == [f.name for f in dataclasses.fields(DecodeConfig)]
    flags = [flag for o in options for flag in (o.setting.flag, *o.setting.aliases)]
    assert len(set(flags)) == len(flags) and all(f.startswith("--") for f in flags)
    assert len({o.key for o in options}) == len(options)
    for o in options:
        s = o.setting
        assert s.help and s.label and s.section in (DECODE, SAMPLING), o.name
        assert o.kind in (int, float, bool, str) and (o.default is None or o.check(o.default) == o.default), o.name
        if o.kind in (int, float):
            assert s.widget in ("number", "slider") and s.lo is not None and s.step, o.name
        assert (s.widget == "select") == bool(s.choices) and (s.widget == "toggle") == (o.kind is bool), o.name


def numeric_options():
    return [o for o in options_of(DecodeConfig) if o.kind in (int, float)]


@pytest.mark.parametrize("opt", numeric_options(), ids=lambda o: o.name)
def test_decode_config_checks_the_range_its_setting_states(opt):
    s = opt.setting
    below = opt.kind(s.lo) if s.lo_open else opt.kind(s.lo - 1)
    outside = [below] + ([] if s.hi is None else [opt.kind(s.hi + 1)])
    for value in outside:
        with pytest.raises(ConfigError) as caught:
            DecodeConfig(**{opt.name: value})
        assert str(caught.value) == f"{opt.name}={value!r} is out of range: expected {opt.expected}"
    inside = [math.nextafter(s.lo, math.inf) if s.lo_open else opt.kind(s.lo)]
    inside += [] if s.hi is None else [opt.kind(s.hi)]
    assert [getattr(DecodeConfig(**{opt.name: v}), opt.name) for v in inside] == inside


def test_top_p_is_open_at_zero_and_closed_at_one():
    top_p = next(o for o in options_of(DecodeConfig) if o.name == "top_p")
    assert top_p.expected == "a number in (0, 1] (1: no nucleus filter)"
    with pytest.raises(ConfigError, match=r"top_p=0.0 is out of range: expected a number in \(0, 1\]"):
        DecodeConfig(top_p=0.0)
    assert DecodeConfig(top_p=1e-9).top_p == 1e-9


def test_decode_numbers_are_stored_as_plain_ints_and_floats():
    cfg = DecodeConfig(budget=np.int64(5), temperature=1, top_p=np.float32(0.5), seed=np.uint8(3))
    assert (type(cfg.budget), type(cfg.temperature), type(cfg.top_p), type(cfg.seed)) == (int, float, float, int)
    with pytest.raises(ConfigError, match="batch_invariant=1 .*true or false"):
        DecodeConfig(batch_invariant=1)
    with pytest.raises(ConfigError, match="device='tpu' is out of range: expected one of cpu, cuda"):
        DecodeConfig(device="tpu")


def test_batch_invariant_defaults_to_the_devices_choice():
    """Not given, the batch-invariant mode is on where it costs under 10% (the CPU) and off on CUDA; given, it stays
    as given; a record holds the resolved value."""
    assert DecodeConfig().batch_invariant is True and DecodeConfig().to_dict()["batch_invariant"] is True
    assert DecodeConfig(device="cuda").batch_invariant is False
    assert DecodeConfig(batch_invariant=False).batch_invariant is False
    assert DecodeConfig(device="cuda", batch_invariant=True).batch_invariant is True
    assert {d: batch_invariant_default(d) for d in DEVICES} == {"cpu": True, "cuda": False}
    with pytest.raises(ConfigError, match="batch_invariant='yes' is out of range: expected true or false"):
        DecodeConfig(batch_invariant="yes")
