"""The .kdtr container: round trips, one test per validation error, no unpickling, and a fuzz test."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import pickle
import struct

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import ModelConfig
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.kdtr import KdtrError, encode_kdtr, read_kdtr, write_kdtr
from engine.model.fixtures import random_weights
from engine.model.reference import greedy_generate
from engine.model.weights import weight_shapes

TINY_FIXTURE = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"
FIXTURE_BYTES = TINY_FIXTURE.read_bytes()


def _random_config(rng: np.random.Generator) -> ModelConfig:
    n_group = int(rng.choice([1, 2]))
    rope_scaling = None if rng.random() < 0.5 else {
        "type": "yarn", "factor": float(rng.choice([2.0, 4.0])), "original_max_position_embeddings": 16,
        "mscale": 1.0, "mscale_all_dim": 1.0}
    return ModelConfig(
        vocab_size=int(rng.integers(16, 80)), hidden_size=16, num_hidden_layers=int(rng.integers(1, 4)),
        num_attention_heads=int(rng.integers(1, 4)), q_lora_rank=None if rng.random() < 0.5 else 8,
        kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, intermediate_size=24,
        moe_intermediate_size=8, n_routed_experts=4, n_shared_experts=int(rng.integers(0, 3)), num_experts_per_tok=2,
        n_group=n_group, topk_group=1 if n_group == 1 else int(rng.integers(1, 3)), first_k_dense_replace=1,
        tie_word_embeddings=bool(rng.random() < 0.5), rope_interleave=bool(rng.random() < 0.5),
        rope_scaling=rope_scaling, max_position_embeddings=64)


def _checkpoint(seed: int, golden: bool = True) -> Checkpoint:
    rng = np.random.default_rng(seed)
    cfg = _random_config(rng)
    weights = random_weights(cfg, seed)
    prompt = rng.integers(0, cfg.vocab_size, size=int(rng.integers(1, 6)), dtype=np.int64)
    tokens, logits = greedy_generate(cfg, weights, prompt, 4) if golden else (None, None)
    return Checkpoint(config=cfg, weights=weights, source="test", prompt=prompt, golden_tokens=tokens,
                      golden_logits=None if logits is None else logits.astype(np.float32))


@pytest.fixture(scope="module")
def small() -> Checkpoint:
    return _checkpoint(seed=1)


def _copy(ckpt: Checkpoint, **changes) -> Checkpoint:
    return dataclasses.replace(ckpt, weights=dict(ckpt.numpy_weights()), **changes)


def _split(data: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


def _write(tmp_path: pathlib.Path, data: bytes) -> pathlib.Path:
    path = tmp_path / "model.kdtr"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("golden", [True, False])
def test_round_trip(tmp_path, seed, golden):
    ckpt = _checkpoint(seed, golden)
    path = tmp_path / "m.kdtr"
    write_kdtr(path, ckpt)
    back = read_kdtr(path)
    assert back.config == ckpt.config and back.source == str(path)
    assert back.weights.names() == ckpt.weights.names()
    arrays = back.numpy_weights()
    for name, w in ckpt.numpy_weights().items():
        assert arrays[name].dtype == np.float32 and arrays[name].flags.writeable
        np.testing.assert_array_equal(arrays[name], w)
    np.testing.assert_array_equal(back.prompt, ckpt.prompt)
    assert back.has_golden == golden
    if golden:
        np.testing.assert_array_equal(back.golden_tokens, ckpt.golden_tokens)
        np.testing.assert_array_equal(back.golden_logits, ckpt.golden_logits)
    assert list(tmp_path.iterdir()) == [path]  # no temp file left behind


def test_files_are_plain_safetensors_and_deterministic(tmp_path, small):
    write_kdtr(tmp_path / "a.kdtr", small)
    write_kdtr(tmp_path / "b.kdtr", _copy(small))
    assert (tmp_path / "a.kdtr").read_bytes() == (tmp_path / "b.kdtr").read_bytes()
    loaded = safetensors.numpy.load_file(tmp_path / "a.kdtr")
    np.testing.assert_array_equal(loaded["prompt"], small.prompt)
    header, _ = _split((tmp_path / "a.kdtr").read_bytes())
    assert header["__metadata__"]["format"] == "kdtr" and header["__metadata__"]["version"] == "2"
    assert ModelConfig.from_json(header["__metadata__"]["config"]) == small.config


def test_write_refuses_an_invalid_checkpoint_and_leaves_nothing(tmp_path, small):
    bad = _copy(small)
    bad.numpy_weights()["model.norm.weight"] = np.full_like(small.numpy_weights()["model.norm.weight"], np.nan)
    with pytest.raises(KdtrError, match=r"refusing to write.*'model.norm.weight'.*NaN"):
        write_kdtr(tmp_path / "m.kdtr", bad)
    with pytest.raises(KdtrError, match="no prompt"):
        write_kdtr(tmp_path / "m.kdtr", _copy(small, prompt=None))
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_an_existing_file(tmp_path, small):
    path = tmp_path / "m.kdtr"
    path.write_bytes(b"old")
    write_kdtr(path, small)
    assert read_kdtr(path).config == small.config and list(tmp_path.iterdir()) == [path]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(KdtrError, match="nope.kdtr: no such file"):
        read_kdtr(tmp_path / "nope.kdtr")
    with pytest.raises(KdtrError, match="not a regular file"):
        read_kdtr(tmp_path)


@pytest.mark.parametrize("cut", [0, 5, 8, 100, 2000, -1, -4000])
def test_truncated(tmp_path, small, cut):
    data = encode_kdtr(small)
    with pytest.raises(KdtrError, match="truncated"):
        read_kdtr(_write(tmp_path, data[:cut]))


def test_trailing_bytes(tmp_path, small):
    with pytest.raises(KdtrError, match="trailing bytes"):
        read_kdtr(_write(tmp_path, encode_kdtr(small) + b"\0" * 8))


def _edit_header(small, edit):
    header, body = _split(encode_kdtr(small))
    edit(header)
    return _join(header, body)


def _set_meta(key, value):
    return lambda h: h["__metadata__"].__setitem__(key, value)


def _set_config(key, value):
    def edit(header):
        cfg = json.loads(header["__metadata__"]["config"])
        cfg[key] = value
        header["__metadata__"]["config"] = json.dumps(cfg)
    return edit


def _same_span_as(header, name, other):
    header[name]["data_offsets"] = header[other]["data_offsets"]


HEADER_ERRORS = {
    "wrong format": (_set_meta("format", "gguf"), "format is 'gguf', expected 'kdtr'"),
    "wrong version": (_set_meta("version", "3"), r"version '3' is not supported.*\['1', '2'\]"),
    "no metadata": (lambda h: h.pop("__metadata__"), "no __metadata__"),
    "config not JSON": (_set_meta("config", "{vocab"), "bad model config: .*not valid JSON"),
    "config out of range": (_set_config("vocab_size", 0), "bad model config: vocab_size=0 is out of range"),
    "config unknown field": (_set_config("rope_typo", 1), r"bad model config: unknown .*rope_typo"),
    "config type": (_set_config("rope_scaling", [1]), "bad model config"),
    "config absurd": (_set_config("num_hidden_layers", 10**9), r"num_hidden_layers=1000000000 .*\[1, 1024\]"),
    "config larger than the file": (_set_config("num_hidden_layers", 1000), "asks for 1000 layers .* only"),
    "dtype unknown": (lambda h: h["prompt"].__setitem__("dtype", "F16"), "'prompt': dtype 'F16' is not one"),
    "entry fields": (lambda h: h["prompt"].pop("shape"), "'prompt': header entry must be"),
    "shape not ints": (lambda h: h["prompt"].__setitem__("shape", [2.5]), "'prompt': shape must be"),
    "offsets out of range": (lambda h: h["prompt"].__setitem__("data_offsets", [0, 10**12]),
                             r"'prompt': data_offsets .* out of range"),
    "offsets size": (lambda h: h["prompt"].__setitem__("shape", [1000]), r"'prompt': data_offsets .* needs 8000"),
    "offsets overlap": (lambda h: _same_span_as(h, "model.norm.weight", "model.layers.0.input_layernorm.weight"),
                        "overlaps the previous tensor"),
    "metadata not strings": (_set_meta("note", 5), "__metadata__ must be an object of strings"),
    "no checksum": (lambda h: h["__metadata__"].pop("data_sha256"), "no data_sha256 string"),
    "checksum of other data": (_set_meta("data_sha256", "0" * 64), "does not match its checksum"),
}


@pytest.mark.parametrize("case", sorted(HEADER_ERRORS))
def test_header_errors(tmp_path, small, case):
    edit, message = HEADER_ERRORS[case]
    with pytest.raises(KdtrError, match=message):
        read_kdtr(_write(tmp_path, _edit_header(small, edit)))


def test_header_not_json_or_not_an_object(tmp_path, small):
    _, body = _split(encode_kdtr(small))
    for text, message in ((b"{not json", "header is not valid JSON"), (b"\xff\xfe{}", "header is not UTF-8 text"),
                          (b"[1, 2]", "must be a JSON object"), (b'{"a": 1, "a": 2}', r"duplicate key\(s\) \['a'\]"),
                          (b"[" * 100_000, "nested too deeply")):
        with pytest.raises(KdtrError, match=message):
            read_kdtr(_write(tmp_path, struct.pack("<Q", len(text)) + text + body))
    with pytest.raises(KdtrError, match="header length prefix says"):
        read_kdtr(_write(tmp_path, struct.pack("<Q", 2**63) + b"{}"))


def test_wrong_dtype_with_the_right_size(tmp_path, small):
    def edit(h):
        h["prompt"]["dtype"] = "F32"
        h["prompt"]["shape"] = [2 * small.prompt.size]
    with pytest.raises(KdtrError, match=r"tensor 'prompt': expected I64 \['P'\], got F32"):
        read_kdtr(_write(tmp_path, _edit_header(small, edit)))


def test_a_flipped_weight_byte_fails_the_checksum(tmp_path, small):
    data = bytearray(encode_kdtr(small))
    header, body = _split(bytes(data))
    begin, _ = header["model.layers.0.self_attn.kv_b_proj.weight"]["data_offsets"]
    data[len(data) - len(body) + begin + 5] ^= 0x01  # the value stays finite and plausible: only the digest sees it
    with pytest.raises(KdtrError, match=r"model.kdtr: the data section does not match its checksum.*corrupt"):
        read_kdtr(_write(tmp_path, bytes(data)))


def test_a_version_1_file_loads_and_says_it_has_no_checksum(tmp_path, small):
    def as_version_1(h):
        del h["__metadata__"]["data_sha256"]
        h["__metadata__"]["version"] = "1"
    path = _write(tmp_path, _edit_header(small, as_version_1))
    with pytest.warns(UserWarning, match="version-1 .kdtr: it carries no checksum"):
        back = read_kdtr(path)
    for name, w in small.numpy_weights().items():
        np.testing.assert_array_equal(back.numpy_weights()[name], w)


def _with_weight(small, name, value):
    ckpt = _copy(small)
    if value is None:
        del ckpt.numpy_weights()[name]
    else:
        ckpt.numpy_weights()[name] = value
    return ckpt


def _nan_at(array, index, value):
    out = array.copy()
    out.flat[index] = value
    return out


CHECKPOINT_ERRORS = {
    "missing tensor": (lambda s: _with_weight(s, "model.norm.weight", None), r"missing tensor\(s\) \['model.norm"),
    "unexpected tensor": (lambda s: _with_weight(s, "extra.weight", np.zeros(3, np.float32)),
                          r"unexpected tensor\(s\) \['extra.weight'\]"),
    "wrong shape": (lambda s: _with_weight(s, "model.norm.weight", np.ones(17, np.float32)),
                    r"'model.norm.weight': expected F32 \[16\], got F32 \[17\]"),
    "NaN": (lambda s: _with_weight(s, "model.embed_tokens.weight",
                                   _nan_at(s.numpy_weights()["model.embed_tokens.weight"], 5, np.nan)),
            r"'model.embed_tokens.weight' holds NaN/Inf \(first at index \(0, 5\)\)"),
    "Inf": (lambda s: _copy(s, golden_logits=_nan_at(s.golden_logits, 0, np.inf)), "'golden_logits' holds NaN/Inf"),
    "prompt out of range": (lambda s: _copy(s, prompt=np.array([1, s.config.vocab_size])),
                            r"'prompt': id \d+ at index 1 is out of range"),
    "negative prompt": (lambda s: _copy(s, prompt=np.array([-1])), "'prompt': id -1 at index 0 is out of range"),
    "empty prompt": (lambda s: _copy(s, prompt=np.zeros(0, np.int64)), "'prompt' is empty"),
    "golden out of range": (lambda s: _copy(s, golden_tokens=s.golden_tokens + s.config.vocab_size),
                            r"'golden_tokens': id \d+ at index 0 is out of range"),
    "golden logits rows": (lambda s: _copy(s, golden_logits=np.vstack([s.golden_logits, s.golden_logits[:1]])),
                           r"'golden_logits': expected F32 \['T=4', \d+\], got F32 \[5, \d+\]"),
    "golden logits vocab": (lambda s: _copy(s, golden_logits=s.golden_logits[:, :-1]), r"'golden_logits': expected"),
    "golden without logits": (lambda s: _copy(s, golden_logits=None), "'golden_tokens' is present without"),
    "logits without golden": (lambda s: _copy(s, golden_tokens=None), "'golden_logits' is present without"),
    "golden not argmax": (lambda s: _copy(s, golden_tokens=(s.golden_tokens + 1) % s.config.vocab_size),
                          "'golden_tokens': token .* is not the argmax"),
}


@pytest.mark.parametrize("case", sorted(CHECKPOINT_ERRORS))
def test_checkpoint_errors(tmp_path, small, case):
    make, message = CHECKPOINT_ERRORS[case]
    path = _write(tmp_path, encode_kdtr(make(small)))
    with pytest.raises(KdtrError, match=message) as info:
        read_kdtr(path)
    assert str(path) in str(info.value)


class _Trap:
    """Unpickling this creates a directory: proof that something was unpickled."""

    def __init__(self, marker: pathlib.Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.mkdir, (self.marker,)


def test_loading_never_unpickles(tmp_path, monkeypatch, small):
    marker = tmp_path / "unpickled"
    payload = pickle.dumps(_Trap(marker))
    for data in (payload, struct.pack("<Q", len(payload)) + payload, encode_kdtr(small)[:64] + payload):
        with pytest.raises(KdtrError):
            read_kdtr(_write(tmp_path, data))
    assert not marker.exists()
    def refuse(*args, **kwargs):
        raise AssertionError("pickle used")
    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    assert read_kdtr(TINY_FIXTURE).has_golden  # a valid file loads with pickle unavailable


def test_a_torch_checkpoint_is_not_a_kdtr(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "model.kdtr"
    torch.save({"w": torch.zeros(3)}, path)
    with pytest.raises(KdtrError):
        read_kdtr(path)


# ---- fuzz ----------------------------------------------------------------------------------------------------

_HEADER_END = 8 + struct.unpack("<Q", FIXTURE_BYTES[:8])[0]
_HEADER, _BODY = _split(FIXTURE_BYTES)
_NAMES = sorted(_HEADER)
_CONFIG_FIELDS = sorted(json.loads(_HEADER["__metadata__"]["config"]))
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)


def _truncate(length: int) -> bytes:
    return FIXTURE_BYTES[:length]


def _flip(flips: list[tuple[int, int]]) -> bytes:
    out = bytearray(FIXTURE_BYTES)
    for index, mask in flips:
        out[index] ^= mask
    return bytes(out)


def _set_chars(edits: list[tuple[int, str]]) -> bytes:
    """Overwrite header bytes with printable characters: the JSON stays UTF-8, its values and syntax change."""
    out = bytearray(FIXTURE_BYTES)
    for index, char in edits:
        out[index] = ord(char)
    return bytes(out)


def _splice(start: int, length: int, insert: bytes) -> bytes:
    return FIXTURE_BYTES[:start] + insert + FIXTURE_BYTES[start + length:]


def _json_edit(name: str, field: str, value: object, config_field: str) -> bytes:
    header = json.loads(json.dumps(_HEADER))
    if name == "__metadata__" and field == "config":
        cfg = json.loads(header[name]["config"])
        cfg[config_field] = value
        header[name]["config"] = json.dumps(cfg)
    elif field == "delete":
        del header[name]
    else:
        header[name][field] = value
    return _join(header, _BODY)


_any_byte = st.integers(0, len(FIXTURE_BYTES) - 1)
_data_byte = st.integers(_HEADER_END, len(FIXTURE_BYTES) - 1)
_header_byte = st.integers(0, _HEADER_END - 1)
_masks = st.integers(1, 255)
_chars = st.sampled_from('0123456789-+.eE ,:[]{}"\\abcFIN')
_values = st.integers(-2, 600) | _json_values
_mutations = st.one_of(  # each draw is a call (e.g. _flip([(12, 255)])), so a failure prints what was done
    st.builds(_truncate, _any_byte),
    st.builds(_flip, st.lists(st.tuples(_any_byte, _masks), min_size=1, max_size=8)),
    st.builds(_flip, st.lists(st.tuples(_data_byte, _masks), min_size=1, max_size=8)),
    st.builds(_set_chars, st.lists(st.tuples(_header_byte, _chars), min_size=1, max_size=4)),
    st.builds(_splice, st.integers(0, _HEADER_END), st.integers(0, 16), st.binary(max_size=16)),
    st.builds(_json_edit, st.sampled_from(_NAMES),
              st.sampled_from(["dtype", "shape", "data_offsets", "delete", "config", "format", "version"]),
              _values, st.sampled_from(_CONFIG_FIELDS)),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_mutations)
def test_fuzz_every_corrupt_file_loads_or_raises_kdtr_error(tmp_path_factory, data):
    path = tmp_path_factory.getbasetemp() / "fuzz.kdtr"
    path.touch()
    with open(path, "r+b") as f:  # overwrite in place: much faster than truncating and reallocating 1 MB
        f.write(data)
        f.truncate(len(data))
    try:
        ckpt = read_kdtr(path)
    except KdtrError:
        return
    assert {n: w.shape for n, w in ckpt.numpy_weights().items()} == weight_shapes(ckpt.config)  # a valid model
