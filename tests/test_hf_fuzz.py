"""Fuzzing the Hugging Face loader: crafted config.json, index and safetensors headers on a tiny sharded model.

Every case is either an HFLoadError that names a file of the model directory, or a load whose every tensor then
reads with the shape engine.model.weights gives it, from shards inside the directory (a copy of a shard waits just
outside it, for an index that points there). The kdtr fuzz test (tests/test_kdtr.py) is its counterpart.
"""
from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass

import pytest
import torch
from hf_dirs import INDEX, write_hf_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.loaders.hf_config import FIXED_KEYS, HF_DEFAULTS
from engine.loaders.hf_import import HFLoadError, read_hf_dir
from engine.model.fixtures import random_weights, tiny_config
from engine.model.weights import weight_shapes

SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
FILES = ("config.json", INDEX, *SHARDS)
CONFIG_KEYS = (*HF_DEFAULTS, *FIXED_KEYS, "architectures", "model_type", "rope_theta", "rope_scaling",
               "rope_parameters", "quantization_config", "original_max_position_embeddings", "some_new_knob")


def _header_span(data: bytes) -> int:
    return 8 + int.from_bytes(data[:8], "little") if len(data) >= 8 else len(data)


@dataclass(frozen=True)
class Truncate:
    file: str
    at: float  # fraction of the file kept

    def __call__(self, data: bytes) -> bytes:
        return data[:int(self.at * len(data))]


@dataclass(frozen=True)
class Flip:
    file: str
    flips: tuple[tuple[float, int], ...]  # (position as a fraction, xor mask)
    header_only: bool

    def __call__(self, data: bytes) -> bytes:
        out, span = bytearray(data), _header_span(data) if self.header_only else len(data)
        for at, mask in self.flips:
            out[min(int(at * span), len(out) - 1)] ^= mask
        return bytes(out)


@dataclass(frozen=True)
class Splice:
    file: str
    at: float
    length: int
    insert: bytes

    def __call__(self, data: bytes) -> bytes:
        start = int(self.at * len(data))
        return data[:start] + self.insert + data[start + self.length:]


@dataclass(frozen=True)
class SetJSON:
    file: str
    path: tuple[str, ...]  # keys from the top; () replaces the whole document
    value: object  # None with delete=True removes the key
    delete: bool = False

    def __call__(self, data: bytes) -> bytes:
        doc = json.loads(data)
        if not self.path:
            return json.dumps(self.value).encode()
        node = doc
        for key in self.path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node, dict) else node
        if isinstance(node, dict):
            if self.delete:
                node.pop(self.path[-1], None)
            else:
                node[self.path[-1]] = self.value
        return json.dumps(doc).encode()


@dataclass(frozen=True)
class EditHeader:
    file: str
    entry: float  # which tensor, as a fraction of the header's entries
    field: str  # dtype, shape, data_offsets, or "delete"
    value: object

    def __call__(self, data: bytes) -> bytes:
        span = _header_span(data)
        header = json.loads(data[8:span])
        name = sorted(n for n in header if n != "__metadata__")[min(int(self.entry * (len(header) - 1)),
                                                                     len(header) - 2)]
        if self.field == "delete":
            del header[name]
        else:
            header[name][self.field] = self.value
        text = json.dumps(header).encode()
        return len(text).to_bytes(8, "little") + text + data[span:]


_leaves = (st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=6)
           | st.sampled_from(["DeepseekV3ForCausalLM", "deepseek_v3", "yarn", "fp8", "silu", "noaux_tc",
                              "../outside.safetensors", "/etc/passwd", "", *SHARDS, "config.json"]))
_json = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.sampled_from(["type", "rope_type", "factor", "quant_method",
                                                        "weight_block_size", "original_max_position_embeddings",
                                                        "beta_fast", "x"]), inner, max_size=3), max_leaves=6)
_fraction = st.floats(0, 1)
_tensor_names = st.sampled_from(sorted(weight_shapes(tiny_config()))[:40] + ["model.layers.9.x", "lm_head.weight"])
_mutations = st.one_of(
    st.builds(Truncate, st.sampled_from(FILES), _fraction),
    st.builds(Flip, st.sampled_from(FILES), st.lists(st.tuples(_fraction, st.integers(1, 255)), min_size=1,
                                                     max_size=6).map(tuple), st.booleans()),
    st.builds(Splice, st.sampled_from(FILES), _fraction, st.integers(0, 12), st.binary(max_size=12)),
    st.builds(SetJSON, st.just("config.json"), st.sampled_from(CONFIG_KEYS).map(lambda k: (k,)), _json,
              st.booleans()),
    st.builds(SetJSON, st.just(INDEX), st.tuples(st.just("weight_map"), _tensor_names), _json, st.booleans()),
    st.builds(SetJSON, st.sampled_from(["config.json", INDEX]), st.sampled_from([(), ("weight_map",)]), _json),
    st.builds(EditHeader, st.sampled_from(SHARDS), _fraction,
              st.sampled_from(["dtype", "shape", "data_offsets", "delete"]),
              st.integers(-2, 600) | _json | st.lists(st.integers(0, 2000), max_size=3)
              | st.sampled_from(["F16", "BF16", "F64", "I8", "F8_E4M3", "Q4"])),
)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """(the directory, its files' original bytes, a dict of what each file holds now)."""
    base = tmp_path_factory.mktemp("fuzz")
    root = base / "model"
    cfg = tiny_config()
    write_hf_dir(root, cfg, random_weights(cfg, seed=11), num_shards=2)
    shutil.copy(root / SHARDS[0], base / "outside.safetensors")
    original = {name: (root / name).read_bytes() for name in FILES}
    return root, original, dict(original)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutation=_mutations)
def test_fuzz_every_crafted_directory_loads_or_raises_an_error_naming_a_file(model, mutation):
    root, original, current = model
    for name in FILES:  # undo the previous case
        if current[name] != original[name]:
            (root / name).write_bytes(original[name])
            current[name] = original[name]
    try:
        data = mutation(original[mutation.file])
    except (ValueError, TypeError, KeyError, IndexError):
        return  # the mutation does not apply to this file (e.g. a flip made the JSON unreadable first)
    (root / mutation.file).write_bytes(data)
    current[mutation.file] = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unknown config keys and dropped layers warn, and load
        try:
            ckpt = read_hf_dir(root)
            shards = {read.shard.path.resolve() for read in ckpt.weights.reads}
            tensors = dict(ckpt.weights.tensors("cpu", torch.float32))
        except HFLoadError as exc:
            assert str(root) in str(exc), f"the error names no file of the model: {exc}"
            return
    assert all(path.is_relative_to(root.resolve()) for path in shards)
    assert {n: tuple(t.shape) for n, t in tensors.items()} == weight_shapes(ckpt.config)
