"""Hugging Face weights read tensor by tensor: FP8 dequantized as they arrive (checked against a numpy decoder of
the e4m3 bits), half precision kept in its dtype, the host's peak memory near one tensor, and the CUDA path."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hf_dirs import dequantize_blocks, is_quantized, write_hf_dir
from safetensors.torch import load_file, save_file

from cli.__main__ import main as cli_main
from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.hf_import import HFLoadError, read_hf_dir
from engine.loaders.kdtr import read_kdtr
from engine.model.fixtures import random_weights, tiny_config
from engine.model.target import TargetModel
from engine.model.weights import weight_shapes

REPO = Path(__file__).resolve().parents[1]
BLOCKS = [(128, 128), (16, 24)]  # DeepSeek-V3's blocks; and blocks that split the tiny matrices unevenly


def dequantized_reference(stored: dict[str, torch.Tensor], block: tuple[int, int]) -> dict[str, np.ndarray]:
    """What the weights should load as, computed from the stored bytes with numpy only."""
    out = {}
    for name, tensor in stored.items():
        if name.endswith("_scale_inv"):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            out[name] = dequantize_blocks(tensor.view(torch.uint8).numpy(), stored[name + "_scale_inv"].numpy(), block)
        else:
            out[name] = tensor.float().numpy()
    return out


@pytest.fixture(scope="module", params=BLOCKS, ids=["128x128", "16x24"])
def fp8_dir(request, tmp_path_factory):
    block = request.param
    cfg = tiny_config()
    path = tmp_path_factory.mktemp("fp8")
    stored = write_hf_dir(path, cfg, random_weights(cfg, seed=int(np.random.default_rng().integers(1000))),
                          num_shards=3, fp8_block=block)
    return path, block, dequantized_reference(stored, block)


def test_fp8_weights_load_dequantized_as_numpy_computes_them(fp8_dir):
    path, block, reference = fp8_dir
    ckpt = read_hf_dir(path)
    arrays = ckpt.numpy_weights()
    assert list(arrays) == list(reference) == ckpt.weights.names()
    for name, want in reference.items():
        np.testing.assert_array_equal(arrays[name], want, err_msg=name)
    bf16 = dict(ckpt.weights.tensors("cpu", torch.bfloat16))
    for name, want in reference.items():  # dequantized in float32, then rounded once to the run's dtype
        assert bf16[name].dtype == torch.bfloat16 and torch.equal(bf16[name], torch.from_numpy(want).bfloat16())
    scales = {n for n in json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
              if n.endswith("_scale_inv")}
    assert scales == {f"{n}_scale_inv" for n, shape in weight_shapes(ckpt.config).items() if is_quantized(n, shape)}
    assert len(scales) == 3 * 5 + 3 + 2 * (8 + 1) * 3  # attention, the dense MLP, routed and shared experts


def test_an_fp8_model_decodes_as_its_dequantized_weights(fp8_dir):
    path, _, reference = fp8_dir
    ckpt = read_hf_dir(path)
    prompt = np.random.default_rng().integers(0, ckpt.config.vocab_size, 6).tolist()
    cfg = DecodeConfig(budget=8, block_size=4, max_new_tokens=6)
    ours = decode(ckpt, prompt, cfg, "ddtree", DrafterSpec(noise=0.3))
    theirs = decode(Checkpoint(ckpt.config, reference, "numpy"), prompt, cfg, "ar")
    assert ours.tokens == theirs.tokens
    np.testing.assert_array_equal(decode(ckpt, prompt, cfg, "ar").logits, theirs.logits)


def test_import_hf_writes_an_fp8_checkpoint_dequantized(fp8_dir, tmp_path):
    path, _, reference = fp8_dir
    out = tmp_path / "fp8.kdtr"
    assert cli_main(["import-hf", str(path), "--out", str(out), "--golden", "2"]) == 0
    arrays = read_kdtr(out).numpy_weights()
    for name, want in reference.items():
        np.testing.assert_array_equal(arrays[name], want, err_msg=name)


def _edit(path: Path, edit) -> None:
    state = load_file(path / "model.safetensors")
    edit(state)
    save_file(state, path / "model.safetensors")


def _set_quantization(path: Path, **changes) -> None:
    data = json.loads((path / "config.json").read_text())
    data["quantization_config"] = {**data["quantization_config"], **changes}
    (path / "config.json").write_text(json.dumps(data))


SCALE = "model.layers.0.self_attn.o_proj.weight_scale_inv"
FP8_REJECTED = {
    "weight without scale": (lambda p: _edit(p, lambda s: s.pop(SCALE)),
                             "o_proj.weight is F8_E4M3 but has no model.layers.0.self_attn.o_proj.weight_scale_inv"),
    "scale of the wrong shape": (lambda p: _edit(p, lambda s: s.update({SCALE: torch.ones(3, 3)})),
                                 r"o_proj.weight_scale_inv is F32 \[3, 3\]; .* floats of shape \[1, 1\]"),
    "scale of a float weight": (lambda p: _edit(p, lambda s: s.update({"model.norm.weight_scale_inv": torch.ones(1)})),
                                r"not part of a DeepseekV3ForCausalLM .*model.norm.weight_scale_inv"),
    "fp8 norm": (lambda p: _edit(p, lambda s: s.update({"model.norm.weight": s["model.norm.weight"].to(
        torch.float8_e4m3fn), "model.norm.weight_scale_inv": torch.ones(1)})), "model.norm.weight is F8_E4M3 but"),
    "e5m2": (lambda p: _set_quantization(p, fmt="e5m2"), "quantization_config.fmt='e5m2' is not supported"),
    "static activations": (lambda p: _set_quantization(p, activation_scheme="static"), "activation_scheme='static'"),
    "per-tensor": (lambda p: _set_quantization(p, weight_block_size=None), "per-tensor fp8 is not supported"),
    "block of three": (lambda p: _set_quantization(p, weight_block_size=[128, 128, 1]), "weight_block_size="),
    "unknown key": (lambda p: _set_quantization(p, kv_cache_scheme="fp8"), r"key\(s\) \['kv_cache_scheme'\]"),
    "other method": (lambda p: _set_quantization(p, quant_method="awq"), "quant_method='awq'.*dequantize"),
}


@pytest.mark.parametrize("case", sorted(FP8_REJECTED))
def test_fp8_checkpoints_that_do_not_add_up_are_refused(tmp_path, case):
    mutate, message = FP8_REJECTED[case]
    cfg = tiny_config()
    write_hf_dir(tmp_path, cfg, random_weights(cfg, seed=0), fp8_block=(128, 128))
    mutate(tmp_path)
    with pytest.raises(HFLoadError, match=message) as err:
        read_hf_dir(tmp_path)
    assert str(tmp_path) in str(err.value)


_PEAK_RSS = textwrap.dedent("""
    import json, sys, torch
    from engine.loaders.hf_import import read_hf_dir

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    ckpt = read_hf_dir(sys.argv[1])
    open("/proc/self/clear_refs", "w").write("5")  # restart VmHWM, the peak resident size, from here
    before = status("VmRSS")
    for name, tensor in ckpt.weights.tensors("cpu", torch.bfloat16):  # a consumer that keeps nothing, as a GPU
        assert tensor.dtype == torch.bfloat16                          # load's host side
        del tensor
    print(json.dumps({"growth": status("VmHWM") - before}))
""")


def test_a_load_holds_one_tensor_at_a_time_on_the_host(tmp_path):
    """Streaming a bf16 directory to a bf16 run grows the host's peak RSS by about its largest tensor (the
    loader once made a float32 host copy of the whole model, twice the directory's size)."""
    cfg = dataclasses.replace(tiny_config(), vocab_size=16384, hidden_size=512, intermediate_size=2048,
                              num_hidden_layers=2, first_k_dense_replace=2)
    rng = np.random.default_rng()
    weights = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in weight_shapes(cfg).items()}
    stored = write_hf_dir(tmp_path, cfg, weights, dtype=torch.bfloat16)
    total, largest = (f(t.nbytes for t in stored.values()) for f in (sum, max))
    result = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    growth = json.loads(result.stdout)["growth"]
    assert largest == 16384 * 512 * 2 and total > 2.5 * largest
    assert growth < largest + 8 * 2**20, f"peak RSS grew {growth / 2**20:.1f} MB for a {total / 2**20:.1f} MB model"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_weights_land_on_the_gpu_as_on_the_cpu(tmp_path, fp8):
    """Straight to the device: the same values as a CPU load, and device memory never far above the model."""
    cfg = tiny_config()
    write_hf_dir(tmp_path, cfg, random_weights(cfg, seed=5), dtype=torch.bfloat16, num_shards=2,
                 fp8_block=(16, 24) if fp8 else None)
    ckpt = read_hf_dir(tmp_path)
    on_cpu = dict(ckpt.weights.tensors("cpu", torch.bfloat16))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    on_gpu = dict(ckpt.weights.tensors("cuda", torch.bfloat16))
    model_bytes = sum(t.nbytes for t in on_gpu.values())
    largest = max(t.numel() for t in on_gpu.values())
    assert torch.cuda.max_memory_allocated() - start <= model_bytes + 3 * 4 * largest + 2**20
    for name, tensor in on_gpu.items():
        assert tensor.device.type == "cuda" and torch.equal(tensor.cpu(), on_cpu[name]), name
    model = TargetModel.from_checkpoint(ckpt, "cuda", "bfloat16")
    assert model.embed.device.type == "cuda" and model.embed.dtype == torch.bfloat16
