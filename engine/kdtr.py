"""The .kdtr container: a safetensors file holding a model config, its weights, a prompt and golden data.

Layout: the safetensors format (8-byte little-endian header length, JSON header, raw little-endian data) with
metadata {"format": "kdtr", "version": "1", "config": <ModelConfig JSON>} and tensors: every weight by its
checkpoint name (F32), "prompt" (I64 [P]), and optionally "golden_tokens" (I64 [T]) with "golden_logits"
(F32 [T, V]). Files are written here byte for byte (header keys and tensors in sorted order), so the same
checkpoint always gives the same bytes.

Reading never unpickles anything. The header is parsed and checked here before safetensors sees the data, and
every problem, including any error the library raises on a corrupt file, becomes a KdtrError naming the file.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import struct
import tempfile

import numpy as np
import safetensors.numpy

from .checkpoint import Checkpoint
from .config import ModelConfig
from .weights import weight_shapes

FORMAT = "kdtr"
VERSION = "1"
SUPPORTED_VERSIONS = ("1",)
EXTRA_TENSORS = ("prompt", "golden_tokens", "golden_logits")
_DTYPES = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}  # the only dtypes a .kdtr holds
_MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit


class KdtrError(ValueError):
    """A .kdtr file is missing, corrupt, or does not describe a valid model."""


# ---- writing -------------------------------------------------------------------------------------------------

def _tensors_of(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    tensors = {name: np.asarray(w, dtype=np.float32) for name, w in ckpt.weights.items()}
    if ckpt.prompt is None:
        raise KdtrError(f"checkpoint from {ckpt.source} has no prompt; a .kdtr file always carries one")
    tensors["prompt"] = np.asarray(ckpt.prompt, dtype=np.int64)
    if ckpt.golden_tokens is not None:
        tensors["golden_tokens"] = np.asarray(ckpt.golden_tokens, dtype=np.int64)
    if ckpt.golden_logits is not None:
        tensors["golden_logits"] = np.asarray(ckpt.golden_logits, dtype=np.float32)
    return tensors


def encode_kdtr(ckpt: Checkpoint) -> bytes:
    """The file's bytes: deterministic for a given checkpoint."""
    tensors = _tensors_of(ckpt)
    header: dict = {"__metadata__": {"config": ckpt.config.to_json(), "format": FORMAT, "version": VERSION}}
    chunks, offset = [], 0
    for name in sorted(tensors):
        arr = tensors[name]
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        dtype = "F32" if arr.dtype == np.float32 else "I64"
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors pads the header so the data starts 8-byte aligned
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write_kdtr(path: str | os.PathLike, ckpt: Checkpoint) -> None:
    """Validate ckpt exactly as read_kdtr would, then write it atomically (temp file in the same directory,
    then rename): a reader never sees a half-written file."""
    path = pathlib.Path(path)
    data = encode_kdtr(ckpt)
    decode_kdtr(data, f"{path} (refusing to write)")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ---- reading -------------------------------------------------------------------------------------------------

def read_kdtr(path: str | os.PathLike) -> Checkpoint:
    path = pathlib.Path(path)
    if not path.exists():
        raise KdtrError(f"{path}: no such file")
    if not path.is_file():
        raise KdtrError(f"{path}: not a regular file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KdtrError(f"{path}: cannot read: {exc}") from exc
    return decode_kdtr(data, str(path))


def decode_kdtr(data: bytes, source: str) -> Checkpoint:
    """Parse and validate the bytes of a .kdtr file; source names it in every error."""
    header = _parse_header(data, source)
    cfg = _parse_metadata(header.pop("__metadata__", None), source)
    _check_entries(header, _expected_entries(cfg, header, source), source)
    try:
        loaded = safetensors.numpy.load(data)
    except Exception as exc:  # the library's errors on corrupt input are not one documented type
        raise KdtrError(f"{source}: safetensors could not load the data: {exc}") from exc
    tensors = {name: np.array(arr) for name, arr in loaded.items()}  # own, writable copies
    _check_values(cfg, tensors, source)
    return Checkpoint(config=cfg, weights={n: tensors[n] for n in weight_shapes(cfg)}, source=source,
                      prompt=tensors["prompt"], golden_tokens=tensors.get("golden_tokens"),
                      golden_logits=tensors.get("golden_logits"))


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict:
    seen: set[str] = set()
    duplicates = sorted({k for k, _ in pairs if k in seen or seen.add(k)})
    if duplicates:
        raise ValueError(f"duplicate key(s) {duplicates}")
    return dict(pairs)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _parse_header(data: bytes, source: str) -> dict:
    """Check the length prefix, the JSON, every entry's dtype/shape/offsets against the data size."""
    if len(data) < 8:
        raise KdtrError(f"{source}: truncated: {len(data)} bytes, shorter than the 8-byte header length prefix")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > min(len(data) - 8, _MAX_HEADER_BYTES):
        raise KdtrError(f"{source}: header length prefix says {header_len} bytes but the file holds "
                        f"{len(data) - 8} after the prefix (truncated or not a safetensors/.kdtr file)")
    try:
        header = json.loads(data[8:8 + header_len].decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (ValueError, RecursionError) as exc:  # includes UnicodeDecodeError and JSONDecodeError
        raise KdtrError(f"{source}: header is not valid UTF-8 JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise KdtrError(f"{source}: header must be a JSON object, got {type(header).__name__}")
    data_len = len(data) - 8 - header_len
    spans = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise KdtrError(f"{source}: tensor {name!r}: header entry must be an object with exactly "
                            f"dtype, shape and data_offsets, got {entry!r:.200}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if not isinstance(dtype, str) or dtype not in _DTYPES:
            raise KdtrError(f"{source}: tensor {name!r}: dtype {dtype!r} is not one a .kdtr holds {list(_DTYPES)}")
        if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
            raise KdtrError(f"{source}: tensor {name!r}: shape must be a list of integers >= 0, got {shape!r:.200}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
                and offsets[0] <= offsets[1] <= data_len):
            raise KdtrError(f"{source}: tensor {name!r}: data_offsets {offsets!r:.200} out of range: the data "
                            f"section holds {data_len} bytes (truncated file?)")
        nbytes = math.prod(shape) * _DTYPES[dtype].itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise KdtrError(f"{source}: tensor {name!r}: data_offsets {offsets} span {offsets[1] - offsets[0]} "
                            f"bytes but {dtype} {shape} needs {nbytes}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            what = "overlaps the previous tensor" if begin < end else f"leaves a gap at byte {end}"
            raise KdtrError(f"{source}: tensor {name!r}: data_offsets [{begin}, {stop}] {what}")
        end = stop
    if end != data_len:
        raise KdtrError(f"{source}: the tensors cover {end} bytes of data but the file holds {data_len} "
                        f"(truncated, or trailing bytes)")
    return header


def _parse_metadata(metadata: object, source: str) -> ModelConfig:
    if not isinstance(metadata, dict):
        raise KdtrError(f"{source}: header has no __metadata__ object; not a .kdtr file")
    if metadata.get("format") != FORMAT:
        raise KdtrError(f"{source}: metadata format is {metadata.get('format')!r}, expected {FORMAT!r}")
    if metadata.get("version") not in SUPPORTED_VERSIONS:
        raise KdtrError(f"{source}: .kdtr version {metadata.get('version')!r} is not supported; "
                        f"this reader supports version(s) {list(SUPPORTED_VERSIONS)}")
    text = metadata.get("config")
    if not isinstance(text, str):
        raise KdtrError(f"{source}: metadata has no config string (the ModelConfig as JSON)")
    try:
        return ModelConfig.from_json(text)
    except Exception as exc:  # ConfigError, or what a hostile value trips on inside validation
        raise KdtrError(f"{source}: bad model config: {exc}") from exc


def _expected_entries(cfg: ModelConfig, header: dict, source: str) -> dict[str, tuple[str, tuple]]:
    """name -> (dtype, shape) of every tensor the file must hold. A str dimension is a length the file sets:
    "P" the prompt's, "T" the golden sequence's (the same in golden_tokens and golden_logits)."""
    num_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    if cfg.num_hidden_layers > len(header) or num_moe * cfg.n_routed_experts > len(header):
        # A sanity bound before enumerating names: a corrupt config could ask for billions of them.
        raise KdtrError(f"{source}: config asks for {cfg.num_hidden_layers} layers with {cfg.n_routed_experts} "
                        f"experts but the file holds only {len(header)} tensors")
    expected = {name: ("F32", shape) for name, shape in weight_shapes(cfg).items()}
    expected["prompt"] = ("I64", ("P",))
    golden = [n for n in ("golden_tokens", "golden_logits") if n in header]
    if len(golden) == 1:
        other = ({"golden_tokens", "golden_logits"} - set(golden)).pop()
        raise KdtrError(f"{source}: tensor {golden[0]!r} is present without {other!r}; store both or neither")
    if golden:
        expected["golden_tokens"] = ("I64", ("T",))
        expected["golden_logits"] = ("F32", ("T", cfg.vocab_size))
    missing = [n for n in expected if n not in header]
    unexpected = sorted(set(header) - set(expected))
    problems = [f"{what} tensor(s) {names[:8]}{' ...' if len(names) > 8 else ''}"
                for what, names in (("missing", missing), ("unexpected", unexpected)) if names]
    if problems:
        raise KdtrError(f"{source}: {'; '.join(problems)} for this config")
    return expected


def _check_entries(header: dict, expected: dict[str, tuple[str, tuple]], source: str) -> None:
    lengths: dict[str, int] = {}  # "P" / "T" -> the length the first tensor using it has
    for name, (dtype, shape) in expected.items():
        got_dtype, got_shape = header[name]["dtype"], header[name]["shape"]
        ok = got_dtype == dtype and len(got_shape) == len(shape)
        for want, got in zip(shape, got_shape, strict=False):
            ok = ok and got == (lengths.setdefault(want, got) if isinstance(want, str) else want)
        if not ok:
            want = [f"{d}={lengths[d]}" if d in lengths else d for d in shape]
            raise KdtrError(f"{source}: tensor {name!r}: expected {dtype} {want}, got {got_dtype} {got_shape}")


def _check_values(cfg: ModelConfig, tensors: dict[str, np.ndarray], source: str) -> None:
    for name, arr in tensors.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            bad = np.argwhere(~np.isfinite(arr))[0]
            raise KdtrError(f"{source}: tensor {name!r} holds NaN/Inf (first at index {tuple(int(i) for i in bad)})")
    prompt = tensors["prompt"]
    if prompt.size == 0:
        raise KdtrError(f"{source}: tensor 'prompt' is empty; a prompt needs at least one token")
    _check_ids(prompt, "prompt", cfg.vocab_size, source)
    if "golden_tokens" not in tensors:
        return
    tokens, logits = tensors["golden_tokens"], tensors["golden_logits"]
    if tokens.size == 0:
        raise KdtrError(f"{source}: tensor 'golden_tokens' is empty; omit golden data instead")
    _check_ids(tokens, "golden_tokens", cfg.vocab_size, source)
    # float32 rounding is monotone, so the float64 argmax still holds the row's maximum (ties allowed).
    not_max = np.nonzero(logits[np.arange(tokens.size), tokens] < logits.max(axis=1))[0]
    if not_max.size:
        i = int(not_max[0])
        raise KdtrError(f"{source}: tensor 'golden_tokens': token {int(tokens[i])} at index {i} is not the argmax "
                        f"of golden_logits[{i}]")


def _check_ids(ids: np.ndarray, name: str, vocab_size: int, source: str) -> None:
    bad = np.nonzero((ids < 0) | (ids >= vocab_size))[0]
    if bad.size:
        i = int(bad[0])
        raise KdtrError(f"{source}: tensor {name!r}: id {int(ids[i])} at index {i} is out of range "
                        f"[0, {vocab_size})")
