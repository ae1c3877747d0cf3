"""Which checkpoint tensors to read and the engine.model.weights tensors each becomes, checked before any data is read.

engine.model.weights uses the released Hugging Face names, so most tensors map to themselves. NAME_TABLE lists the
ones that do not: transformers 5 holds each layer's experts fused ([E, 2I, H] gate_up_proj, [E, H, I] down_proj).
In an FP8 checkpoint (DeepSeek-V3, Kimi-K2) an F8_E4M3 weight comes with <name>_scale_inv, one float32 per block.

The config's sizes are first checked against the tensors the headers actually hold, so a config.json claiming
100,000 layers or 10^8 experts is refused before weight_shapes(cfg) (an entry per expert per layer) is built.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine.config import ModelConfig
from engine.loaders.fp8_blocks import FP8_DTYPE, SCALE_SUFFIX, scale_shape
from engine.loaders.hf_config import ARCHITECTURE, HFLoadError
from engine.loaders.hf_layout import Shard
from engine.loaders.safetensors_file import TensorEntry
from engine.model.weights import weight_shapes

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors dtypes read as they are
_LAYER = re.compile(r"model\.layers\.(\d{1,9})\.")
_EXPERT = re.compile(r"model\.layers\.(\d{1,9})\.mlp\.experts\.(\d{1,9})\.")
_FUSED = re.compile(r"model\.layers\.(\d{1,9})\.mlp\.experts\.(?:gate_up_proj|down_proj)")


Piece = tuple[str, tuple]  # an engine tensor's name and the index that cuts it out of the fused tensor


def _gate_up_pieces(prefix: str, cfg: ModelConfig) -> list[Piece]:
    """transformers 5's fused experts.gate_up_proj [E, 2I, H]: rows [:I] are gate_proj, [I:] up_proj."""
    inter = cfg.moe_intermediate_size
    return [piece for e in range(cfg.n_routed_experts)
            for piece in ((f"{prefix}.{e}.gate_proj.weight", (e, slice(None, inter))),
                          (f"{prefix}.{e}.up_proj.weight", (e, slice(inter, None))))]


def _down_pieces(prefix: str, cfg: ModelConfig) -> list[Piece]:
    """transformers 5's fused experts.down_proj [E, H, I]: one down_proj per expert."""
    return [(f"{prefix}.{e}.down_proj.weight", (e,)) for e in range(cfg.n_routed_experts)]


@dataclass(frozen=True, slots=True)
class FusedName:
    """A checkpoint tensor that holds several engine.model.weights tensors."""

    pattern: re.Pattern  # group 1: the prefix of the engine names
    shape: Callable[[ModelConfig], tuple[int, ...]]
    pieces: Callable[[str, ModelConfig], list[Piece]]


NAME_TABLE = (
    FusedName(re.compile(r"(model\.layers\.\d{1,9}\.mlp\.experts)\.gate_up_proj"),
              lambda c: (c.n_routed_experts, 2 * c.moe_intermediate_size, c.hidden_size), _gate_up_pieces),
    FusedName(re.compile(r"(model\.layers\.\d{1,9}\.mlp\.experts)\.down_proj"),
              lambda c: (c.n_routed_experts, c.hidden_size, c.moe_intermediate_size), _down_pieces),
)


@dataclass(frozen=True, slots=True)
class Read:
    """One checkpoint tensor to read (with its FP8 scale), and the engine tensors it becomes."""

    shard: Shard
    name: str
    entry: TensorEntry
    scale: tuple[Shard, TensorEntry] | None
    fused: FusedName | None

    def pieces(self, cfg: ModelConfig) -> list[Piece]:
        """(engine name, index into the tensor read) of every engine tensor this read gives."""
        if self.fused is None:
            return [(self.name, ())]
        return self.fused.pieces(self.fused.pattern.fullmatch(self.name).group(1), cfg)


def present_tensors(shards: list[Shard], placement: dict[str, Path]) -> dict[str, tuple[Shard, TensorEntry]]:
    """Every tensor in the shards (where the index places a name in one shard, its copies elsewhere are not)."""
    present: dict[str, tuple[Shard, TensorEntry]] = {}
    for shard in shards:
        for name, entry in shard.header.tensors.items():
            if placement.get(name, shard.path) != shard.path:
                continue
            if name in present:
                raise HFLoadError(f"{shard.path}: tensor {name} is also in {present[name][0].path} and the index "
                                  "names neither; keep one copy")
            present[name] = (shard, entry)
    return present


def _drop_unused(present: dict, cfg: ModelConfig, root: Path) -> dict:
    """Without the multi-token-prediction layers (index >= num_hidden_layers) and a tied model's lm_head."""
    mtp = sorted({int(m.group(1)) for name in present if (m := _LAYER.match(name))
                  and int(m.group(1)) >= cfg.num_hidden_layers})
    if mtp:
        warnings.warn(f"{root}: ignoring multi-token-prediction layer(s) {mtp[:10]} (index >= num_hidden_layers="
                      f"{cfg.num_hidden_layers}): DDTree drafts with its own drafter", stacklevel=4)
    if cfg.tie_word_embeddings and "lm_head.weight" in present:
        warnings.warn(f"{present['lm_head.weight'][0].path}: ignoring lm_head.weight: tie_word_embeddings is true, "
                      "so the output layer is model.embed_tokens.weight (as in transformers)", stacklevel=4)
    return {name: value for name, value in present.items()
            if not ((m := _LAYER.match(name)) and int(m.group(1)) >= cfg.num_hidden_layers)
            and not (cfg.tie_word_embeddings and name == "lm_head.weight")}


def check_sizes(cfg: ModelConfig, present: dict[str, tuple[Shard, TensorEntry]], root: Path) -> None:
    """The layers and experts config.json claims are ones the weights hold, counted from the names present."""
    layers = {int(m.group(1)) for name in present if (m := _LAYER.match(name))}
    if len(layers) < cfg.num_hidden_layers:
        raise HFLoadError(f"{root}: config.json says num_hidden_layers={cfg.num_hidden_layers} but the weights hold "
                          f"tensors of {len(layers)} of those layers; the config and the weights do not belong "
                          "together")
    experts: dict[int, set[int]] = {}
    for name in present:
        if m := _EXPERT.match(name):
            experts.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    for name, (_, entry) in present.items():
        if (m := _FUSED.fullmatch(name)) and entry.shape:
            experts.setdefault(int(m.group(1)), set()).update(range(min(entry.shape[0], cfg.n_routed_experts)))
    for layer in range(cfg.first_k_dense_replace, cfg.num_hidden_layers):
        held = len(experts.get(layer, ()))
        if held < cfg.n_routed_experts:
            raise HFLoadError(f"{root}: config.json says n_routed_experts={cfg.n_routed_experts} but layer {layer} "
                              f"holds weights of {held} experts; the config and the weights do not belong together")


def plan_reads(cfg: ModelConfig, present: dict[str, tuple[Shard, TensorEntry]], block: tuple[int, int] | None,
               root: Path) -> list[Read]:
    """The reads that give every tensor of weight_shapes(cfg) exactly once, checked for name, dtype and shape."""
    present = _drop_unused(present, cfg, root)
    check_sizes(cfg, present, root)
    expected = weight_shapes(cfg)
    scales = {name + SCALE_SUFFIX for name, (_, entry) in present.items() if block and entry.dtype == FP8_DTYPE}
    reads, given, unknown = [], set(), []
    for name, (shard, entry) in present.items():
        if name in scales:
            continue
        fused = next((f for f in NAME_TABLE if f.pattern.fullmatch(name)), None)
        if fused is None and name not in expected:
            # transformers saves zero-width shared experts when n_shared_experts is 0: they hold nothing
            if not (".mlp.shared_experts." in name and cfg.n_shared_experts == 0 and 0 in entry.shape):
                unknown.append(name)
            continue
        want = fused.shape(cfg) if fused else expected[name]
        if entry.shape != want:
            raise HFLoadError(f"{shard.path}: tensor {name} has shape {entry.shape}, but config.json implies {want}; "
                              "the config and the weights do not belong together")
        read = Read(shard, name, entry, scale_of(name, entry, present, block), fused)
        for out, _ in read.pieces(cfg):
            if out in given:
                raise HFLoadError(f"{shard.path}: {out} is given twice (fused and per-expert?); keep one form")
            given.add(out)
        reads.append(read)
    if unknown:
        raise HFLoadError(f"{root}: {len(unknown)} tensor(s) are not part of a {ARCHITECTURE} with this config.json, "
                          f"e.g. {sorted(unknown)[:5]}; remove them or fix config.json")
    missing = [name for name in expected if name not in given]
    if missing:
        raise HFLoadError(f"{root}: {len(missing)} tensor(s) are missing, e.g. {missing[:5]}; the checkpoint is "
                          "incomplete")
    return reads


def scale_of(name: str, entry: TensorEntry, present: dict, block: tuple[int, int] | None):
    """The (shard, entry) of an FP8 weight's scale_inv, checked; None for a weight stored as floats."""
    shard = present[name][0]
    if entry.dtype != FP8_DTYPE or block is None:
        if entry.dtype not in FLOAT_DTYPES:
            hint = (" (an FP8 checkpoint declares quantization_config with quant_method 'fp8' and weight_block_size)"
                    if entry.dtype == FP8_DTYPE else "")
            raise HFLoadError(f"{shard.path}: tensor {name} has dtype {entry.dtype}; quantized or integer weights "
                              f"are not supported{hint}: convert the checkpoint to one of {FLOAT_DTYPES}")
        return None
    scale_name = name + SCALE_SUFFIX
    if len(entry.shape) < 2 or scale_name not in present:
        raise HFLoadError(f"{shard.path}: tensor {name} is {FP8_DTYPE} but has no {scale_name} (block-wise FP8 "
                          "keeps one scale per block of a matrix); the checkpoint is incomplete")
    scale_shard, scale = present[scale_name]
    want = scale_shape(entry.shape, block)
    if scale.dtype not in FLOAT_DTYPES or scale.shape != want:
        raise HFLoadError(f"{scale_shard.path}: tensor {scale_name} is {scale.dtype} {list(scale.shape)}; the "
                          f"scales of {FP8_DTYPE} {list(entry.shape)} in blocks of {list(block)} are floats of shape "
                          f"{list(want)}")
    return scale_shard, scale
