"""A DFlash checkpoint directory as z-lab ships it: config.json plus model.safetensors, or shards listed in
model.safetensors.index.json. read_dflash_dir checks the config and every tensor's name, dtype and shape from
the safetensors headers before any data is read; load_tensors then reads them onto a device. save_dflash_dir
writes the same layout, and dflash_dir_beside is where the dashboard looks for a target's drafter."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from .config import DFlashConfig, DFlashLoadError, config_from_json, config_to_json
from .tensors import tensor_shapes

INDEX_FILE, SINGLE_FILE = "model.safetensors.index.json", "model.safetensors"
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")  # safetensors dtype names the loader converts
DRAFTER_DIR, DRAFTER_SUFFIX = "dflash", "-dflash"  # the convention of dflash_dir_beside


@dataclass(frozen=True, slots=True)
class DFlashCheckpoint:
    config: DFlashConfig
    source: str  # the directory
    files: dict[str, Path]  # tensor name -> the safetensors file holding it
    identity: tuple  # (file name, mtime ns, size) of config.json, the index and every shard: the weights' cache key


def dflash_dir_beside(target: str | Path) -> Path | None:
    """The DFlash directory that goes with a target checkpoint, if there is one: `<target dir>/dflash/` inside a
    Hugging Face target directory, else the sibling `<target>-dflash/` (for a .kdtr file, its name without the
    suffix: tests/refs/model_tiny.kdtr -> tests/refs/model_tiny-dflash/). Only directories with a config.json
    count."""
    target = Path(target)
    candidates = [target / DRAFTER_DIR] if target.is_dir() else []
    stem = target.with_suffix("") if target.suffix == ".kdtr" else target
    candidates.append(stem.with_name(stem.name + DRAFTER_SUFFIX))
    return next((c for c in candidates if (c / "config.json").is_file()), None)


def _shard(root: Path, name: object, index: Path) -> Path:
    """A shard named in the index, refused unless it is a plain file name or relative path inside root (no
    absolute path, no '..'); symlinks inside root are fine (the Hugging Face cache links shards to blobs)."""
    if not isinstance(name, str) or not name or PurePosixPath(name).is_absolute() or Path(name).is_absolute() \
            or ".." in PurePosixPath(name).parts:
        raise DFlashLoadError(f"{index}: shard {name!r} is not a file inside {root}; the index may only name "
                              "files in the checkpoint directory")
    path = root / name
    if not path.is_file():
        raise DFlashLoadError(f"{index} lists shard {name}, which is missing; re-download the checkpoint")
    return path


def _weight_files(root: Path) -> dict[str, Path]:
    """Tensor name -> file (from the index), or {"": file} for a single model.safetensors."""
    index = root / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            items = weight_map.items()
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise DFlashLoadError(f"{index}: not a safetensors index with a 'weight_map' object ({exc!r})") from exc
        return {name: _shard(root, fname, index) for name, fname in items}
    if (root / SINGLE_FILE).is_file():
        return {"": root / SINGLE_FILE}
    shards = sorted(p.name for p in root.glob("*.safetensors"))
    hint = f"found {shards} but no {INDEX_FILE}" if shards else "found no .safetensors file"
    raise DFlashLoadError(f"{root}: {hint}; expected {SINGLE_FILE} or sharded files with {INDEX_FILE}")


def _check_headers(files: dict[str, Path], cfg: DFlashConfig) -> dict[str, Path]:
    """Every tensor's file, after checking names, dtypes and shapes against the config (headers only)."""
    from safetensors import SafetensorError, safe_open

    expected = tensor_shapes(cfg)
    located: dict[str, Path] = {}
    unknown = []
    for path in sorted(set(files.values())):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    if files.get(name, path) != path:  # the index places this name in another shard
                        continue
                    if name not in expected:
                        unknown.append(name)
                        continue
                    tensor = f.get_slice(name)
                    dtype, shape = tensor.get_dtype(), tuple(tensor.get_shape())
                    if dtype not in FLOAT_DTYPES:
                        raise DFlashLoadError(f"{path.name}: tensor {name} has dtype {dtype}; quantized or integer "
                                              f"weights are not supported: convert the drafter to one of "
                                              f"{FLOAT_DTYPES}")
                    if shape != expected[name]:
                        raise DFlashLoadError(f"{path.name}: tensor {name} has shape {shape}, but config.json "
                                              f"implies {expected[name]}; the config and the weights do not "
                                              "belong together")
                    located[name] = path
        except (OSError, SafetensorError) as exc:
            raise DFlashLoadError(f"{path}: not a readable safetensors file ({exc}); re-download it") from exc
    if unknown:
        raise DFlashLoadError(f"{len(unknown)} tensor(s) are not part of a DFlash drafter with this config.json, "
                              f"e.g. {sorted(unknown)[:5]}; remove them or fix config.json")
    missing = [name for name in expected if name not in located]
    if missing:
        raise DFlashLoadError(f"{len(missing)} tensor(s) are missing, e.g. {missing[:5]}; the checkpoint is "
                              "incomplete")
    return {name: located[name] for name in expected}


def read_dflash_dir(path: str | Path) -> DFlashCheckpoint:
    """Check a DFlash directory (config.json, then every tensor's name, dtype and shape); reads no tensor data."""
    root = Path(path)
    if not root.is_dir():
        raise DFlashLoadError(f"{root}: no such directory; pass a DFlash checkpoint directory (config.json + "
                              "safetensors)")
    config_path = root / "config.json"
    if not config_path.is_file():
        raise DFlashLoadError(f"{root}: no config.json; a DFlash checkpoint directory needs config.json and "
                              "safetensors")
    try:
        data = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DFlashLoadError(f"{config_path}: not valid JSON ({exc})") from exc
    cfg = config_from_json(data, str(config_path))
    files = _check_headers(_weight_files(root), cfg)
    listed = [config_path, *([root / INDEX_FILE] if (root / INDEX_FILE).is_file() else []), *sorted(set(
        files.values()))]
    identity = tuple((str(p.relative_to(root)), p.stat().st_mtime_ns, p.stat().st_size) for p in listed)
    return DFlashCheckpoint(config=cfg, source=str(root), files=files, identity=identity)


def load_tensors(ckpt: DFlashCheckpoint, device: torch.device | str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor of a checked checkpoint, in the table's order, on device in dtype."""
    from safetensors import safe_open

    by_file: dict[Path, list[str]] = {}
    for name, path in ckpt.files.items():
        by_file.setdefault(path, []).append(name)
    out: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(path, framework="pt") as f:
            for name in names:
                out[name] = f.get_tensor(name).to(device=device, dtype=dtype)
    return {name: out[name] for name in ckpt.files}


def save_dflash_dir(path: str | Path, cfg: DFlashConfig, tensors: dict[str, torch.Tensor],
                    num_shards: int = 1) -> Path:
    """Write config.json and the tensors (names and shapes per the table) as model.safetensors, or as num_shards
    files with model.safetensors.index.json. The directory must not exist yet or be empty."""
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
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config_to_json(cfg), indent=2) + "\n")
    names = list(expected)
    if num_shards == 1:
        save_file({n: tensors[n].contiguous() for n in names}, str(root / SINGLE_FILE))
        return root
    per_shard = math.ceil(len(names) / num_shards)
    weight_map = {}
    for s in range(num_shards):
        shard = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
        chunk = names[s * per_shard:(s + 1) * per_shard]
        save_file({n: tensors[n].contiguous() for n in chunk}, str(root / shard))
        weight_map.update(dict.fromkeys(chunk, shard))
    (root / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2) + "\n")
    return root
