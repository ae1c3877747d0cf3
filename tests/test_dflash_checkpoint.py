"""The DFlash checkpoint: z-lab's directory layout (single file and sharded), the config mapping, and every
refusal naming the file, field or tensor."""
from __future__ import annotations

import dataclasses
import json
import random
import warnings

import numpy as np
import pytest
import torch
from dflash_dirs import small_layout
from hf_dirs import dequantize_blocks
from safetensors.torch import load_file, save_file

from engine.loaders.dflash_checkpoint import dflash_dir_beside, load_tensors, read_dflash_dir, save_dflash_dir
from engine.loaders.dflash_config import DFlashLoadError, build_target_layer_ids, config_from_json, config_to_json
from engine.loaders.dflash_tensors import tensor_shapes
from engine.model.dflash_fixtures import kimi_k25_layout, make_dflash_dir, random_tensors


@pytest.fixture()
def layout(tiny_checkpoint):
    return small_layout(tiny_checkpoint.config, random.choice(["plain", "kimi-yarn", "yarn-factor"]))


def test_default_target_layers_follow_z_labs_rule():
    assert build_target_layer_ids(61, 6) == [1, 12, 24, 35, 47, 58]  # Kimi-K2.5-DFlash's published ids
    assert build_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-4B-DFlash-b16's
    n = random.randint(4, 100)
    assert build_target_layer_ids(n, 1) == [n // 2]
    ids = build_target_layer_ids(n, random.randint(2, 8))
    assert ids[0] == 1 and ids[-1] == n - 3 and ids == sorted(ids)


def test_the_kimi_layout_has_the_published_tensor_table():
    cfg = kimi_k25_layout()
    shapes = tensor_shapes(cfg)
    assert len(shapes) == 3 + 11 * 6
    assert shapes["fc.weight"] == (7168, 6 * 7168)
    assert shapes["layers.5.self_attn.q_proj.weight"] == (64 * 128, 7168)
    assert shapes["layers.0.self_attn.k_proj.weight"] == (8 * 128, 7168)
    assert shapes["layers.3.self_attn.o_proj.weight"] == (7168, 64 * 128)
    assert shapes["layers.2.self_attn.k_norm.weight"] == (128,)
    assert shapes["layers.1.mlp.down_proj.weight"] == (7168, 18432)
    bf16_bytes = 2 * sum(torch.Size(s).numel() for s in shapes.values())
    assert 6.4 < bf16_bytes / 2**30 < 6.6  # "about 6.5 GiB in bf16"


@pytest.mark.parametrize("num_shards", [1, 3])
def test_a_directory_loads_back_the_tensors_it_was_written_with(tmp_path, layout, num_shards):
    seed = random.randrange(1000)
    root = make_dflash_dir(tmp_path / "dflash", layout, seed=seed, num_shards=num_shards)
    ckpt = read_dflash_dir(root)
    assert ckpt.config == layout and ckpt.source == str(root)
    assert len({shard.path for shard, _ in ckpt.tensors.values()}) == num_shards
    loaded = load_tensors(ckpt, "cpu", torch.float32)
    written = random_tensors(layout, seed)
    assert list(loaded) == list(tensor_shapes(layout))
    for name, tensor in written.items():
        assert torch.equal(loaded[name], tensor), name
    assert load_tensors(ckpt, "cpu", torch.bfloat16)["fc.weight"].dtype == torch.bfloat16
    shard = next(iter(ckpt.tensors.values()))[0].path
    shard.write_bytes(shard.read_bytes())  # the same bytes, written again: another mtime
    with pytest.raises(DFlashLoadError, match="changed after the checkpoint was checked"):
        load_tensors(ckpt, "cpu", torch.float32)


@pytest.mark.parametrize("num_shards", [1, 2])
def test_an_fp8_directory_loads_its_matrices_dequantized(tmp_path, layout, num_shards):
    """Saved with fp8=True: every matrix F8_E4M3 with a scale per 128 x 128 block beside it in its shard, the norms as
    given; loaded, each matrix equals the tests' own numpy decode of its bits and scales, and stays within e4m3's
    rounding (half a step of 3 mantissa bits) of the weight it was quantized from."""
    written = random_tensors(layout, random.randrange(1000))
    root = save_dflash_dir(tmp_path / "d", layout, written, num_shards=num_shards, fp8=True)
    ckpt = read_dflash_dir(root)
    assert ckpt.block == (128, 128) and ckpt.config == layout
    matrices = [name for name, t in written.items() if t.dim() == 2]
    assert sorted(ckpt.scales) == sorted(matrices)
    assert all(ckpt.scales[n][0].path == ckpt.tensors[n][0].path for n in matrices), "a scale shares its shard"
    stored = {}
    for shard in {shard.path for shard, _ in ckpt.tensors.values()}:
        stored |= load_file(shard)
    loaded = load_tensors(ckpt, "cpu", torch.float32)
    for name, tensor in written.items():
        if name not in ckpt.scales:
            assert torch.equal(loaded[name], tensor), name
            continue
        assert stored[name].dtype == torch.float8_e4m3fn
        decoded = dequantize_blocks(stored[name].view(torch.uint8).numpy(), stored[name + "_scale_inv"].numpy(),
                                    ckpt.block)
        np.testing.assert_allclose(loaded[name].numpy(), decoded, rtol=1e-6, atol=0)
        assert (loaded[name] - tensor).abs().max() <= tensor.abs().max() / 16, name
    assert json.loads((root / "config.json").read_text())["quantization_config"]["weight_block_size"] == [128, 128]


FP8_EDITS = [  # (edit of an fp8 directory's tensors, what the error says)
    (lambda t: t.pop("fc.weight_scale_inv"), r"fc.weight is F8_E4M3 but has no fc.weight_scale_inv"),
    (lambda t: t.update({"fc.weight_scale_inv": torch.ones(5, 5)}), r"fc.weight_scale_inv is F32 \[5, 5\]"),
    (lambda t: t.update({"norm.weight_scale_inv": torch.ones(1)}), r"belong to no FP8 weight.*norm.weight_scale_inv"),
    (lambda t: t.update({"norm.weight": t["norm.weight"].to(torch.float8_e4m3fn)}), "norm.weight is F8_E4M3 but"),
    (lambda t: t.update({"fc.weight_scale_inv": t["fc.weight_scale_inv"].to(torch.int32)}), "scale_inv is I32"),
]


@pytest.mark.parametrize("edit, message", FP8_EDITS)
def test_a_broken_fp8_directory_is_refused_naming_the_tensor(tmp_path, layout, edit, message):
    root = save_dflash_dir(tmp_path / "d", layout, random_tensors(layout, 0), fp8=True)
    _rewrite_shard(root, edit)
    with pytest.raises(DFlashLoadError, match=message):
        read_dflash_dir(root)


def test_bf16_weights_and_the_transformers_5_rope_layout_load(tmp_path, layout):
    root = make_dflash_dir(tmp_path / "d", layout, dtype=torch.bfloat16)
    data = json.loads((root / "config.json").read_text())
    rope = dict(data.pop("rope_scaling") or {"type": "default"})
    data["rope_parameters"] = {"rope_type": rope.pop("type"), **rope, "rope_theta": data.pop("rope_theta")}
    (root / "config.json").write_text(json.dumps(data))
    ckpt = read_dflash_dir(root)
    assert ckpt.config == layout
    assert load_tensors(ckpt, "cpu", torch.float32)["norm.weight"].dtype == torch.float32


def test_missing_target_layer_ids_are_derived_and_qwen3_defaults_fill_in(layout):
    data = config_to_json(dataclasses.replace(layout, num_target_layers=61, num_hidden_layers=6))
    del data["dflash_config"]["target_layer_ids"], data["rms_norm_eps"], data["head_dim"]
    cfg = config_from_json(data, "config.json")
    assert cfg.target_layer_ids == (1, 12, 24, 35, 47, 58)
    assert cfg.rms_norm_eps == 1e-6 and cfg.head_dim == 128  # Qwen3Config's defaults, as transformers reads it
    assert config_from_json(config_to_json(layout), "config.json") == layout


def test_derived_target_layer_ids_that_do_not_fit_are_reported_as_derived(layout):
    data = config_to_json(dataclasses.replace(layout, num_target_layers=3, num_hidden_layers=5,
                                              target_layer_ids=(0, 1, 2)))
    del data["dflash_config"]["target_layer_ids"]  # z-lab's rule gives [1, 1, 0, 0, 0]: repeated layers
    with pytest.raises(DFlashLoadError, match="no dflash_config.target_layer_ids, and the ones derived from "
                                              r"num_target_layers=3 and num_hidden_layers=5 \(build_target_layer_ids"):
        config_from_json(data, "config.json")


def test_an_unknown_config_key_warns_and_is_ignored(layout):
    data = config_to_json(layout) | {"some_new_knob": 3}
    with pytest.warns(UserWarning, match=r"ignoring config key\(s\) \['some_new_knob'\]"):
        assert config_from_json(data, "config.json") == layout


CONFIG_EDITS = [  # (edit of config.json's dict, what the error says)
    (lambda d: d.update(architectures=["Qwen3ForCausalLM"]), r"architectures=\['Qwen3ForCausalLM'\]"),
    (lambda d: d.update(model_type="llama"), "model_type='llama'"),
    (lambda d: d.update(attention_bias=True), "attention_bias=True is not supported"),
    (lambda d: d.update(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (lambda d: d.update(use_sliding_window=True), "use_sliding_window=True"),
    (lambda d: d.update(layer_types=["sliding_attention"] * 2), "layer_types="),
    (lambda d: d.update(quantization_config={"quant_method": "gptq", "bits": 4}), r"quantized \(quantization_config"
                                                                                    r"\.quant_method='gptq'\)"),
    (lambda d: d.update(quantization_config={"quant_method": "fp8"}), r"weight_block_size=None"),
    (lambda d: d.update(rope_scaling={"type": "linear", "factor": 2.0}), "RoPE type 'linear' is not supported"),
    (lambda d: d.update(rope_scaling={"type": "yarn"}), "rope_scaling needs 'factor'"),
    (lambda d: d.update(rope_scaling={"type": "yarn", "factor": 2.0, "wiggle": 1}), r"unknown key\(s\) \['wiggle'\]"),
    (lambda d: d.update(rope_scaling={"type": "yarn", "factor": 2.0, "mscale": -1}), "rope_scaling.mscale=-1"),
    (lambda d: d.pop("hidden_size"), r"missing field\(s\) \['hidden_size'\]"),
    (lambda d: d["dflash_config"].pop("mask_token_id"), r"dflash_config.mask_token_id"),
    (lambda d: d.update(block_size=1), "block_size=1 is out of range"),
    (lambda d: d.update(block_size=40), "block_size=40 is out of range"),
    (lambda d: d.update(head_dim=23), "head_dim=23"),
    (lambda d: d.update(num_key_value_heads=3), "num_key_value_heads=3"),
    (lambda d: d["dflash_config"].update(mask_token_id=10**6), "mask_token_id=1000000"),
    (lambda d: d["dflash_config"].update(target_layer_ids=[0, 0]), "target_layer_ids=\\(0, 0\\)"),
    (lambda d: d["dflash_config"].update(target_layer_ids=[]), "target_layer_ids=\\[\\]"),
    (lambda d: d["dflash_config"].update(target_layer_ids=[99]), "target_layer_ids=99 is out of range"),
    (lambda d: d.update(rms_norm_eps="small"), "rms_norm_eps='small'"),
]


@pytest.mark.parametrize("edit, message", CONFIG_EDITS)
def test_a_bad_config_is_refused_naming_the_field(tmp_path, layout, edit, message):
    root = make_dflash_dir(tmp_path / "d", layout)
    data = json.loads((root / "config.json").read_text())
    edit(data)
    (root / "config.json").write_text(json.dumps(data))
    with pytest.raises(DFlashLoadError, match=message) as err:
        read_dflash_dir(root)
    assert "config.json" in str(err.value)


def _rewrite_shard(root, change):
    """Rewrite model.safetensors with change(tensors) applied."""
    from safetensors.torch import load_file

    tensors = load_file(root / "model.safetensors")
    change(tensors)
    save_file(tensors, str(root / "model.safetensors"))


TENSOR_EDITS = [  # (edit of the tensors, what the error says)
    (lambda t: t.update(extra=torch.zeros(2)), r"not part of a DFlash drafter .*'extra'"),
    (lambda t: t.pop("layers.1.mlp.up_proj.weight"), r"missing, e.g. \['layers.1.mlp.up_proj.weight'\]"),
    (lambda t: t.update({"norm.weight": torch.ones(3)}), r"norm.weight has shape \(3,\)"),
    (lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.int8)}), "fc.weight has dtype I8"),
    (lambda t: t.update({"fc.weight": t["fc.weight"].to(torch.float8_e4m3fn)}), "dtype F8_E4M3"),
]


@pytest.mark.parametrize("edit, message", TENSOR_EDITS)
def test_bad_tensors_are_refused_naming_them(tmp_path, layout, edit, message):
    root = make_dflash_dir(tmp_path / "d", layout)
    _rewrite_shard(root, edit)
    with pytest.raises(DFlashLoadError, match=message):
        read_dflash_dir(root)


@pytest.mark.parametrize("shard, message", [
    ("../outside.safetensors", "outside the model directory"), ("/etc/passwd", "outside the model directory"),
    ("sub/../../outside.safetensors", "outside the model directory"), ("gone.safetensors", "is missing"),
])
def test_an_index_may_only_name_shards_inside_the_directory(tmp_path, layout, shard, message):
    root = make_dflash_dir(tmp_path / "d", layout, num_shards=2)
    index = root / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["norm.weight"] = shard
    index.write_text(json.dumps(data))
    (tmp_path / "outside.safetensors").write_bytes((root / "model-00002-of-00002.safetensors").read_bytes())
    with pytest.raises(DFlashLoadError, match=message):
        read_dflash_dir(root)


def test_missing_or_unreadable_files_are_refused(tmp_path, layout):
    with pytest.raises(DFlashLoadError, match="no such directory"):
        read_dflash_dir(tmp_path / "nowhere")
    root = make_dflash_dir(tmp_path / "d", layout)
    (root / "config.json").write_text("{not json")
    with pytest.raises(DFlashLoadError, match="config.json is not valid JSON"):
        read_dflash_dir(root)
    (root / "config.json").unlink()
    with pytest.raises(DFlashLoadError, match="no config.json"):
        read_dflash_dir(root)
    other = make_dflash_dir(tmp_path / "e", layout)
    data = (other / "model.safetensors").read_bytes()
    (other / "model.safetensors").write_bytes(data[: random.randint(1, 64)])
    with pytest.raises(DFlashLoadError, match="model.safetensors: (truncated|header length prefix says)"):
        read_dflash_dir(other)
    (other / "model.safetensors").rename(other / "part.safetensors")
    with pytest.raises(DFlashLoadError, match=r"found \['part.safetensors'\] but no model.safetensors.index.json"):
        read_dflash_dir(other)
    sharded = make_dflash_dir(tmp_path / "f", layout, num_shards=2)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weights": {}}))
    with pytest.raises(DFlashLoadError, match="index.json: not a safetensors index"):
        read_dflash_dir(sharded)


def test_the_drafter_beside_a_target_is_found_by_the_convention(tmp_path, layout):
    kdtr = tmp_path / "model.kdtr"
    kdtr.write_bytes(b"")
    assert dflash_dir_beside(kdtr) is None
    make_dflash_dir(tmp_path / "model-dflash", layout)
    assert dflash_dir_beside(kdtr) == tmp_path / "model-dflash"
    hf = tmp_path / "Kimi"
    hf.mkdir()
    (tmp_path / "Kimi-dflash").mkdir()  # no config.json: not a drafter
    assert dflash_dir_beside(hf) is None
    make_dflash_dir(tmp_path / "Kimi-dflash2", layout)
    make_dflash_dir(hf / "dflash", layout)
    assert dflash_dir_beside(hf) == hf / "dflash"


def test_junk_in_any_config_field_is_a_load_error_never_a_crash(layout):
    """Every field of config.json (and of dflash_config and rope_scaling) replaced by values of the wrong type or
    range: the mapping raises DFlashLoadError (or accepts a value that is still valid), nothing else."""
    rng = random.Random()
    junk = [None, True, 0, -1, 2**70, 1.5, float("nan"), "7", [], [1, "x"], {}, {"type": "yarn"}, [[0]]]
    base = config_to_json(layout) | {"rope_scaling": {"type": "yarn", "factor": 2.0,
                                                      "original_max_position_embeddings": 64}}
    paths = [(k,) for k in base] + [("dflash_config", k) for k in base["dflash_config"]] + [
        ("rope_scaling", k) for k in base["rope_scaling"]]
    for _ in range(400):
        data = json.loads(json.dumps(base))
        *parents, key = rng.choice(paths)
        holder = data
        for p in parents:
            holder = holder[p]
        holder[key] = rng.choice(junk)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                config_from_json(data, "config.json")
        except DFlashLoadError as exc:
            assert "config.json" in str(exc)
