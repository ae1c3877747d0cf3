"""Bad inputs to the Hugging Face loader, each once a crash, a silent acceptance or a huge allocation: now each an
HFLoadError that names the file. Directories are made with tests/hf_dirs.py (no transformers needed)."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hf_dirs import INDEX, hf_config, write_hf_dir

from cli.__main__ import main as cli_main
from engine.loaders import hf_plan
from engine.loaders.hf_import import HFLoadError, read_hf_dir
from engine.model.fixtures import random_weights, tiny_config

SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hf") / "model"
    cfg = tiny_config()
    write_hf_dir(path, cfg, random_weights(cfg, seed=3), num_shards=2)
    return path


@pytest.fixture
def model(base, tmp_path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "model"))


def config_with(**changes):
    def apply(path: Path) -> None:
        (path / "config.json").write_text(json.dumps({**hf_config(tiny_config()), **changes}))
    return apply


def write(name: str, data: bytes):
    return lambda path: (path / name).write_bytes(data)


def index_with(weight_map):
    return write(INDEX, json.dumps({"metadata": {}, "weight_map": weight_map}).encode())


def shard_cut(length: int):
    def apply(path: Path) -> None:
        data = (path / SHARD).read_bytes()
        (path / SHARD).write_bytes(data[:length])
    return apply


def shard_header(edit):
    """Rewrite the first tensor's header entry of SHARD (the data stays as it was)."""
    def apply(path: Path) -> None:
        data = (path / SHARD).read_bytes()
        length = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + length])
        edit(header[next(n for n in header if n != "__metadata__")])
        text = json.dumps(header).encode()
        (path / SHARD).write_bytes(len(text).to_bytes(8, "little") + text + data[8 + length:])
    return apply


def with_duplicate(name: str, key: str, value: object):
    """The file as it was, with key given a second time at the top level (json.loads would keep the last)."""
    def apply(path: Path) -> None:
        text = json.dumps({**json.loads((path / name).read_text()), key: value})
        (path / name).write_text(f"{text[:-1]}, {json.dumps(key)}: {json.dumps(value)}}}")
    return apply


def deep(levels: int) -> bytes:
    return b'{"a": ' * levels + b"1" + b"}" * levels


def first_shard_entry(path: Path) -> str:
    return next(n for n, f in json.loads((path / INDEX).read_text())["weight_map"].items() if f == SHARD)


def remap(target: str):
    """Point the first tensor of SHARD at target in the index."""
    def apply(path: Path) -> None:
        index = json.loads((path / INDEX).read_text())
        index["weight_map"][first_shard_entry(path)] = target
        (path / INDEX).write_text(json.dumps(index))
    return apply


def outside_copy(path: Path) -> None:
    """A perfectly loadable shard just outside the model directory, which the index points at."""
    shutil.copy(path / SHARD, path.parent / "outside.safetensors")
    remap("../outside.safetensors")(path)


def symlinked_outside(path: Path) -> None:
    shutil.move(path / SHARD, path.parent / "elsewhere.safetensors")
    os.symlink(path.parent / "elsewhere.safetensors", path / SHARD)


BAD = {  # what, mutation, the message, the file it names
    "architectures a number": (config_with(architectures=5), "architectures=5", "config.json"),
    "architectures a string": (config_with(architectures="NotDeepseekV3ForCausalLMAtAll"),
                               "architectures='NotDeepseekV3ForCausalLMAtAll'", "config.json"),
    "architectures a near name": (config_with(architectures=["NotDeepseekV3ForCausalLMAtAll"]),
                                  "expected a list holding 'DeepseekV3ForCausalLM'", "config.json"),
    "config not UTF-8": (write("config.json", b'{"model_type": "\xff"}'), "is not UTF-8 text", "config.json"),
    "config nested deeply": (write("config.json", deep(100_000)), "nested too deeply", "config.json"),
    "config duplicate key": (with_duplicate("config.json", "rms_norm_eps", 1e-5),
                             r"duplicate key\(s\) \['rms_norm_eps'\]", "config.json"),
    "config integer of 5000 digits": (write("config.json", b'{"vocab_size": ' + b"9" * 5000 + b"}"),
                                      "is not valid JSON", "config.json"),
    "layers 1e5": (config_with(num_hidden_layers=10**5), "num_hidden_layers=100000", "config.json"),
    "layers beyond the files": (config_with(num_hidden_layers=1000), "num_hidden_layers=1000 but the weights hold "
                                                                      "tensors of 3 of those layers", ""),
    "experts 1e8": (config_with(n_routed_experts=10**8), "n_routed_experts=100000000", "config.json"),
    "experts beyond the files": (config_with(n_routed_experts=4096, n_group=1),
                                 "n_routed_experts=4096 but layer 1 holds weights of 8 experts", ""),
    "weight_map a list": (write(INDEX, b'{"weight_map": ["a", "b"]}'), "not a safetensors index", INDEX),
    "weight_map value a number": (index_with({"model.norm.weight": 5}), r"weight_map\['model.norm.weight'\] = 5",
                                  INDEX),
    "index not UTF-8": (write(INDEX, b'{"weight_map": {"\xfe": "x"}}'), "is not UTF-8 text", INDEX),
    "index nested deeply": (write(INDEX, deep(100_000)), "nested too deeply", INDEX),
    "index duplicate key": (with_duplicate(INDEX, "metadata", {}), r"duplicate key\(s\) \['metadata'\]", INDEX),
    "shard outside the directory": (outside_copy, "'../outside.safetensors' resolves to .*, outside the model "
                                                  "directory", ""),
    "shard at an absolute path": (remap("/etc/passwd"), "'/etc/passwd' resolves to /etc/passwd, outside the model", ""),
    "shard symlinked outside": (symlinked_outside, f"'{SHARD}' resolves to .*elsewhere.safetensors, outside the model",
                                ""),
    "shard empty": (write(SHARD, b""), "truncated: 0 bytes", SHARD),
    "shard truncated in its data": (shard_cut(-100), r"out of range: .* \(truncated file\?\)", SHARD),
    "shard with trailing bytes": (lambda p: (p / SHARD).write_bytes((p / SHARD).read_bytes() + b"x"),
                                  "truncated, or trailing bytes", SHARD),
    "shard truncated in its header": (shard_cut(50), "header length prefix says", SHARD),
    "shard garbage": (write(SHARD, os.urandom(4096)), "header length prefix says", SHARD),
    "shard header not JSON": (write(SHARD, (6).to_bytes(8, "little") + b"{nope}"), "header is not valid JSON", SHARD),
    "header lies about offsets": (shard_header(lambda e: e.update(data_offsets=[0, 10**12])), "out of range", SHARD),
    "header lies about the shape": (shard_header(lambda e: e.update(shape=[3, 3])), r"needs \d+", SHARD),
    "header lies about the dtype": (shard_header(lambda e: e.update(dtype="F64")), r"needs \d+", SHARD),
    "header with an unknown dtype": (shard_header(lambda e: e.update(dtype="Q4")), "dtype 'Q4' is not one of", SHARD),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_an_hf_load_error_naming_the_file(model, case, monkeypatch):
    mutate, message, file = BAD[case]
    mutate(model)
    # Nothing sized by the config is built before its sizes are checked against the tensors present.
    monkeypatch.setattr(hf_plan, "weight_shapes", lambda cfg: pytest.fail("weight_shapes built before the check"))
    with pytest.raises(HFLoadError, match=message) as err:
        read_hf_dir(model)
    assert str(model / file) in str(err.value)


def test_outside_files_are_never_opened(model, monkeypatch):
    outside_copy(model)
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: opened.append(Path(f).name) or real_open(f, *a, **k))
    with pytest.raises(HFLoadError, match="outside the model directory"):
        read_hf_dir(model)
    assert "outside.safetensors" not in opened


def test_a_hub_cache_snapshot_loads_through_its_blob_links(base, tmp_path):
    """The Hugging Face hub cache: snapshots/<revision>/<file> links to ../../blobs/<hash>, outside the snapshot."""
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(os.listdir(base))):
        shutil.copy(base / file, repo / "blobs" / f"blob{i}")
        os.symlink(f"../../blobs/blob{i}", snapshot / file)
    ckpt = read_hf_dir(snapshot)
    assert ckpt.numpy_weights().keys() == read_hf_dir(base).numpy_weights().keys()
    (snapshot / SHARD).unlink()
    os.symlink(tmp_path / "stray.safetensors", snapshot / SHARD)
    shutil.copy(base / SHARD, tmp_path / "stray.safetensors")
    with pytest.raises(HFLoadError, match="outside the model directory"):
        read_hf_dir(snapshot)


def test_a_shard_changed_after_the_check_is_an_error_when_read(model):
    ckpt = read_hf_dir(model)
    shard_cut(-100)(model)
    with pytest.raises(HFLoadError, match=f"{SHARD}: the file changed after the checkpoint was checked"):
        ckpt.numpy_weights()


def test_the_cli_reports_a_bad_shard_and_exits_2(model, capsys):
    write(SHARD, b"")(model)
    assert cli_main(["run", "--model", str(model), "--prompt", "1, 2"]) == 2
    err = capsys.readouterr().err
    assert f"error: {model / SHARD}: truncated" in err and "Traceback" not in err
