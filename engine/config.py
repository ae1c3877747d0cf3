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

from engine.loaders import strict_json
from engine.settings import ConfigError, Setting, check_fields, option

MAX_BUDGET = 1024
AUTO_BUDGET_MAX = 256  # --budget auto's largest tree when auto:MAX does not say
BUDGET_BUCKETS = (0, 4, 8, 16, 32, 64, 128, 256, 512, 1024)  # the budgets --budget auto chooses among (up to MAX)
MAX_NEW_TOKENS = 1 << 20  # a bound before anything is sized from it; the context is checked per model
MAX_TEMPERATURE = 100.0
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 2, 32
DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
SCORING_FUNCS = ("sigmoid", "softmax")
DECODE, SAMPLING = "Decode", "Sampling"  # the sidebar's sections
# Where the batch-invariant mode is the default: where it costs under 10% of the fast mode's step
# (benchmarks/RESULTS.md, bench_exact). On the CPU it is the faster of the two; on CUDA it costs 6-9% on the shipped
# pair but 46-49% at Kimi-K2 widths, so it stays a choice there.
BATCH_INVARIANT_BY_DEVICE = {"cpu": True, "cuda": False}
LATENT_NORM_EPS = 1e-6  # q_a_layernorm and kv_a_layernorm: fixed in DeepSeek-V3 and transformers, not rms_norm_eps


def batch_invariant_default(device: str) -> bool:
    """Whether a decode on `device` runs the batch-invariant mode when the setting is not given."""
    return BATCH_INVARIANT_BY_DEVICE[device]


def buckets_up_to(maximum: int) -> tuple[int, ...]:
    """The budgets --budget auto:maximum chooses among: BUDGET_BUCKETS below maximum, and maximum itself."""
    return tuple(sorted({b for b in BUDGET_BUCKETS if b < maximum} | {maximum}))


def _check(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(f"{name}={value!r:.200} is out of range: expected {allowed}")


def _check_int(name: str, value: Any, lo: int, hi: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= lo and (hi is None or value <= hi)
    _check(ok, name, value, f"an integer in [{lo}, {hi if hi is not None else 'inf'}]")


# Limits a model config may claim: generous bounds above DeepSeek-V3 / Kimi-K2 (their values in the comments)
# that reject sizes no real model has, before anything is allocated from them.
MAX_VOCAB_SIZE = 1 << 20  # 129,280 / 163,840
MAX_WIDTH = 1 << 16  # hidden 7,168; intermediate 18,432; moe_intermediate 2,048; q_lora 1,536; kv_lora 512
MAX_HEAD_DIM = 1024  # qk_nope 128, qk_rope 64, v 128
MAX_HEADS = 1024  # 128 / 64
MAX_LAYERS = 1024  # 61
MAX_EXPERTS = 4096  # routed experts per layer: 256 / 384 (also bounds n_shared_experts, n_group)
MAX_TOTAL_EXPERTS = 1 << 17  # routed experts summed over the MoE layers: 58 x 256 = 14,848 / 60 x 384 = 23,040
MAX_POSITIONS = 1 << 20  # max_position_embeddings 163,840 / 131,072
MAX_ROUTED_SCALING = 100.0  # 2.5 / 2.827
MAX_ROPE_THETA = 1e12  # 10,000 / 50,000
# YaRN (rope_scaling): the keys transformers' _compute_yarn_parameters reads, and their ranges
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate")
YARN_MAX_FACTOR = 1024.0  # 40 / 32
YARN_BETA_RANGE = (1e-3, 1e4)  # beta_fast 32, beta_slow 1 / both 1: rotations, > 0 (they are divided by)
YARN_MAX_MSCALE = 100.0  # mscale, mscale_all_dim 1 / 1 (0 means unset, as in transformers)
YARN_MAX_ATTENTION_FACTOR = 100.0  # cos/sin are multiplied by it

_INT_FIELDS = {  # name -> (min, max)
    "vocab_size": (1, MAX_VOCAB_SIZE), "hidden_size": (1, MAX_WIDTH), "num_hidden_layers": (1, MAX_LAYERS),
    "num_attention_heads": (1, MAX_HEADS), "kv_lora_rank": (1, MAX_WIDTH), "qk_nope_head_dim": (1, MAX_HEAD_DIM),
    "qk_rope_head_dim": (2, MAX_HEAD_DIM), "v_head_dim": (1, MAX_HEAD_DIM), "intermediate_size": (1, MAX_WIDTH),
    "moe_intermediate_size": (1, MAX_WIDTH), "n_routed_experts": (0, MAX_EXPERTS),
    "n_shared_experts": (0, MAX_EXPERTS), "num_experts_per_tok": (0, MAX_EXPERTS), "n_group": (1, MAX_EXPERTS),
    "topk_group": (1, MAX_EXPERTS), "first_k_dense_replace": (0, MAX_LAYERS),
    "max_position_embeddings": (1, MAX_POSITIONS),
}
_FLOAT_FIELDS = {  # name -> interval as _as_float takes it
    "routed_scaling_factor": ("(", 0.0, MAX_ROUTED_SCALING, "]"), "rms_norm_eps": ("(", 0.0, 1.0, ")"),
    "rope_theta": ("(", 1.0, MAX_ROPE_THETA, "]"),
}
_YARN_FLOATS = {
    "factor": ("[", 1.0, YARN_MAX_FACTOR, "]"),
    "beta_fast": ("[", *YARN_BETA_RANGE, "]"),
    "beta_slow": ("[", *YARN_BETA_RANGE, "]"),
    "mscale": ("[", 0.0, YARN_MAX_MSCALE, "]"),
    "mscale_all_dim": ("[", 0.0, YARN_MAX_MSCALE, "]"),
    "attention_factor": ("[", 1e-3, YARN_MAX_ATTENTION_FACTOR, "]"),
}


def _as_int(name: str, value: Any, lo: int, hi: int) -> int:
    """value as a plain int (numpy integers are accepted; bools are not integers here)."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool) and lo <= value <= hi
    _check(ok, name, value, f"an integer in [{lo}, {hi}]")
    return int(value)


def _as_float(name: str, value: Any, interval: tuple[str, float, float, str]) -> float:
    """value as a float inside interval, e.g. ("(", 0.0, 1.0, "]") for 0 < value <= 1."""
    left, lo, hi, right = interval
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        try:
            x = float(value)
        except OverflowError:  # an int too large for a float
            x = math.inf
        ok = (lo < x if left == "(" else lo <= x) and (x < hi if right == ")" else x <= hi)
    _check(ok, name, value, f"a number in {left}{lo:g}, {hi:g}{right}")
    return x


def _as_bool(name: str, value: Any) -> bool:
    _check(isinstance(value, bool), name, value, "true or false")
    return value


def _yarn(rs: Any) -> dict:
    """rope_scaling checked key by key, with its numbers as plain floats and ints; a null value means unset."""
    _check(isinstance(rs, dict), "rope_scaling", rs, "null or an object")
    rs = {key: value for key, value in rs.items() if value is not None}
    kind = rs.get("type", rs.get("rope_type"))
    if rs.get("rope_type", kind) != kind:
        raise ConfigError(f"rope_scaling has type={kind!r:.40} and rope_type={rs['rope_type']!r:.40}; keep one")
    _check(kind == "yarn", "rope_scaling.type", kind, "'yarn' (the only scaling DeepSeek-V3 uses) or null")
    unknown = sorted(str(k) for k in set(rs) - {"type", "rope_type", *YARN_KEYS})
    if unknown:
        raise ConfigError(f"rope_scaling has unknown key(s) {unknown}: YaRN takes type and {list(YARN_KEYS)}")
    for key in ("factor", "original_max_position_embeddings"):
        if key not in rs:
            raise ConfigError(f"rope_scaling needs {key!r}: YaRN is defined by factor and "
                              "original_max_position_embeddings")
    out: dict = {"type": "yarn"}
    for key in (k for k in YARN_KEYS if k in rs):
        where = f"rope_scaling.{key}"
        if key == "original_max_position_embeddings":
            out[key] = _as_int(where, rs[key], 1, MAX_POSITIONS)
        elif key == "truncate":
            out[key] = _as_bool(where, rs[key])
        else:
            out[key] = _as_float(where, rs[key], _YARN_FLOATS[key])
    return out


@dataclass(slots=True, frozen=True)
class ModelConfig:
    """The shape and numerics of a DeepSeek-V3 / Kimi-K2 model. Every field is checked here, once, for its type
    and range (the limits above) whatever it came from (.kdtr or config.json); numbers are stored as plain ints
    and floats, rope_scaling as a checked copy."""

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
        for name, (lo, hi) in _INT_FIELDS.items():
            self._set(name, _as_int(name, getattr(self, name), lo, hi))
        for name, interval in _FLOAT_FIELDS.items():
            self._set(name, _as_float(name, getattr(self, name), interval))
        for name in ("norm_topk_prob", "rope_interleave", "tie_word_embeddings"):
            _as_bool(name, getattr(self, name))
        if self.q_lora_rank is not None:
            self._set("q_lora_rank", _as_int("q_lora_rank", self.q_lora_rank, 1, MAX_WIDTH))
        _check(self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim", self.qk_rope_head_dim, "an even number")
        _check(self.first_k_dense_replace <= self.num_hidden_layers, "first_k_dense_replace",
               self.first_k_dense_replace, f"an integer in [0, num_hidden_layers={self.num_hidden_layers}]")
        _check(isinstance(self.scoring_func, str) and self.scoring_func in SCORING_FUNCS, "scoring_func",
               self.scoring_func, f"one of {SCORING_FUNCS}")
        if self.rope_scaling is not None:
            self._set("rope_scaling", _yarn(self.rope_scaling))
        num_moe_layers = self.num_hidden_layers - self.first_k_dense_replace
        if num_moe_layers:
            _check_int("n_routed_experts", self.n_routed_experts, 1)
            _check_int("num_experts_per_tok", self.num_experts_per_tok, 1, self.n_routed_experts)
            _check(self.n_routed_experts % self.n_group == 0, "n_group", self.n_group,
                   f"a divisor of n_routed_experts={self.n_routed_experts}")
            _check_int("topk_group", self.topk_group, 1, self.n_group)
            _check(self.num_experts_per_tok <= self.topk_group * (self.n_routed_experts // self.n_group),
                   "num_experts_per_tok", self.num_experts_per_tok,
                   "at most topk_group * experts per group (the experts the group filter keeps)")
            _check(num_moe_layers * self.n_routed_experts <= MAX_TOTAL_EXPERTS, "n_routed_experts",
                   self.n_routed_experts, f"at most {MAX_TOTAL_EXPERTS} routed experts over the {num_moe_layers} "
                   "MoE layers")

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)  # frozen: only __post_init__ normalises a field

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
            data = strict_json.loads(text.encode("utf-8", "surrogatepass"))
        except strict_json.StrictJSONError as exc:
            raise ConfigError(f"model config is {exc}") from exc
        return cls.from_dict(data)


@dataclass(slots=True, frozen=True)
class DecodeConfig:
    """How to decode: tree budget B (drafted nodes, root excluded), block size (L = block_size - 1 drafted
    positions), how many tokens to generate, where, and how the target picks its token at every node
    (temperature 0: greedy; else a sample restricted by top_k / top_p, keyed by seed and position). Each field's
    Setting is its one description: the range checked here and the CLI flag, sidebar widget and URL parameter."""

    budget: int = option(64, Setting(
        "drafted nodes per step (the tree budget B), root excluded; 0 is plain AR; `auto` or `auto:MAX` chooses it "
        "every step (up to MAX, default 256)", "Budget B (tree nodes)", "--budget", lo=0, hi=MAX_BUDGET, step=1,
        section=DECODE, metavar="B|auto[:MAX]"))
    auto_budget: bool = option(False, Setting(
        "choose the budget every step, up to B: the truncation of the tree built at B with the most expected tokens "
        "per second of measured step time, b = 0 included; lossless (engine/decoding/budget.py)", "Auto budget (up "
        "to B)", "--auto-budget", "toggle", section=DECODE))
    block_size: int = option(8, Setting(
        "L + 1: the drafter proposes block_size - 1 positions per step", "Block size", "--block-size",
        lo=MIN_BLOCK_SIZE, hi=MAX_BLOCK_SIZE, step=1, section=DECODE))
    max_new_tokens: int = option(24, Setting(
        "tokens to generate", "Max new tokens", "--max-new", aliases=("--max-new-tokens",), lo=1,
        hi=MAX_NEW_TOKENS, step=1, section=DECODE))
    device: str = option("cpu", Setting(
        "where the target runs (cuda is offered when torch sees a GPU)", "Device", "--device", "select",
        choices=DEVICES, section=DECODE))
    dtype: str = option("float32", Setting(
        "the dtype of the target's weights and activations", "Dtype", "--dtype", "select", choices=DTYPES,
        section=DECODE))
    temperature: float = option(0.0, Setting(
        "the target samples softmax(logits / T) at every node; at 0 (greedy) every mode must emit exactly the AR "
        "tokens, above it AR and DDTree still agree (the noise is keyed by seed and position)", "Temperature",
        "--temperature", lo=0.0, hi=MAX_TEMPERATURE, step=0.1, note="0: greedy", section=SAMPLING))
    top_k: int = option(0, Setting(
        "sample among the k most likely tokens", "Top-k", "--top-k", lo=0, step=1, note="0: no top-k filter",
        section=SAMPLING, sampling_only=True))
    top_p: float = option(1.0, Setting(
        "sample within the smallest set of tokens holding this much probability (the nucleus)", "Top-p",
        "--top-p", lo=0.0, lo_open=True, hi=1.0, step=0.05, note="1: no nucleus filter", section=SAMPLING,
        sampling_only=True))
    seed: int = option(0, Setting(
        "the sampling seed: the target's noise is keyed by (seed, position), so AR and DDTree draw alike",
        "Sampling seed", "--seed", lo=0, hi=2**63 - 1, step=1, key="sample_seed", section=SAMPLING,
        sampling_only=True))
    batch_invariant: bool | None = option(None, Setting(
        "compute every verify row as AR computes it (kernels.ops.linear_rows for every matmul, position-ordered "
        "attention): DDTree == AR bit for bit in every dtype, with no numerics near ties; not given: the device's "
        "default, on where it costs under 10% (the CPU, where it is the faster mode), off on CUDA (6-9% on the shipped "
        "pair, 46-49% at Kimi-K2 widths: benchmarks/RESULTS.md)",
        "Batch-invariant", "--batch-invariant", "toggle", section=SAMPLING))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.batch_invariant is None:
            object.__setattr__(self, "batch_invariant", batch_invariant_default(self.device))
        if self.auto_budget and self.budget < 1:
            raise ConfigError("auto_budget=True needs a budget of at least 1 (the largest tree it may choose)")

    @property
    def budget_label(self) -> str:
        """B as a person reads it: "64", or "auto:256" when it is chosen every step up to 256."""
        return f"auto:{self.budget}" if self.auto_budget else str(self.budget)

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
