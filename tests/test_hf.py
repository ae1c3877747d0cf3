"""Hugging Face import, cross-checked against transformers' DeepseekV3ForCausalLM on tiny random models.

Each config is built with transformers, given larger random weights (peaked logits) and a non-zero
e_score_correction_bias, saved with save_pretrained, and loaded by engine.loaders.hf_import. Then: our numpy
reference vs transformers in float64, our torch model vs transformers in float32, and greedy tokens of transformers'
generate vs our AR and our DDTree decoders.
"""
from __future__ import annotations

import json
import math
import shutil
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers.modeling_rope_utils as hf_rope_utils
import transformers.models.deepseek_v3.modeling_deepseek_v3 as hf_deepseek
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from cli.__main__ import main as cli_main
from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.hf_config import ARCHITECTURE, HF_DEFAULTS, config_from_hf
from engine.loaders.hf_import import HFLoadError, read_hf_dir
from engine.loaders.kdtr import read_kdtr, write_kdtr
from engine.loaders.loading import ModelLoadError, load_model
from engine.model import reference, rope

BASE = dict(
    vocab_size=96, hidden_size=48, intermediate_size=80, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=3, num_key_value_heads=3, kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=8,
    qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
    topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, rope_interleave=True,
    max_position_embeddings=512, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=None,
)
YARN_DEEPSEEK = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32,
                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}  # DeepSeek-V3's settings, scaled down
YARN_MSCALE = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "mscale": 1.0,
               "mscale_all_dim": 0.8}  # attention factor != 1 and softmax mscale != 1
YARN_KIMI = {"rope_type": "yarn", "rope_theta": 50000.0, "factor": 8.0, "original_max_position_embeddings": 64,
             "beta_fast": 1.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}  # Kimi-K2's ramp settings
YARN_FACTOR_ONLY = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 256}

CONFIGS = [
    ("groups_dense1_interleave", {}),
    ("yarn_deepseek_flat_moe0", dict(rope_parameters=YARN_DEEPSEEK, rope_interleave=False, n_group=1, topk_group=1,
                                     first_k_dense_replace=0, norm_topk_prob=False, q_lora_rank=None)),
    ("yarn_mscale_dense2_eps", dict(rope_parameters=YARN_MSCALE, first_k_dense_replace=2, n_group=2, topk_group=1,
                                    num_experts_per_tok=3, rms_norm_eps=1e-3, routed_scaling_factor=1.5)),
    ("yarn_kimi_tied", dict(rope_parameters=YARN_KIMI, n_group=1, topk_group=1, q_lora_rank=None,
                            num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True,
                            routed_scaling_factor=2.827)),
    ("yarn_factor_only_unnormed_unshared", dict(rope_parameters=YARN_FACTOR_ONLY, rope_interleave=False, n_group=4,
                                                topk_group=3, norm_topk_prob=False, first_k_dense_replace=0,
                                                num_hidden_layers=2, n_shared_experts=0)),
]
PROMPT_LEN, NUM_NEW = 8, 10
# torch says so for the zero-width shared experts transformers builds when n_shared_experts is 0
pytestmark = pytest.mark.filterwarnings("ignore:Initializing zero-element tensors is a no-op:UserWarning")


def hf_config(**overrides) -> DeepseekV3Config:
    return DeepseekV3Config(architectures=[ARCHITECTURE], **{**BASE, **overrides})


def random_model(config: DeepseekV3Config, seed: int) -> DeepseekV3ForCausalLM:
    """Matrices with std 2/sqrt(fan_in), norms 1 +- 0.1: peaked logits with clear top-1/top-2 gaps."""
    model = DeepseekV3ForCausalLM(config).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen)
            p.copy_(1 + 0.1 * noise if p.dim() == 1 else 2 * noise / math.sqrt(p.shape[-1]))
        for module in model.modules():
            if isinstance(module, hf_deepseek.DeepseekV3TopkRouter):
                module.e_score_correction_bias.copy_(0.2 * torch.randn(module.num_experts, generator=gen))
    return model


class Float64Torch:
    """`torch` as transformers' DeepSeek-V3 and RoPE modules see it in the float64 checks. Even in a .double()
    model they cast RMSNorm, the attention softmax, the router and the RoPE tables to float32 (about 5e-6 off
    in the logits); here float32 means float64, so transformers' own code runs in float64 throughout."""

    float = float32 = torch.float64

    def __getattr__(self, name: str):
        return getattr(torch, name)


def transformers_float64(monkeypatch: pytest.MonkeyPatch, path: Path) -> DeepseekV3ForCausalLM:
    for module in (hf_rope_utils, hf_deepseek):
        monkeypatch.setattr(module, "torch", Float64Torch())
    return DeepseekV3ForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="eager",
                                                 experts_implementation="eager").eval()


@dataclass
class Saved:
    path: Path
    model: DeepseekV3ForCausalLM  # float32, as built
    ckpt: Checkpoint
    prompt: list[int]
    seed: int


@pytest.fixture(scope="module", params=CONFIGS, ids=[name for name, _ in CONFIGS])
def saved(request, tmp_path_factory) -> Saved:
    name, overrides = request.param
    seed = zlib.crc32(name.encode())
    model = random_model(hf_config(**overrides), seed)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # what transformers writes loads without a single warning
        ckpt = read_hf_dir(path)
    prompt = np.random.default_rng(seed).integers(0, BASE["vocab_size"], PROMPT_LEN).tolist()
    return Saved(path, model, ckpt, prompt, seed)


def test_config_maps_every_field(saved):
    cfg, theirs = saved.ckpt.config, saved.model.config
    for name in HF_DEFAULTS:
        assert getattr(cfg, name) == getattr(theirs, name, "sigmoid"), name  # transformers routes with sigmoid
    params = theirs.rope_parameters
    assert cfg.rope_theta == params["rope_theta"]
    if params["rope_type"] == "default":
        assert cfg.rope_scaling is None
    else:
        assert cfg.rope_scaling == {"type": "yarn", **{k: v for k, v in params.items()
                                                       if k not in ("rope_type", "type", "rope_theta")}}


def test_reference_matches_transformers_float64(saved, monkeypatch):
    tokens = saved.prompt + np.random.default_rng(saved.seed + 1).integers(0, BASE["vocab_size"], 8).tolist()
    ours = reference.forward_logits(saved.ckpt.config, saved.ckpt.numpy_weights(), tokens)  # [T, V]
    with torch.no_grad():
        theirs = transformers_float64(monkeypatch, saved.path)(torch.tensor([tokens])).logits[0].numpy()
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-9)
    top2 = np.sort(theirs, axis=-1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 1e-3, "logits this flat would make the greedy checks meaningless"
    assert theirs.std(axis=-1).min() > 0.5


def test_engine_matches_transformers_greedy_and_logits(saved):
    with torch.no_grad():
        out = saved.model.generate(torch.tensor([saved.prompt]), do_sample=False, max_new_tokens=NUM_NEW,
                                   min_new_tokens=NUM_NEW)
        theirs = out[0, PROMPT_LEN:].tolist()
        logits = saved.model(out[:, :-1]).logits[0, PROMPT_LEN - 1:].numpy()  # [NUM_NEW, V]
    assert len(theirs) == NUM_NEW
    cfg = DecodeConfig(budget=12, block_size=4, max_new_tokens=NUM_NEW, device="cpu", dtype="float32")
    ar = decode(saved.ckpt, saved.prompt, cfg, "ar")
    dd = decode(saved.ckpt, saved.prompt, cfg, "ddtree", DrafterSpec(noise=0.5, seed=saved.seed))
    assert ar.tokens == theirs
    assert dd.tokens == theirs
    assert dd.num_steps < NUM_NEW - 1, "the oracle's drafts were accepted at least once"
    np.testing.assert_allclose(ar.logits, logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("rope_parameters", [None, YARN_DEEPSEEK, YARN_MSCALE, YARN_KIMI, YARN_FACTOR_ONLY],
                         ids=["default", "deepseek", "mscale", "kimi", "factor_only"])
def test_rope_tables_and_softmax_scale_match_transformers(rope_parameters, monkeypatch):
    config = hf_config(rope_parameters=dict(rope_parameters) if rope_parameters else None)
    cfg = config_from_hf(config.to_diff_dict())
    num_positions, half = 1024, cfg.qk_rope_head_dim // 2
    positions = torch.arange(num_positions)[None]
    cos, sin = hf_deepseek.DeepseekV3RotaryEmbedding(config)(torch.zeros(1), positions)  # [1, N, P] float32
    ecos, esin, mscale = rope.rope_tables(cfg, num_positions, "cpu")  # [N, P/2]
    np.testing.assert_allclose(ecos.numpy(), cos[0, :, :half].numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(esin.numpy(), sin[0, :, :half].numpy(), rtol=0, atol=2e-6)
    scaling = hf_deepseek.DeepseekV3Attention(config, layer_idx=0).scaling
    assert cfg.qk_head_dim ** -0.5 * mscale * mscale == pytest.approx(scaling, rel=1e-12)
    assert reference.softmax_scale(cfg) == pytest.approx(scaling, rel=1e-12)
    for module in (hf_rope_utils, hf_deepseek):
        monkeypatch.setattr(module, "torch", Float64Torch())
    cos64, sin64 = hf_deepseek.DeepseekV3RotaryEmbedding(config)(torch.zeros(1, dtype=torch.float64), positions)
    rcos, rsin = reference.rope_tables(cfg, num_positions)
    np.testing.assert_allclose(rcos, cos64[0, :, :half].numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(rsin, sin64[0, :, :half].numpy(), rtol=0, atol=1e-12)


def test_missing_fields_take_transformers_defaults():
    ours = config_from_hf({"architectures": [ARCHITECTURE], "model_type": "deepseek_v3"})
    theirs = config_from_hf(DeepseekV3Config(architectures=[ARCHITECTURE]).to_diff_dict())
    assert ours == theirs


# ---------------------------------------------------------------------------- layouts on disk

@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Saved:
    model = random_model(hf_config(), seed=7)
    path = tmp_path_factory.mktemp("small")
    model.save_pretrained(path)
    return Saved(path, model, read_hf_dir(path), [], 7)


def copy_of(small: Saved, tmp_path: Path) -> Path:
    return Path(shutil.copytree(small.path, tmp_path / "model"))


def assert_same_weights(a: Checkpoint, b: Checkpoint) -> None:
    assert a.config == b.config
    assert a.weights.names() == b.weights.names()
    theirs = b.numpy_weights()
    for name, ours in a.numpy_weights().items():
        np.testing.assert_array_equal(ours, theirs[name], err_msg=name)


def test_sharded_save_loads_the_same(small, tmp_path):
    small.model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    assert_same_weights(read_hf_dir(tmp_path), small.ckpt)


def test_fused_experts_load_the_same(small, tmp_path):
    path = copy_of(small, tmp_path)
    state = small.model.state_dict()  # transformers 5 in memory: experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]
    assert "model.layers.1.mlp.experts.gate_up_proj" in state
    save_file({k: v.contiguous() for k, v in state.items()}, path / "model.safetensors", metadata={"format": "pt"})
    assert_same_weights(read_hf_dir(path), small.ckpt)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_checkpoints_stay_in_their_dtype(small, tmp_path, dtype):
    path = copy_of(small, tmp_path)
    state = {k: v.to(dtype) for k, v in load_file(path / "model.safetensors").items()}
    save_file(state, path / "model.safetensors")
    ckpt = read_hf_dir(path)
    loaded = dict(ckpt.weights.tensors("cpu", dtype))
    assert sorted(loaded) == sorted(ckpt.weights.names())
    for name, tensor in loaded.items():  # the stored bits, not a round trip through another dtype
        assert tensor.dtype == dtype and torch.equal(tensor.view(torch.int16), state[name].view(torch.int16)), name
    arrays = ckpt.numpy_weights()
    name = "model.layers.0.self_attn.kv_b_proj.weight"
    assert arrays[name].dtype == np.float32
    np.testing.assert_array_equal(arrays[name], state[name].float().numpy())


def test_released_config_layout_loads_the_same(small, tmp_path):
    """Released DeepSeek-V3 / Kimi-K2 configs: rope_scaling with "type", top-level rope_theta, no
    rope_interleave, plus keys transformers ignores."""
    for rope_parameters in (YARN_DEEPSEEK, None):
        config = hf_config(rope_parameters=dict(rope_parameters) if rope_parameters else None)
        data = config.to_diff_dict()
        params = data.pop("rope_parameters")
        data.pop("rope_interleave")
        data["rope_theta"] = params.pop("rope_theta")
        if params.pop("rope_type") != "default":
            data["rope_scaling"] = {"type": "yarn", **params}
        data.update(model_type="kimi_k2", torch_dtype="bfloat16", topk_method="noaux_tc", moe_layer_freq=1,
                    scoring_func="sigmoid", ep_size=1, aux_loss_alpha=0.001, seq_aux=True, auto_map={})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert config_from_hf(data) == config_from_hf(config.to_diff_dict())


def test_mtp_layers_are_ignored_with_a_warning(small, tmp_path):
    path = copy_of(small, tmp_path)
    state = load_file(path / "model.safetensors")
    mtp = BASE["num_hidden_layers"]
    state[f"model.layers.{mtp}.eh_proj.weight"] = torch.randn(48, 96)
    state[f"model.layers.{mtp}.self_attn.o_proj.weight"] = torch.randn(48, 36)
    save_file(state, path / "model.safetensors")
    with pytest.warns(UserWarning, match=rf"multi-token-prediction layer\(s\) \[{mtp}\]"):
        ckpt = read_hf_dir(path)
    assert_same_weights(ckpt, small.ckpt)


def test_unknown_config_key_warns_and_loads(small, tmp_path):
    path = copy_of(small, tmp_path)
    data = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**data, "some_new_knob": 3}))
    with pytest.warns(UserWarning, match="some_new_knob"):
        assert_same_weights(read_hf_dir(path), small.ckpt)


def test_tied_checkpoint_with_lm_head_warns(tmp_path):
    model = random_model(hf_config(tie_word_embeddings=True), seed=3)
    model.save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in state
    save_file({**state, "lm_head.weight": torch.randn(96, 48)}, tmp_path / "model.safetensors")
    with pytest.warns(UserWarning, match="ignoring lm_head.weight"):
        ckpt = read_hf_dir(tmp_path)
    assert "lm_head.weight" not in ckpt.weights.names()


# ---------------------------------------------------------------------------- what we reject

def edit_config(**changes):
    def apply(path: Path) -> None:
        data = json.loads((path / "config.json").read_text())
        data.update(changes)
        (path / "config.json").write_text(json.dumps(data))
    return apply


def edit_tensors(fn):
    def apply(path: Path) -> None:
        state = load_file(path / "model.safetensors")
        fn(state)
        save_file(state, path / "model.safetensors")
    return apply


def fused_and_per_expert(state):
    state["model.layers.1.mlp.experts.down_proj"] = torch.zeros(8, 48, 16)


def move_to_shards(path: Path) -> None:
    (path / "model.safetensors").rename(path / "model-00001-of-00002.safetensors")
    shutil.copy(path / "model-00001-of-00002.safetensors", path / "model-00002-of-00002.safetensors")


def index_with_missing_shard(path: Path) -> None:
    names = load_file(path / "model.safetensors").keys()
    weight_map = {n: "model-00002-of-00002.safetensors" for n in names}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


REJECTED = [
    ("no_config", lambda p: (p / "config.json").unlink(), "no config.json"),
    ("bad_json", lambda p: (p / "config.json").write_text("{"), "not valid JSON"),
    ("architecture", edit_config(architectures=["LlamaForCausalLM"]), "a list holding 'DeepseekV3ForCausalLM'"),
    ("model_type", edit_config(model_type="llama"), "model_type='llama'"),
    ("quantized_config", edit_config(quantization_config={"quant_method": "gptq", "bits": 4}), "dequantize"),
    ("fp8_tensor", edit_tensors(lambda s: s.update({"model.norm.weight": s["model.norm.weight"].to(
        torch.float8_e4m3fn)})), "model.norm.weight has dtype F8_E4M3"),
    ("int8_tensor", edit_tensors(lambda s: s.update({"lm_head.weight": s["lm_head.weight"].to(torch.int8)})),
     "lm_head.weight has dtype I8"),
    ("unknown_tensor", edit_tensors(lambda s: s.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(3)})),
     r"model.layers.0.self_attn.q_proj.bias"),
    ("missing_tensor", edit_tensors(lambda s: s.pop("model.layers.1.mlp.gate.e_score_correction_bias")),
     r"missing, e.g. \['model.layers.1.mlp.gate.e_score_correction_bias'\]"),
    ("wrong_shape", edit_tensors(lambda s: s.update({"model.norm.weight": torch.ones(49)})),
     r"model.norm.weight has shape \(49,\), but config.json implies \(48,\)"),
    ("fused_and_per_expert", edit_tensors(fused_and_per_expert), "given twice"),
    ("fused_wrong_shape", edit_tensors(lambda s: s.update({"model.layers.2.mlp.experts.gate_up_proj":
                                                           torch.zeros(8, 16, 48)})), r"shape \(8, 16, 48\)"),
    ("no_weights", lambda p: (p / "model.safetensors").unlink(), "found no .safetensors file"),
    ("shards_without_index", move_to_shards, "but no model.safetensors.index.json"),
    ("index_missing_shard", index_with_missing_shard, "model-00002-of-00002.safetensors: the shard named by "
                                                      "model.safetensors.index.json is missing"),
    ("rope_linear", edit_config(rope_parameters={"rope_type": "linear", "factor": 2.0}), "RoPE type 'linear'"),
    ("rope_theta_conflict", edit_config(rope_theta=5000.0), "rope_theta=5000.0 but the RoPE dict says"),
    ("rope_both_layouts", edit_config(rope_scaling={"type": "yarn", "factor": 2.0}), "disagree"),
    ("yarn_without_factor", edit_config(rope_parameters={"rope_type": "yarn"}), "rope_scaling needs 'factor'"),
    ("yarn_unknown_key", edit_config(rope_parameters={"rope_type": "yarn", "factor": 2.0, "low_freq_factor": 1}),
     r"rope_scaling has unknown key\(s\) \['low_freq_factor'\]"),
    ("gelu", edit_config(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    ("attention_bias", edit_config(attention_bias=True), "attention_bias=True is not supported"),
    ("bad_field", edit_config(num_experts_per_tok=9), "num_experts_per_tok=9"),
    ("null_field", edit_config(n_group=None), "n_group=None"),
]


@pytest.mark.parametrize("mutate, message", [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED])
def test_rejects_with_a_clear_error(small, tmp_path, mutate, message):
    path = copy_of(small, tmp_path)
    mutate(path)
    with pytest.raises(HFLoadError, match=message):
        read_hf_dir(path)


# ---------------------------------------------------------------------------- load_model and import-hf

def test_load_model_takes_a_directory_or_a_kdtr_file(small, tmp_path):
    assert_same_weights(load_model(small.path), small.ckpt)
    small.ckpt.prompt = np.arange(4, dtype=np.int64)  # a .kdtr file always carries a prompt
    write_kdtr(tmp_path / "m.kdtr", small.ckpt)
    assert_same_weights(load_model(str(tmp_path / "m.kdtr")), small.ckpt)
    with pytest.raises(ModelLoadError, match="no such file or directory"):
        load_model(tmp_path / "absent")
    with pytest.raises(ModelLoadError, match="pass the Hugging Face model directory"):
        load_model(small.path / "config.json")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(ModelLoadError, match="not a .kdtr file or a directory"):
        load_model(tmp_path / "notes.txt")


def test_import_hf_writes_a_fixture_with_transformers_greedy_tokens(small, tmp_path, capsys):
    out = tmp_path / "imported.kdtr"
    assert cli_main(["import-hf", str(small.path), "--out", str(out), "--golden", "6"]) == 0
    fixture = read_kdtr(out)
    assert_same_weights(fixture, small.ckpt)
    assert fixture.prompt.shape == (8,) and fixture.golden_tokens.shape == (6,)
    with torch.no_grad():
        generated = small.model.generate(torch.tensor([fixture.prompt.tolist()]), do_sample=False, max_new_tokens=6,
                                         min_new_tokens=6)
    assert fixture.golden_tokens.tolist() == generated[0, 8:].tolist()
    assert (fixture.golden_logits.argmax(axis=-1) == fixture.golden_tokens).all()

    assert cli_main(["import-hf", str(small.path), "--out", str(out), "--golden", "2"]) == 2
    assert "exists; pass --force" in capsys.readouterr().err
    assert cli_main(["import-hf", str(small.path), "--out", str(out), "--golden", "2", "--prompt", "5, 6 7",
                     "--force"]) == 0
    assert read_kdtr(out).prompt.tolist() == [5, 6, 7]
