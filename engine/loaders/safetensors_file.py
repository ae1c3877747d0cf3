"""The safetensors layout, parsed and checked here (the .kdtr reader and the Hugging Face loader share it).

A file is an 8-byte little-endian header length N, N bytes of JSON, then the data section. The JSON maps each
tensor's name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data section) and may hold
"__metadata__", an object of strings. The tensors must cover the data section exactly, without gaps or overlaps,
and each span must be as long as its dtype and shape say. Every problem is an error of the caller's type whose
message names the file; nothing here trusts a length, an offset or a shape before checking it against the file.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import BinaryIO

from engine.loaders import strict_json

# Bytes per element of the safetensors dtypes with a whole number of bytes per element.
DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit
PREFIX_BYTES = 8


@dataclass(frozen=True, slots=True)
class TensorEntry:
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets into the data section
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True, slots=True)
class Header:
    tensors: dict[str, TensorEntry]  # in the header's order
    metadata: dict[str, str] | None
    data_start: int  # where the data section begins in the file
    data_len: int


def header_length(prefix: bytes, file_size: int, source: str, error: type[ValueError]) -> int:
    """The JSON header's length from the file's first 8 bytes, checked against the file's size."""
    if len(prefix) < PREFIX_BYTES:
        raise error(f"{source}: truncated: {file_size} bytes, shorter than the 8-byte header length prefix")
    (length,) = struct.unpack("<Q", prefix[:PREFIX_BYTES])
    if length > min(file_size - PREFIX_BYTES, MAX_HEADER_BYTES):
        raise error(f"{source}: header length prefix says {length} bytes but the file holds "
                    f"{file_size - PREFIX_BYTES} after the prefix (truncated or not a safetensors file)")
    return length


def parse_header(text: bytes, data_len: int, source: str, error: type[ValueError],
                 dtypes: Mapping[str, int] = DTYPE_SIZES) -> tuple[dict[str, TensorEntry], dict[str, str] | None]:
    """(tensors, metadata) of a header whose data section holds data_len bytes; dtypes: those allowed, with sizes."""
    try:
        header = strict_json.loads(text)
    except strict_json.StrictJSONError as exc:
        raise error(f"{source}: header {exc}") from exc
    if not isinstance(header, dict):
        raise error(f"{source}: header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise error(f"{source}: __metadata__ must be an object of strings, got {metadata!r:.200}")
    tensors = {name: _entry(name, entry, data_len, source, error, dtypes) for name, entry in header.items()}
    end = 0
    for name, entry in sorted(tensors.items(), key=lambda item: (item[1].begin, item[1].end)):
        if entry.begin != end:
            what = "overlaps the previous tensor" if entry.begin < end else f"leaves a gap at byte {end}"
            raise error(f"{source}: tensor {name!r}: data_offsets [{entry.begin}, {entry.end}] {what}")
        end = entry.end
    if end != data_len:
        raise error(f"{source}: the tensors cover {end} bytes of data but the file holds {data_len} "
                    "(truncated, or trailing bytes)")
    return tensors, metadata


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry(name: str, entry: object, data_len: int, source: str, error: type[ValueError],
           dtypes: Mapping[str, int]) -> TensorEntry:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise error(f"{source}: tensor {name!r}: header entry must be an object with exactly dtype, shape and "
                    f"data_offsets, got {entry!r:.200}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in dtypes:
        raise error(f"{source}: tensor {name!r}: dtype {dtype!r:.40} is not one of {list(dtypes)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise error(f"{source}: tensor {name!r}: shape must be a list of integers >= 0, got {shape!r:.200}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1] <= data_len):
        raise error(f"{source}: tensor {name!r}: data_offsets {offsets!r:.200} out of range: the data section "
                    f"holds {data_len} bytes (truncated file?)")
    nbytes = math.prod(shape) * dtypes[dtype]
    if offsets[1] - offsets[0] != nbytes:
        raise error(f"{source}: tensor {name!r}: data_offsets {offsets} span {offsets[1] - offsets[0]} bytes but "
                    f"{dtype} {shape} needs {nbytes}")
    return TensorEntry(dtype, tuple(shape), offsets[0], offsets[1])


def read_header(f: BinaryIO, file_size: int, source: str, error: type[ValueError],
                dtypes: Mapping[str, int] = DTYPE_SIZES) -> Header:
    """The checked header of the open file f (positioned anywhere), whose size is file_size."""
    f.seek(0)
    length = header_length(f.read(PREFIX_BYTES), file_size, source, error)
    text = f.read(length)
    if len(text) != length:
        raise error(f"{source}: the file ended inside its header (it changed while being read?)")
    data_len = file_size - PREFIX_BYTES - length
    tensors, metadata = parse_header(text, data_len, source, error, dtypes)
    return Header(tensors, metadata, PREFIX_BYTES + length, data_len)


def read_exactly(f: BinaryIO, offset: int, out: memoryview, source: str, error: type[ValueError]) -> None:
    """Fill out with the file's bytes from offset (f unbuffered: each read goes straight into out)."""
    f.seek(offset)
    filled = 0
    while filled < len(out):
        got = f.readinto(out[filled:])
        if not got:
            raise error(f"{source}: the file ended at byte {offset + filled}, inside a tensor its header places up "
                        f"to byte {offset + len(out)} (it was truncated after it was checked?)")
        filled += got
