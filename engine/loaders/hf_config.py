"""A Hugging Face DeepseekV3ForCausalLM config.json (DeepSeek-V3, Kimi-K2) as a ModelConfig, plus its FP8 block size.

transformers' DeepseekV3Config is the semantics we follow: a field config.json leaves out takes its default, and
the RoPE settings come from `rope_scaling` (released checkpoints) or `rope_parameters` (transformers 5). The
values themselves are checked once, by ModelConfig; this module maps the layout and refuses what we would
compute differently (other architectures, activations, RoPE types, quantizations).
"""
from __future__ import annotations

import warnings

from engine.config import ConfigError, ModelConfig

ARCHITECTURE = "DeepseekV3ForCausalLM"
MODEL_TYPES = ("deepseek_v3", "kimi_k2")

# DeepseekV3Config's defaults (transformers 5.24) for the ModelConfig fields, used where config.json
# omits a field. transformers has no scoring_func (its router is always sigmoid).
HF_DEFAULTS = {
    "vocab_size": 129280, "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 256,
    "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "scoring_func": "sigmoid", "first_k_dense_replace": 3,
    "rms_norm_eps": 1e-6, "rope_interleave": True, "max_position_embeddings": 4096, "tie_word_embeddings": False,
}
# Keys whose one supported value is the one DeepSeek-V3 / Kimi-K2 ship with.
FIXED_KEYS = {"hidden_act": "silu", "attention_bias": False, "moe_layer_freq": 1, "topk_method": "noaux_tc",
              "partial_rotary_factor": 1.0}
# Keys that do not change the forward pass (training, serving, tokenizer, bookkeeping, derived values).
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout",
    "aux_loss_alpha", "seq_aux", "ep_size", "output_router_logits", "router_aux_loss_coef", "pretraining_tp",
    "num_key_value_heads",  # MLA: every head gets its own K/V from kv_b_proj
    "head_dim", "qk_head_dim",  # derived by DeepseekV3Config from the qk_* dims
    "num_nextn_predict_layers", "num_mtp_layers",  # MTP layers are dropped (see engine.loaders.hf_plan)
    "rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings",  # read by _rope
    "quantization_config",  # read by fp8_block_size
})
# DeepSeek-V3's FP8 checkpoints: e4m3 weights, each with a float32 <name>_scale_inv of one number per block.
FP8_KEYS = {"quant_method", "fmt", "activation_scheme", "weight_block_size",
            "modules_to_not_convert"}  # the last only lists tensors stored unquantized: each tensor's dtype says so
MAX_BLOCK = 4096


class HFLoadError(ValueError):
    """A Hugging Face model directory cannot be loaded as it is; the message names the file and what to change."""


def _same(value: object, supported: object) -> bool:
    return value == supported and isinstance(value, bool) == isinstance(supported, bool)


def _rope(data: dict, where: str) -> tuple[object, dict | None]:
    """(rope_theta, ModelConfig.rope_scaling) from either the released or the transformers 5 layout."""
    legacy, params = data.get("rope_scaling"), data.get("rope_parameters")
    if legacy and params and legacy != params:
        raise HFLoadError(f"{where}: rope_scaling and rope_parameters disagree ({legacy!r:.200} vs {params!r:.200}); "
                          "keep one")
    rope = params or legacy or {}
    if not isinstance(rope, dict):
        raise HFLoadError(f"{where}: the RoPE settings must be a JSON object or null, got {rope!r:.200}")
    rope = dict(rope)
    theta_top, theta_in = data.get("rope_theta"), rope.pop("rope_theta", None)
    if theta_top is not None and theta_in is not None and theta_top != theta_in:
        raise HFLoadError(f"{where}: rope_theta={theta_top!r:.40} but the RoPE dict says rope_theta={theta_in!r:.40}; "
                          "keep one")
    theta = theta_in if theta_in is not None else theta_top if theta_top is not None else 10000.0
    kind, legacy_kind = rope.pop("rope_type", None), rope.pop("type", None)
    if kind and legacy_kind and kind != legacy_kind:
        raise HFLoadError(f"{where}: RoPE rope_type={kind!r:.40} but type={legacy_kind!r:.40}; keep one")
    kind = kind or legacy_kind or "default"
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise HFLoadError(f"{where}: RoPE type {kind!r:.40} is not supported; DeepSeek-V3 uses 'yarn' or 'default'")
    if not _same(rope.pop("partial_rotary_factor", 1.0), 1.0):
        raise HFLoadError(f"{where}: partial_rotary_factor != 1 is not supported (DeepSeek-V3 rotates all rope dims)")
    # Like transformers: a top-level original_max_position_embeddings wins, max_position_embeddings is the fallback.
    orig = data.get("original_max_position_embeddings", rope.get("original_max_position_embeddings"))
    if orig is None:
        orig = data.get("max_position_embeddings", HF_DEFAULTS["max_position_embeddings"])
    return theta, {"type": "yarn", **rope, "original_max_position_embeddings": orig}


def config_from_hf(data: object, where: str = "config.json") -> ModelConfig:
    """Map a DeepseekV3ForCausalLM config.json (already parsed) to ModelConfig; where names it in errors."""
    if not isinstance(data, dict):
        raise HFLoadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    archs = data.get("architectures")
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise HFLoadError(f"{where}: architectures={archs!r:.200}; expected a list holding {ARCHITECTURE!r} "
                          "(DeepSeek-V3, Kimi-K2), the only architecture supported")
    if data.get("model_type") not in MODEL_TYPES:
        raise HFLoadError(f"{where}: model_type={data.get('model_type')!r:.80}; expected one of {MODEL_TYPES}")
    for key, value in FIXED_KEYS.items():
        if not _same(data.get(key, value), value):
            raise HFLoadError(f"{where}: {key}={data[key]!r:.80} is not supported; only {value!r}")
    fields = {name: data.get(name, default) for name, default in HF_DEFAULTS.items()}
    unknown = sorted(set(data) - set(fields) - set(FIXED_KEYS) - IGNORED_KEYS)
    if unknown:
        warnings.warn(f"{where}: ignoring config key(s) {unknown[:20]} (not used by the DeepSeek-V3 forward pass)",
                      stacklevel=3)
    fields["rope_theta"], fields["rope_scaling"] = _rope(data, where)
    try:
        return ModelConfig.from_dict(fields)
    except ConfigError as exc:
        raise HFLoadError(f"{where}: {exc}; fix that field in config.json") from exc


def fp8_block_size(data: dict, where: str = "config.json") -> tuple[int, int] | None:
    """(rows, cols) of a block-wise FP8 checkpoint's scale blocks (DeepSeek-V3, Kimi-K2: 128 x 128), or None for a
    checkpoint that is not quantized; any other quantization is refused."""
    quant = data.get("quantization_config")
    if quant is None or quant == {}:
        return None
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    if method != "fp8":
        raise HFLoadError(f"{where}: the checkpoint is quantized (quantization_config.quant_method={method!r:.80}); "
                          "only block-wise fp8 (DeepSeek-V3's quant_method 'fp8' with weight_block_size) is "
                          "dequantized here: dequantize it to bfloat16/float32 safetensors first and drop "
                          "quantization_config")
    unknown = sorted(str(k) for k in set(quant) - FP8_KEYS)
    if unknown:
        raise HFLoadError(f"{where}: quantization_config key(s) {unknown[:10]} are not understood; an fp8 "
                          f"checkpoint here has only {sorted(FP8_KEYS)}")
    for key, supported in (("fmt", "e4m3"), ("activation_scheme", "dynamic")):
        if quant.get(key, supported) != supported:
            raise HFLoadError(f"{where}: quantization_config.{key}={quant[key]!r:.80} is not supported; only "
                              f"{supported!r} (the weights are dequantized once, activations stay unquantized)")
    block = quant.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2
            and all(isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BLOCK for b in block)):
        raise HFLoadError(f"{where}: quantization_config.weight_block_size={block!r:.80}; expected two integers in "
                          f"[1, {MAX_BLOCK}] (DeepSeek-V3: [128, 128]); per-tensor fp8 is not supported")
    return block[0], block[1]
