"""Import Hugging Face DeepSeek-V3 / Kimi-K2 checkpoints: config.json plus (sharded) safetensors.

transformers' DeepseekV3ForCausalLM is the semantics we follow: a field a config.json leaves out takes
DeepseekV3Config's default, RoPE settings come from `rope_scaling` (released checkpoints) or
`rope_parameters` (transformers 5), and every tensor lands under its engine.weights name in float32.
Anything we would silently compute differently (quantized weights, unknown tensors, other RoPE types)
is rejected with an HFLoadError that names the file, field or tensor.
"""
from __future__ import annotations

import argparse
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checkpoint import Checkpoint
from .config import ConfigError, ModelConfig
from .weights import weight_shapes

ARCHITECTURE = "DeepseekV3ForCausalLM"
MODEL_TYPES = ("deepseek_v3", "kimi_k2")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors dtype names we convert to float32
INDEX_FILE, SINGLE_FILE = "model.safetensors.index.json", "model.safetensors"

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
    "num_nextn_predict_layers", "num_mtp_layers",  # MTP layers are dropped (see read_hf_dir)
    "rope_theta", "rope_scaling", "rope_parameters", "original_max_position_embeddings",  # read by _rope
})
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
             "attention_factor", "truncate")


class HFLoadError(ValueError):
    """A Hugging Face model directory cannot be loaded as it is; the message says what to change."""


# ---------------------------------------------------------------------------------------------- config

def _rope(data: dict, where: str) -> tuple[float, dict | None]:
    """(rope_theta, ModelConfig.rope_scaling) from either the released or the transformers 5 layout."""
    legacy, params = data.get("rope_scaling"), data.get("rope_parameters")
    if legacy and params and legacy != params:
        raise HFLoadError(f"{where}: rope_scaling and rope_parameters disagree ({legacy} vs {params}); keep one")
    if not isinstance(params or legacy or {}, dict):
        raise HFLoadError(f"{where}: the RoPE settings must be a JSON object or null, got {params or legacy!r}")
    rope = dict(params or legacy or {})
    theta_top, theta_in = data.get("rope_theta"), rope.pop("rope_theta", None)
    if theta_top is not None and theta_in is not None and theta_top != theta_in:
        raise HFLoadError(f"{where}: rope_theta={theta_top} but the RoPE dict says rope_theta={theta_in}; keep one")
    theta = theta_in if theta_in is not None else theta_top if theta_top is not None else 10000.0
    kind, legacy_kind = rope.pop("rope_type", None), rope.pop("type", None)
    if kind and legacy_kind and kind != legacy_kind:
        raise HFLoadError(f"{where}: RoPE rope_type={kind!r} but type={legacy_kind!r}; keep one")
    kind = kind or legacy_kind or "default"
    if kind == "default":
        return theta, None
    if kind != "yarn":
        raise HFLoadError(f"{where}: RoPE type {kind!r} is not supported; DeepSeek-V3 uses 'yarn' or 'default'")
    if rope.pop("partial_rotary_factor", 1.0) != 1.0:
        raise HFLoadError(f"{where}: partial_rotary_factor != 1 is not supported (DeepSeek-V3 rotates all rope dims)")
    unknown = sorted(set(rope) - set(YARN_KEYS))
    if unknown:
        raise HFLoadError(f"{where}: unknown YaRN key(s) {unknown}; supported: {list(YARN_KEYS)}")
    if rope.get("factor") is None:
        raise HFLoadError(f"{where}: YaRN needs a numeric 'factor' (the context extension ratio)")
    # Like transformers: a top-level original_max_position_embeddings wins, max_position_embeddings is the fallback.
    orig = data.get("original_max_position_embeddings", rope.get("original_max_position_embeddings"))
    rope["original_max_position_embeddings"] = orig or data.get("max_position_embeddings",
                                                                 HF_DEFAULTS["max_position_embeddings"])
    return theta, {"type": "yarn", **{k: rope[k] for k in YARN_KEYS if rope.get(k) is not None}}


def config_from_hf(data: dict, where: str = "config.json") -> ModelConfig:
    """Map a DeepseekV3ForCausalLM config.json (already parsed) to ModelConfig."""
    if not isinstance(data, dict):
        raise HFLoadError(f"{where}: expected a JSON object, got {type(data).__name__}")
    archs = data.get("architectures") or []
    if ARCHITECTURE not in archs:
        raise HFLoadError(f"{where}: architectures={archs!r}; only {ARCHITECTURE} (DeepSeek-V3, Kimi-K2) is supported")
    if data.get("model_type") not in MODEL_TYPES:
        raise HFLoadError(f"{where}: model_type={data.get('model_type')!r}; expected one of {MODEL_TYPES}")
    if data.get("quantization_config"):
        quant = data["quantization_config"]
        method = quant.get("quant_method", "?") if isinstance(quant, dict) else quant
        raise HFLoadError(f"{where}: the checkpoint is quantized (quantization_config.quant_method={method!r}); "
                          "dequantize it to bfloat16/float32 safetensors first and drop quantization_config")
    for key, value in FIXED_KEYS.items():
        if data.get(key, value) != value:
            raise HFLoadError(f"{where}: {key}={data[key]!r} is not supported; only {value!r}")
    fields = {name: data.get(name, default) for name, default in HF_DEFAULTS.items()}
    unknown = sorted(set(data) - set(fields) - set(FIXED_KEYS) - IGNORED_KEYS - {"quantization_config"})
    if unknown:
        warnings.warn(f"{where}: ignoring config key(s) {unknown} (not used by the DeepSeek-V3 forward pass)",
                      stacklevel=3)
    fields["rope_theta"], fields["rope_scaling"] = _rope(data, where)
    try:
        return ModelConfig.from_dict(fields)
    except ConfigError as exc:
        raise HFLoadError(f"{where}: {exc}; fix that field in config.json") from exc


# ---------------------------------------------------------------------------------------------- weights

def _split_gate_up(prefix: str, arr: np.ndarray, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """transformers 5's fused experts.gate_up_proj [E, 2I, H]: rows [:I] are gate_proj, [I:] up_proj."""
    inter = cfg.moe_intermediate_size
    out = {}
    for e in range(arr.shape[0]):
        out[f"{prefix}.{e}.gate_proj.weight"] = arr[e, :inter]
        out[f"{prefix}.{e}.up_proj.weight"] = arr[e, inter:]
    return out


def _split_down(prefix: str, arr: np.ndarray, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """transformers 5's fused experts.down_proj [E, H, I]: one down_proj per expert."""
    return {f"{prefix}.{e}.down_proj.weight": arr[e] for e in range(arr.shape[0])}


@dataclass(frozen=True, slots=True)
class FusedName:
    """A checkpoint tensor that holds several engine.weights tensors."""

    pattern: re.Pattern  # group 1: the prefix of the engine names
    shape: Callable[[ModelConfig], tuple[int, ...]]
    split: Callable[[str, np.ndarray, ModelConfig], dict[str, np.ndarray]]


# THE name table. Every name not matched here maps to itself: engine.weights uses the released Hugging Face
# names (per-expert experts.{e}.gate_proj/up_proj/down_proj.weight, router mlp.gate.weight and
# mlp.gate.e_score_correction_bias), which save_pretrained in transformers 5.24 also writes.
NAME_TABLE = (
    FusedName(re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.gate_up_proj"),
              lambda c: (c.n_routed_experts, 2 * c.moe_intermediate_size, c.hidden_size), _split_gate_up),
    FusedName(re.compile(r"(model\.layers\.\d+\.mlp\.experts)\.down_proj"),
              lambda c: (c.n_routed_experts, c.hidden_size, c.moe_intermediate_size), _split_down),
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def _weight_files(root: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (from the index), or {"": file} for one file."""
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise HFLoadError(f"{index}: not a safetensors index with a 'weight_map' ({exc})") from exc
        files = {name: root / fname for name, fname in weight_map.items()}
        for path in sorted(set(files.values())):
            if not path.is_file():
                raise HFLoadError(f"{index} lists shard {path.name}, which is missing; re-download the checkpoint")
        return files
    if (root / SINGLE_FILE).is_file():
        return {"": root / SINGLE_FILE}
    shards = sorted(p.name for p in root.glob("*.safetensors"))
    hint = f"found {shards} but no {INDEX_FILE}" if shards else "found no .safetensors file"
    raise HFLoadError(f"{root}: {hint}; expected {SINGLE_FILE} or sharded files with {INDEX_FILE}")


def _plan(files: dict[str, Path], cfg: ModelConfig) -> list[tuple[Path, str, FusedName | None]]:
    """(file, tensor name, its NAME_TABLE entry or None) for every tensor to load, checked for name, dtype and
    shape before any data is read; drops multi-token-prediction layers with a warning."""
    from safetensors import safe_open

    expected = weight_shapes(cfg)
    plan, unknown, mtp_layers = [], [], set()
    for path in sorted(set(files.values())):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                if files.get(name, path) != path:  # the index places this name in another shard
                    continue
                layer = _LAYER.match(name)
                if layer and int(layer.group(1)) >= cfg.num_hidden_layers:
                    mtp_layers.add(int(layer.group(1)))
                    continue
                if cfg.tie_word_embeddings and name == "lm_head.weight":
                    warnings.warn(f"{path.name}: ignoring lm_head.weight: tie_word_embeddings is true, so the "
                                  "output layer is model.embed_tokens.weight (as in transformers)", stacklevel=4)
                    continue
                entry = next((e for e in NAME_TABLE if e.pattern.fullmatch(name)), None)
                tensor = f.get_slice(name)
                dtype, shape = tensor.get_dtype(), tuple(tensor.get_shape())
                if entry is None and name not in expected:
                    # transformers saves zero-width shared experts when n_shared_experts is 0: they hold nothing
                    if not (".mlp.shared_experts." in name and cfg.n_shared_experts == 0 and 0 in shape):
                        unknown.append(name)
                    continue
                if dtype not in FLOAT_DTYPES:
                    raise HFLoadError(f"{path.name}: tensor {name} has dtype {dtype}; quantized or integer weights "
                                      f"are not supported: convert the checkpoint to one of {FLOAT_DTYPES}")
                want = entry.shape(cfg) if entry else expected[name]
                if shape != want:
                    raise HFLoadError(f"{path.name}: tensor {name} has shape {shape}, but config.json implies {want}; "
                                      "the config and the weights do not belong together")
                plan.append((path, name, entry))
    if unknown:
        raise HFLoadError(f"{len(unknown)} tensor(s) are not part of a {ARCHITECTURE} with this config.json, e.g. "
                          f"{sorted(unknown)[:5]}; remove them or fix config.json")
    if mtp_layers:
        warnings.warn(f"ignoring multi-token-prediction layer(s) {sorted(mtp_layers)} (index >= num_hidden_layers="
                      f"{cfg.num_hidden_layers}): DDTree drafts with its own drafter", stacklevel=4)
    return plan


def _read_tensors(files: dict[str, Path], cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Every tensor of the model under its engine.weights name, in float32 and engine.weights order."""
    from safetensors import safe_open  # torch framework: it reads bfloat16, which numpy cannot hold

    by_file: dict[Path, list[tuple[str, FusedName | None]]] = {}
    for path, name, entry in _plan(files, cfg):
        by_file.setdefault(path, []).append((name, entry))
    weights: dict[str, np.ndarray] = {}
    for path, items in by_file.items():
        with safe_open(path, framework="pt") as f:
            for name, entry in items:
                arr = f.get_tensor(name).float().numpy()
                renamed = entry.split(entry.pattern.fullmatch(name).group(1), arr, cfg) if entry else {name: arr}
                for out_name, out in renamed.items():
                    if out_name in weights:
                        raise HFLoadError(f"{path.name}: {out_name} is given twice (fused and per-expert?); "
                                          "keep one form")
                    weights[out_name] = np.ascontiguousarray(out, dtype=np.float32)
    expected = weight_shapes(cfg)
    missing = [name for name in expected if name not in weights]
    if missing:
        raise HFLoadError(f"{len(missing)} tensor(s) are missing, e.g. {missing[:5]}; the checkpoint is incomplete")
    return {name: weights[name] for name in expected}


def read_hf_dir(path: str | Path) -> Checkpoint:
    """Load a Hugging Face DeepseekV3ForCausalLM directory (DeepSeek-V3, Kimi-K2) as a float32 Checkpoint."""
    root = Path(path)
    if not root.is_dir():
        raise HFLoadError(f"{root}: not a directory; pass a Hugging Face model directory")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise HFLoadError(f"{root}: no config.json; a Hugging Face model directory needs config.json and safetensors")
    try:
        data = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise HFLoadError(f"{config_path}: not valid JSON ({exc})") from exc
    cfg = config_from_hf(data, str(config_path))
    return Checkpoint(config=cfg, weights=_read_tensors(_weight_files(root), cfg), source=str(root))


# ---------------------------------------------------------------------------------------------- CLI

def _import_hf(args: argparse.Namespace) -> int:
    from .kdtr import write_kdtr
    from .reference import greedy_generate
    from .session import parse_prompt

    if args.out.exists() and not args.force:
        raise HFLoadError(f"{args.out} exists; pass --force to overwrite it")
    if args.golden < 1:
        raise HFLoadError(f"--golden {args.golden}: expected at least 1 token to generate")
    ckpt = read_hf_dir(args.src)
    vocab = ckpt.config.vocab_size
    if args.prompt is None:
        prompt = np.random.default_rng(args.seed).integers(0, vocab, size=8, dtype=np.int64)
    else:
        prompt = np.asarray(parse_prompt(args.prompt, vocab), dtype=np.int64)
    tokens, logits = greedy_generate(ckpt.config, ckpt.weights, prompt.tolist(), args.golden)
    ckpt.prompt = prompt
    ckpt.golden_tokens = np.asarray(tokens, dtype=np.int64)
    ckpt.golden_logits = np.asarray(logits, dtype=np.float32)
    write_kdtr(args.out, ckpt)
    print(f"wrote {args.out}: {ckpt.config.num_hidden_layers} layers, vocab {vocab}, prompt {prompt.tolist()}, "
          f"{args.golden} golden tokens")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "import-hf", help="convert a Hugging Face DeepSeek-V3 / Kimi-K2 directory into a .kdtr fixture",
        description="Load SRC_DIR (config.json + safetensors), generate golden tokens with the numpy reference "
                    "model, and write a .kdtr fixture.")
    parser.add_argument("src", metavar="SRC_DIR", type=Path, help="Hugging Face model directory")
    parser.add_argument("--out", required=True, type=Path, help="the .kdtr file to write")
    parser.add_argument("--prompt", help="prompt token ids, comma or space separated (default: 8 seeded random ids)")
    parser.add_argument("--golden", type=int, default=16, metavar="N", help="golden tokens to generate (default 16)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the default random prompt (default 0)")
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    parser.set_defaults(func=_import_hf)
