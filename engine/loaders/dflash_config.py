"""DFlashConfig: the drafter's fields and valid ranges, checked once, and how z-lab's config.json maps to it.

A DFlash checkpoint's config.json is a transformers Qwen3Config plus `block_size`, `num_target_layers` and
`dflash_config: {mask_token_id, target_layer_ids}` (z-lab/dflash `DFlashDraftModel`). A Qwen3 field it leaves
out takes Qwen3Config's default, as transformers would give it; the DFlash fields are required, except
target_layer_ids, which z-lab derives from the depths when it is missing (build_target_layer_ids).
"""
from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from typing import Any

# The target's config checks, reused: the same limits and the same YaRN rules hold for the drafter.
from engine.config import (
    MAX_BLOCK_SIZE,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_ROPE_THETA,
    MAX_VOCAB_SIZE,
    MAX_WIDTH,
    MIN_BLOCK_SIZE,
    ConfigError,
    _as_float,
    _as_int,
    _check,
    _yarn,
)
from engine.loaders.hf_config import HFLoadError
from engine.loaders.hf_config import _rope as hf_rope_settings  # the one parser of transformers' RoPE keys

ARCHITECTURE = "DFlashDraftModel"
MODEL_TYPE = "qwen3"
# Qwen3Config's defaults (transformers 5.24) for the fields config.json may leave out.
QWEN3_DEFAULTS = {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "head_dim": 128, "num_key_value_heads": 32}
REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
            "block_size", "num_target_layers")
# Keys whose one supported value is what every released DFlash drafter ships with.
FIXED_KEYS = {"hidden_act": "silu", "attention_bias": False, "use_sliding_window": False, "partial_rotary_factor": 1.0}
# Keys that do not change the forward pass (tokenizer ids, bookkeeping, the sliding window when it is off, the
# drafter's unused embedding flag) or that are read elsewhere (RoPE by hf_rope_settings).
IGNORED_KEYS = frozenset({
    "architectures", "model_type", "auto_map", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout",
    "tie_word_embeddings", "sliding_window", "max_window_layers", "layer_types", "dflash_config",
    "rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings",
})


class DFlashLoadError(ValueError):
    """A DFlash checkpoint cannot be used as it is, or not with this target; the message names the file, field
    or tensor and says what to change."""


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default target layers: spread evenly from layer 1 to layer num_target_layers - 3, rounded (one
    draft layer takes the middle layer). For 61 target and 6 draft layers: [1, 12, 24, 35, 47, 58]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


# name -> (min, max): the limits ModelConfig holds a target to, for the drafter's fields
_INT_FIELDS = {
    "hidden_size": (1, MAX_WIDTH), "intermediate_size": (1, MAX_WIDTH), "num_hidden_layers": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS), "num_key_value_heads": (1, MAX_HEADS), "head_dim": (2, MAX_HEAD_DIM),
    "vocab_size": (1, MAX_VOCAB_SIZE), "block_size": (MIN_BLOCK_SIZE, MAX_BLOCK_SIZE),
    "num_target_layers": (1, MAX_LAYERS), "max_position_embeddings": (1, MAX_POSITIONS),
}


@dataclass(slots=True, frozen=True)
class DFlashConfig:
    """The drafter's shape and numerics, every field checked once for its type and range (numbers stored as plain
    ints and floats, target_layer_ids as a tuple, rope_scaling as a checked copy)."""

    hidden_size: int  # d: the target's hidden size (the drafter embeds with the target's embedding)
    intermediate_size: int
    num_hidden_layers: int  # draft layers
    num_attention_heads: int
    num_key_value_heads: int  # GQA: each key/value head serves num_attention_heads // num_key_value_heads queries
    head_dim: int
    vocab_size: int
    block_size: int  # the block it was trained at: [root, MASK x (block_size - 1)]
    num_target_layers: int  # depth of the target it was trained against
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # target layers whose outputs it reads, in feature order
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # YaRN: {"type": "yarn", "factor", "original_max_position_embeddings", ...}
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        for name, (lo, hi) in _INT_FIELDS.items():
            self._set(name, _as_int(name, getattr(self, name), lo, hi))
        _check(self.head_dim % 2 == 0, "head_dim", self.head_dim, "an even integer (RoPE rotates pairs of dims)")
        _check(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
               self.num_key_value_heads, f"a divisor of num_attention_heads={self.num_attention_heads}")
        self._set("mask_token_id", _as_int("dflash_config.mask_token_id", self.mask_token_id, 0,
                                           self.vocab_size - 1))
        ids = self.target_layer_ids
        allowed = f"distinct layer indices in [0, {self.num_target_layers}) (num_target_layers), at least one"
        _check(isinstance(ids, (tuple, list)) and len(ids) > 0, "dflash_config.target_layer_ids", ids, allowed)
        ids = tuple(_as_int("dflash_config.target_layer_ids", i, 0, self.num_target_layers - 1) for i in ids)
        _check(len(set(ids)) == len(ids), "dflash_config.target_layer_ids", ids, allowed)
        self._set("target_layer_ids", ids)
        self._set("rms_norm_eps", _as_float("rms_norm_eps", self.rms_norm_eps, ("(", 0.0, 1.0, ")")))
        self._set("rope_theta", _as_float("rope_theta", self.rope_theta, ("(", 1.0, MAX_ROPE_THETA, "]")))
        if self.rope_scaling is not None:
            self._set("rope_scaling", _yarn(self.rope_scaling))

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: only __post_init__ normalises a field

    @property
    def num_context_features(self) -> int:
        """Width of the target hidden states it reads: len(target_layer_ids) * hidden_size (fc's input)."""
        return len(self.target_layer_ids) * self.hidden_size

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "target_layer_ids": list(self.target_layer_ids)}


def config_from_json(data: Any, where: str) -> DFlashConfig:
    """Map z-lab's config.json (already parsed) to a DFlashConfig; DFlashLoadError names what is wrong."""
    if not isinstance(data, dict):
        raise DFlashLoadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    archs = data.get("architectures")
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise DFlashLoadError(f"{where}: architectures={archs!r:.200}; a DFlash drafter's list holds "
                              f"{ARCHITECTURE!r} (z-lab/dflash). Pass the drafter's directory, not the target's")
    if data.get("model_type") != MODEL_TYPE:
        raise DFlashLoadError(f"{where}: model_type={data.get('model_type')!r:.80}; DFlash drafters are "
                              f"{MODEL_TYPE!r} (Qwen3 decoder layers)")
    for key, value in FIXED_KEYS.items():
        given = data.get(key, value)
        if given != value or isinstance(given, bool) != isinstance(value, bool):  # 0 is not false here
            raise DFlashLoadError(f"{where}: {key}={given!r:.80} is not supported; only {value!r}")
    layer_types = data.get("layer_types") or []
    if not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types):
        raise DFlashLoadError(f"{where}: layer_types={layer_types!r:.200}; only full_attention layers are "
                              "supported")
    missing = [k for k in REQUIRED if k not in data]
    dflash = data.get("dflash_config")
    if not isinstance(dflash, dict) or "mask_token_id" not in dflash:
        missing.append("dflash_config.mask_token_id")
    if missing:
        raise DFlashLoadError(f"{where}: missing field(s) {missing}; a DFlash config.json names them (z-lab's "
                              "DFlashDraftModel reads them)")
    unknown = sorted(set(data) - set(REQUIRED) - set(QWEN3_DEFAULTS) - set(FIXED_KEYS) - IGNORED_KEYS
                     - {"quantization_config"})
    unknown += sorted(f"dflash_config.{k}" for k in set(dflash) - {"mask_token_id", "target_layer_ids"})
    if unknown:
        warnings.warn(f"{where}: ignoring config key(s) {unknown[:20]} (not used by the DFlash forward pass)",
                      stacklevel=3)
    _check_rope_type(data, where)
    try:  # a YaRN original_max_position_embeddings falls back to Qwen3's max_position_embeddings default
        theta, scaling = hf_rope_settings({"max_position_embeddings": QWEN3_DEFAULTS["max_position_embeddings"],
                                           **data}, where)
    except HFLoadError as exc:
        raise DFlashLoadError(str(exc)) from exc
    fields = {k: data[k] for k in REQUIRED} | {k: data.get(k, v) for k, v in QWEN3_DEFAULTS.items()}
    if fields["num_key_value_heads"] is None:  # Qwen3Config: null means one key/value head per query head
        fields["num_key_value_heads"] = fields["num_attention_heads"]
    ids = dflash.get("target_layer_ids")
    depths = (data["num_target_layers"], data["num_hidden_layers"])
    derived = ids is None and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in depths)
    if derived:
        ids = build_target_layer_ids(*depths)  # else DFlashConfig names the bad depth first
    try:
        return DFlashConfig(**fields, mask_token_id=dflash["mask_token_id"], target_layer_ids=ids,
                            rope_theta=theta, rope_scaling=scaling)
    except ConfigError as exc:
        if derived and "target_layer_ids" in str(exc):
            raise DFlashLoadError(f"{where}: config.json has no dflash_config.target_layer_ids, and the ones derived "
                                  f"from num_target_layers={depths[0]} and num_hidden_layers={depths[1]} "
                                  f"(build_target_layer_ids: {ids}) do not fit ({exc}); write target_layer_ids "
                                  "into dflash_config") from exc
        raise DFlashLoadError(f"{where}: {exc}; fix that field in config.json") from exc


def config_to_json(cfg: DFlashConfig) -> dict:
    """z-lab's config.json for cfg (the inverse of config_from_json)."""
    data = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE, "hidden_act": "silu",
            "attention_bias": False, "block_size": cfg.block_size, "num_target_layers": cfg.num_target_layers,
            "dflash_config": {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.target_layer_ids)}}
    for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "rope_theta",
                 "max_position_embeddings"):
        data[name] = getattr(cfg, name)
    data["rope_scaling"] = cfg.rope_scaling
    return data


def _check_rope_type(data: dict, where: str) -> None:
    """Refuse, in the drafter's words, a RoPE type it does not run (plain RoPE and YaRN are supported);
    hf_rope_settings checks the rest of the RoPE keys."""
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    kind = (rope.get("rope_type") or rope.get("type") or "default") if isinstance(rope, dict) else "default"
    if kind not in ("default", "yarn"):
        raise DFlashLoadError(f"{where}: RoPE type {kind!r} is not supported; the DFlash drafter runs plain RoPE "
                              "('default') or 'yarn'")
