"""Model and decode configuration: the one place their fields and valid ranges are defined.

ModelConfig uses Hugging Face DeepseekV3Config field names so a checkpoint's config.json maps 1:1.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass
from typing import Any

MAX_BUDGET = 1024
MAX_NEW_TOKENS = 1 << 20  # a bound before anything is sized from it; the context is checked per model
MAX_TEMPERATURE = 100.0
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 2, 32
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
SCORING_FUNCS = ("sigmoid", "softmax")
LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: fixed in DeepSeek-V3 and transformers, not rms_norm_eps


class ConfigError(ValueError):
    """A configuration field is missing, of the wrong type, or out of range."""


def _check(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={value!r} is out of range: expected {allowed}")


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    _check(ok, name, value, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]")


def _is_positive_float(value: Any) -> bool:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return 0 < float(value) < math.inf
    except OverflowError:  # an int too large for a float
        return False


@dataclass(slots=True, frozen=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    first_k_dense_replace: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_interleave: bool = True
    rope_scaling: dict | None = None  # YaRN: {"type": "yarn", "factor", "original_max_position_embeddings", ...}
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank",
                     "qk_nope_head_dim", "v_head_dim", "intermediate_size", "moe_intermediate_size",
                     "max_position_embeddings", "n_group", "topk_group"):
            _check_int(name, getattr(self, name), 1)
        _check_int("qk_rope_head_dim", self.qk_rope_head_dim, 2)
        _check(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", self.qk_rope_head_dim, "an even number")
        if self.q_lora_rank is not None:
            _check_int("q_lora_rank", self.q_lora_rank, 1)
        _check_int("n_routed_experts", self.n_routed_experts, 0)
        _check_int("n_shared_experts", self.n_shared_experts, 0)
        _check_int("first_k_dense_replace", self.first_k_dense_replace, 0, self.num_hidden_layers)
        if self.first_k_dense_replace < self.num_hidden_layers:  # some layer is MoE
            _check_int("n_routed_experts", self.n_routed_experts, 1)
            _check_int("num_experts_per_tok", self.num_experts_per_tok, 1, self.n_routed_experts)
            _check(self.n_routed_experts % self.n_group == 0, "n_group", self.n_group,
                   f"a divisor of n_routed_experts={self.n_routed_experts}")
            _check_int("topk_group", self.topk_group, 1, self.n_group)
            _check(self.num_experts_per_tok <= self.topk_group * (self.n_routed_experts // self.n_group),
                   "num_experts_per_tok", self.num_experts_per_tok,
                   "at most topk_group * experts per group (the experts the group filter keeps)")
        _check(self.scoring_func in SCORING_FUNCS, "scoring_func", self.scoring_func, f"one of {SCORING_FUNCS}")
        for name in ("rms_norm_eps", "rope_theta", "routed_scaling_factor"):
            value = getattr(self, name)
            _check(_is_positive_float(value), name, value, "a finite number > 0")
        for name in ("norm_topk_prob", "rope_interleave", "tie_word_embeddings"):
            _check(isinstance(getattr(self, name), bool), name, getattr(self, name), "true or false")
        _check(self.rope_scaling is None or isinstance(self.rope_scaling, dict), "rope_scaling", self.rope_scaling,
               "null or an object")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("type", self.rope_scaling.get("rope_type"))
            _check(kind == "yarn", "rope_scaling.type", kind, "'yarn' (the only scaling DeepSeek-V3 uses) or null")
            factor = self.rope_scaling.get("factor")
            _check(isinstance(factor, (int, float)) and factor >= 1, "rope_scaling.factor", factor, "a number >= 1")
            orig = self.rope_scaling.get("original_max_position_embeddings")
            _check(isinstance(orig, int) and orig >= 1, "rope_scaling.original_max_position_embeddings", orig,
                   "an integer >= 1")

    # Derived quantities: the one definition both the torch model and the golden model use.
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"model config must be a JSON object, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(f"unknown model config field(s) {unknown}; known fields: {sorted(names)}")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in data]
        if missing:
            raise ConfigError(f"model config is missing required field(s) {missing}")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> ModelConfig:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"model config is not valid JSON: {exc}") from exc
        return cls.from_dict(data)


@dataclass(slots=True, frozen=True)
class DecodeConfig:
    """How to decode: tree budget B (drafted nodes, root excluded), block size (L = block_size - 1 drafted
    positions), how many tokens to generate, where, and how the target picks its token at every node
    (temperature 0: greedy; else a sample restricted by top_k / top_p, keyed by seed and position)."""

    budget: int = 64
    block_size: int = 8
    max_new_tokens: int = 24
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no nucleus filter
    batch_invariant: bool = False  # every row computed as AR computes it: DDTree == AR bit for bit

    def __post_init__(self) -> None:
        for name in ("budget", "block_size", "max_new_tokens", "seed", "top_k"):
            value = getattr(self, name)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                object.__setattr__(self, name, int(value))  # numpy integers are integers too
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        _check_int("budget", self.budget, 0, MAX_BUDGET)
        _check_int("block_size", self.block_size, MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)
        _check_int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        _check(self.device in DEVICES, "device", self.device, f"one of {DEVICES}")
        _check(self.dtype in DTYPES, "dtype", self.dtype, f"one of {DTYPES}")
        _check_int("seed", self.seed, 0, 2**63 - 1)
        _check(isinstance(self.temperature, float) and 0.0 <= self.temperature <= MAX_TEMPERATURE,
               "temperature", self.temperature, f"a number in [0, {MAX_TEMPERATURE:g}] (0: greedy)")
        _check_int("top_k", self.top_k, 0)
        _check(isinstance(self.top_p, float) and 0.0 < self.top_p <= 1.0, "top_p", self.top_p,
               "a number in (0, 1] (1: no nucleus filter)")
        _check(isinstance(self.batch_invariant, bool), "batch_invariant", self.batch_invariant, "true or false")

    @property
    def num_draft_positions(self) -> int:
        return self.block_size - 1

    @property
    def sampling(self) -> str:
        """The target's pick in words: "greedy" or "T=0.7, top-k 50, top-p 0.9, seed 3"."""
        if self.temperature == 0.0:
            return "greedy"
        parts = [f"T={self.temperature:g}"] + ([f"top-k {self.top_k}"] if self.top_k else [])
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1.0 else []
        return ", ".join(parts + [f"seed {self.seed}"])

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
