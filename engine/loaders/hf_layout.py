"""The files of a Hugging Face model directory: config.json, the safetensors index, and each shard's header.

Every file read must resolve (symlinks followed) inside the model directory, or, for a snapshot of the Hugging
Face hub cache (<repo>/snapshots/<revision>, whose files link to <repo>/blobs/), inside that repository's blobs/:
an index cannot send the loader to "../other.safetensors" or "/etc/passwd". JSON is read strictly
(engine.loaders.strict_json) and each shard's header is checked against its size (engine.loaders.safetensors_file)
before any tensor is planned; every problem is an HFLoadError naming the file.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.loaders import safetensors_file, strict_json
from engine.loaders.hf_config import HFLoadError
from engine.loaders.safetensors_file import Header

INDEX_FILE, SINGLE_FILE, CONFIG_FILE = "model.safetensors.index.json", "model.safetensors", "config.json"
MAX_JSON_BYTES = 64 * 1024 * 1024  # DeepSeek-V3's index is about 9 MB


@dataclass(frozen=True, slots=True)
class Shard:
    """A safetensors file with its checked header, and its size and mtime when it was checked."""

    path: Path
    header: Header
    size: int
    mtime_ns: int


def _allowed_roots(root: Path) -> list[Path]:
    real = root.resolve()
    if real.parent.name == "snapshots":  # the hub cache: snapshots/<revision>/* link to ../../blobs/<hash>
        return [real, real.parent.parent / "blobs"]
    return [real]


def resolve_inside(root: Path, relative: str, what: str) -> Path:
    """root / relative, refused unless it is a regular file that resolves inside the model directory."""
    try:
        path = root / relative
        real = path.resolve()
    except (OSError, ValueError, RuntimeError) as exc:  # an embedded NUL byte, a symlink loop
        raise HFLoadError(f"{root}: {what} {relative!r:.200} is not a usable path ({exc})") from exc
    if not any(real.is_relative_to(allowed) for allowed in _allowed_roots(root)):
        raise HFLoadError(f"{root}: {what} {relative!r:.200} resolves to {real}, outside the model directory; a "
                          "checkpoint's files must lie inside its directory")
    if not real.is_file():
        missing = "is missing" if not real.exists() else "is not a regular file"
        raise HFLoadError(f"{path}: {what} {missing}; re-download the checkpoint")
    return path


def read_json(root: Path, name: str) -> object:
    """The parsed JSON file root/name (a config or an index)."""
    path = resolve_inside(root, name, "the JSON file")
    try:
        return strict_json.read_file(path, MAX_JSON_BYTES, "a config or an index")
    except strict_json.StrictJSONError as exc:
        raise HFLoadError(f"{path} {exc}") from exc


def weight_files(root: Path) -> tuple[list[Path], dict[str, Path]]:
    """(the safetensors files, tensor name -> the file the index places it in; empty without an index)."""
    if (root / INDEX_FILE).exists():
        index_path = root / INDEX_FILE
        index = read_json(root, INDEX_FILE)
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict):
            raise HFLoadError(f"{index_path}: not a safetensors index: expected an object whose 'weight_map' is an "
                              f"object of tensor name -> shard file, got {weight_map!r:.100}")
        bad = [(name, value) for name, value in weight_map.items() if not isinstance(value, str) or not value]
        if bad:
            raise HFLoadError(f"{index_path}: weight_map[{bad[0][0]!r:.100}] = {bad[0][1]!r:.100}; each value must be "
                              "the name of a shard file")
        shards = {value: resolve_inside(root, value, f"the shard named by {INDEX_FILE}")
                  for value in sorted(set(weight_map.values()))}
        return sorted(set(shards.values())), {name: shards[value] for name, value in weight_map.items()}
    if (root / SINGLE_FILE).exists() or (root / SINGLE_FILE).is_symlink():
        return [resolve_inside(root, SINGLE_FILE, "the weights file")], {}
    found = sorted(p.name for p in root.glob("*.safetensors"))
    hint = f"found {found[:5]} but no {INDEX_FILE}" if found else "found no .safetensors file"
    raise HFLoadError(f"{root}: {hint}; expected {SINGLE_FILE} or sharded files with {INDEX_FILE}")


def read_shard(path: Path) -> Shard:
    """path's checked safetensors header (any dtype; engine.loaders.hf_plan decides which ones load)."""
    try:
        with open(path, "rb") as f:
            stat = os.fstat(f.fileno())
            header = safetensors_file.read_header(f, stat.st_size, str(path), HFLoadError)
    except OSError as exc:
        raise HFLoadError(f"{path}: cannot read: {exc}") from exc
    return Shard(path, header, stat.st_size, stat.st_mtime_ns)
