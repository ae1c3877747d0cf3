"""The .kdtr container: a safetensors file holding a model config, its weights, a prompt and golden data.

Layout: the safetensors format (8-byte little-endian header length, JSON header, raw little-endian data) with
metadata {"format": "kdtr", "version": "2", "config": <ModelConfig JSON>, "data_sha256": <hex SHA-256 of the
data section, every byte after the header>} and tensors: every weight by its checkpoint name (F32), "prompt"
(I64 [P]), and optionally "golden_tokens" (I64 [T]) with "golden_logits" (F32 [T, V]). Files are written here
byte for byte (header keys and tensors in sorted order), so the same checkpoint always gives the same bytes.
Version 1 is the same without data_sha256: it is still read, with a warning that corrupt data goes unnoticed.

Reading never unpickles anything: the header is parsed and checked by engine.loaders.safetensors_file, the data section
against its digest, and every problem is a KdtrError naming the file.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import struct
import tempfile
import warnings

import numpy as np

from engine.config import ConfigError, ModelConfig
from engine.loaders import safetensors_file
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.safetensors_file import TensorEntry
from engine.model.weights import weight_shapes

FORMAT = "kdtr"
VERSION = "2"
SUPPORTED_VERSIONS = ("1", "2")  # 1: no data_sha256
EXTRA_TENSORS = ("prompt", "golden_tokens", "golden_logits")
_DTYPES = {"F32": np.dtype("<f4"), "I64": np.dtype("<i8")}  # the only dtypes a .kdtr holds
_DTYPE_SIZES = {name: dtype.itemsize for name, dtype in _DTYPES.items()}


class KdtrError(ValueError):
    """A .kdtr file is missing, corrupt, or does not describe a valid model."""


# ---- writing -------------------------------------------------------------------------------------------------

def _tensors_of(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    tensors = {name: np.asarray(w, dtype=np.float32) for name, w in ckpt.numpy_weights().items()}
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
    entries, chunks, offset, digest = {}, [], 0, hashlib.sha256()
    for name in sorted(tensors):
        arr = tensors[name]
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        dtype = "F32" if arr.dtype == np.float32 else "I64"
        entries[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        digest.update(data)
        offset += len(data)
    metadata = {"config": ckpt.config.to_json(), "data_sha256": digest.hexdigest(), "format": FORMAT,
                "version": VERSION}
    text = json.dumps({"__metadata__": metadata, **entries}, separators=(",", ":")).encode()
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
        with open(path, "rb", buffering=0) as f:
            data = bytearray(os.fstat(f.fileno()).st_size)  # writable: the arrays are views of it
            safetensors_file.read_exactly(f, 0, memoryview(data), str(path), KdtrError)
    except OSError as exc:
        raise KdtrError(f"{path}: cannot read: {exc}") from exc
    return decode_kdtr(data, str(path))


def decode_kdtr(data: bytes | bytearray, source: str) -> Checkpoint:
    """Parse and validate the bytes of a .kdtr file; source names it in every error. The arrays are views of
    data (writable when data is a bytearray)."""
    length = safetensors_file.header_length(data[:safetensors_file.PREFIX_BYTES], len(data), source, KdtrError)
    start = safetensors_file.PREFIX_BYTES + length
    entries, metadata = safetensors_file.parse_header(bytes(data[safetensors_file.PREFIX_BYTES:start]),
                                                      len(data) - start, source, KdtrError, _DTYPE_SIZES)
    cfg = _parse_metadata(metadata, source)
    _check_entries(entries, _expected_entries(cfg, entries, source), source)
    _check_digest(metadata, memoryview(data)[start:], source)
    tensors = {name: _array(data, start, entry) for name, entry in entries.items()}
    _check_values(cfg, tensors, source)
    return Checkpoint(config=cfg, weights={n: tensors[n] for n in weight_shapes(cfg)}, source=source,
                      prompt=tensors["prompt"], golden_tokens=tensors.get("golden_tokens"),
                      golden_logits=tensors.get("golden_logits"))


def _array(data: bytes | bytearray, start: int, entry: TensorEntry) -> np.ndarray:
    dtype = _DTYPES[entry.dtype]
    arr = np.frombuffer(data, dtype=dtype, count=entry.nbytes // dtype.itemsize, offset=start + entry.begin)
    arr = arr.reshape(entry.shape)
    return arr if arr.flags.aligned else arr.copy()  # a header of unpadded length leaves the data unaligned


def _check_digest(metadata: dict, body: memoryview, source: str) -> None:
    if metadata["version"] == "1":
        warnings.warn(f"{source} is a version-1 .kdtr: it carries no checksum, so corrupt weight bytes would go "
                      "unnoticed; write it again (engine.loaders.kdtr.write_kdtr) to add one", stacklevel=4)
        return
    want = metadata.get("data_sha256")
    if not isinstance(want, str):
        raise KdtrError(f"{source}: metadata has no data_sha256 string, which a version-{VERSION} .kdtr carries")
    got = hashlib.sha256(body).hexdigest()
    if got != want:
        raise KdtrError(f"{source}: the data section does not match its checksum (SHA-256 {got[:16]}..., the "
                        f"header says {want[:16]}...): the file is corrupt; write or download it again")


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
    except ConfigError as exc:
        raise KdtrError(f"{source}: bad model config: {exc}") from exc


def _expected_entries(cfg: ModelConfig, header: dict[str, TensorEntry], source: str) -> dict[str, tuple[str, tuple]]:
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


def _check_entries(header: dict[str, TensorEntry], expected: dict[str, tuple[str, tuple]], source: str) -> None:
    lengths: dict[str, int] = {}  # "P" / "T" -> the length the first tensor using it has
    for name, (dtype, shape) in expected.items():
        got_dtype, got_shape = header[name].dtype, list(header[name].shape)
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
