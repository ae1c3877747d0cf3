"""A DFlash checkpoint directory as z-lab ships it: config.json plus model.safetensors, or shards listed in
model.safetensors.index.json. read_dflash_dir checks the config and every tensor's name, dtype and shape from
the safetensors headers before any data is read; load_tensors then reads them onto a device. The files are found,
kept inside the directory, parsed (strict JSON) and read exactly as the target's Hugging Face loader does
(engine/loaders/hf_layout.py, engine/loaders/hf_weights.py); its errors arrive here as DFlashLoadError. The matrices
may be stored block-wise FP8 as DeepSeek-V3 stores its weights (engine/loaders/fp8_blocks.py, config.json's
quantization_config saying so), dequantized as they arrive. save_dflash_dir writes the same layout (fp8=True: at about
half the bytes of bfloat16), and dflash_dir_beside is where the dashboard looks for a target's drafter."""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.loaders.dflash_config import DFlashConfig, DFlashLoadError, config_from_json, config_to_json
from engine.loaders.dflash_tensors import tensor_shapes
from engine.loaders.fp8_blocks import FP8_BLOCK, FP8_QUANTIZATION, SCALE_SUFFIX, dequantize_fp8, quantize_fp8
from engine.loaders.hf_config import HFLoadError, fp8_block_size
from engine.loaders.hf_layout import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, Shard, read_json, read_shard, weight_files
from engine.loaders.hf_plan import present_tensors, scale_of
from engine.loaders.hf_weights import _open_unchanged, _read_host  # the loader's exact, change-checked tensor reads
from engine.loaders.safetensors_file import TensorEntry

DRAFTER_DIR, DRAFTER_SUFFIX = "dflash", "-dflash"  # the convention of dflash_dir_beside


@dataclass(frozen=True, slots=True)
class DFlashCheckpoint:
    config: DFlashConfig
    source: str  # the directory
    tensors: dict[str, tuple[Shard, TensorEntry]]  # tensor name -> its checked shard and header entry
    scales: dict[str, tuple[Shard, TensorEntry]]  # an FP8 tensor's name -> its scale_inv's shard and entry
    block: tuple[int, int] | None  # the FP8 scales' block (quantization_config), None when not quantized
    identity: tuple  # (file, mtime ns, size) of config.json, the index and every shard: the weights' cache key


def dflash_dir_beside(target: str | Path) -> Path | None:
    """The DFlash directory that goes with a target checkpoint, if there is one: `<target dir>/dflash/` inside a
    Hugging Face target directory, else the sibling `<target>-dflash/` (for a .kdtr file, its name without the
    suffix: models/model_tiny.kdtr -> models/model_tiny-dflash/). Only directories with a config.json
    count."""
    target = Path(target)
    candidates = [target / DRAFTER_DIR] if target.is_dir() else []
    stem = target.with_suffix("") if target.suffix == ".kdtr" else target
    candidates.append(stem.with_name(stem.name + DRAFTER_SUFFIX))
    return next((c for c in candidates if (c / CONFIG_FILE).is_file()), None)


def _check_tensors(present: dict[str, tuple[Shard, TensorEntry]], cfg: DFlashConfig,
                   block: tuple[int, int] | None) -> dict[str, tuple[Shard, TensorEntry]]:
    """Every tensor of the table present once, in a float dtype or as block-wise FP8 with its scale, of the shape the
    config implies; returns the FP8 tensors' scales."""
    expected = tensor_shapes(cfg)
    scale_names = {name + SCALE_SUFFIX for name in expected} if block else set()
    unknown = sorted(set(present) - set(expected) - scale_names)
    if unknown:
        raise DFlashLoadError(f"{len(unknown)} tensor(s) are not part of a DFlash drafter with this config.json, "
                              f"e.g. {unknown[:5]}; remove them or fix config.json")
    missing = [name for name in expected if name not in present]
    if missing:
        raise DFlashLoadError(f"{len(missing)} tensor(s) are missing, e.g. {missing[:5]}; the checkpoint is "
                              "incomplete")
    scales = {}
    for name, want in expected.items():
        shard, entry = present[name]
        if entry.shape != want:
            raise DFlashLoadError(f"{shard.path.name}: tensor {name} has shape {entry.shape}, but config.json "
                                  f"implies {want}; the config and the weights do not belong together")
        try:
            scale = scale_of(name, entry, present, block)
        except HFLoadError as exc:
            raise DFlashLoadError(str(exc)) from exc
        if scale is not None:
            scales[name] = scale
    stray = sorted(scale_names & set(present) - {name + SCALE_SUFFIX for name in scales})
    if stray:
        raise DFlashLoadError(f"{len(stray)} scale tensor(s) belong to no FP8 weight, e.g. {stray[:5]}; remove them "
                              "or store their weights as F8_E4M3")
    return scales


def read_dflash_dir(path: str | Path) -> DFlashCheckpoint:
    """Check a DFlash directory (config.json, then every tensor's name, dtype and shape); reads no tensor data."""
    root = Path(path)
    if not root.is_dir():
        raise DFlashLoadError(f"{root}: no such directory; pass a DFlash checkpoint directory (config.json + "
                              "safetensors)")
    if not (root / CONFIG_FILE).exists():
        raise DFlashLoadError(f"{root}: no config.json; a DFlash checkpoint directory needs config.json and "
                              "safetensors")
    try:
        data = read_json(root, CONFIG_FILE)
        cfg = config_from_json(data, str(root / CONFIG_FILE))
        block = fp8_block_size(data, str(root / CONFIG_FILE))
        files, placement = weight_files(root)
        shards = [read_shard(p) for p in files]
        present = present_tensors(shards, placement)
    except HFLoadError as exc:
        raise DFlashLoadError(str(exc)) from exc
    scales = _check_tensors(present, cfg, block)
    listed = [name for name in (CONFIG_FILE, INDEX_FILE) if (root / name).is_file()]
    identity = (*((name, (root / name).stat().st_mtime_ns, (root / name).stat().st_size) for name in listed),
                *((str(s.path), s.mtime_ns, s.size) for s in shards))
    tensors = {name: present[name] for name in tensor_shapes(cfg)}
    return DFlashCheckpoint(config=cfg, source=str(root), tensors=tensors, scales=scales, block=block,
                            identity=identity)


def load_tensors(ckpt: DFlashCheckpoint, device: torch.device | str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of a checked checkpoint, in the table's order, on device in dtype (one tensor on the host at a
    time, FP8 ones dequantized on the device; a shard that changed since it was checked is refused)."""
    out: dict[str, torch.Tensor] = {}
    try:
        with contextlib.ExitStack() as stack:
            files = {}

            def host(shard: Shard, entry: TensorEntry) -> torch.Tensor:
                if shard.path not in files:
                    files[shard.path] = _open_unchanged(shard, stack)
                return _read_host(files[shard.path], shard, entry)

            for name, (shard, entry) in ckpt.tensors.items():
                tensor = host(shard, entry).to(device)
                if name in ckpt.scales:
                    tensor = dequantize_fp8(tensor, host(*ckpt.scales[name]).to(device), ckpt.block)
                out[name] = tensor.to(dtype)
    except HFLoadError as exc:
        raise DFlashLoadError(str(exc)) from exc
    return out


def save_dflash_dir(path: str | Path, cfg: DFlashConfig, tensors: dict[str, torch.Tensor], num_shards: int = 1,
                    fp8: bool = False) -> Path:
    """Write config.json and the tensors (names and shapes per the table) as model.safetensors, or as num_shards
    files with model.safetensors.index.json. fp8: every matrix stored as F8_E4M3 with its float32 scale_inv per
    128 x 128 block (quantized from the tensor given), the norms as given, and config.json's quantization_config
    saying so. The directory must not exist yet or be empty."""
    from safetensors.torch import save_file

    root = Path(path)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise DFlashLoadError(f"{root} exists and is not an empty directory; pick a new path")
    expected = tensor_shapes(cfg)
    if not 1 <= num_shards <= len(expected):
        raise DFlashLoadError(f"num_shards={num_shards}: expected 1 to {len(expected)} (one tensor per shard at most)")
    wrong = [n for n in expected if n not in tensors or tuple(tensors[n].shape) != expected[n]]
    if wrong or set(tensors) - set(expected):
        raise DFlashLoadError(f"tensors do not match the config's table: wrong or missing {wrong[:5]}, extra "
                              f"{sorted(set(tensors) - set(expected))[:5]}")

    def stored(name: str) -> dict[str, torch.Tensor]:  # a table tensor as written: itself, or FP8 bits and scale
        tensor = tensors[name].detach().cpu()
        if fp8 and tensor.dim() == 2:
            bits, scale = quantize_fp8(tensor, FP8_BLOCK)
            return {name: bits, name + SCALE_SUFFIX: scale}
        return {name: tensor.contiguous()}

    root.mkdir(parents=True, exist_ok=True)
    config = config_to_json(cfg) | ({"quantization_config": FP8_QUANTIZATION} if fp8 else {})
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    names = list(expected)
    if num_shards == 1:
        save_file({k: v for n in names for k, v in stored(n).items()}, str(root / SINGLE_FILE))
        return root
    per_shard = math.ceil(len(names) / num_shards)
    weight_map = {}
    for s in range(num_shards):
        shard = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        chunk = {k: v for n in names[s * per_shard:(s + 1) * per_shard] for k, v in stored(n).items()}
        save_file(chunk, str(root / shard))
        weight_map.update(dict.fromkeys(chunk, shard))
    (root / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    return root
