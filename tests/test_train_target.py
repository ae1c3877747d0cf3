"""The trainable target (engine/training) against the engine, and `train-target` end to end on the CPU.

The module's float32 logits must equal the numpy golden model's and the engine's absorbed-MLA model's on the
checkpoint it saves (loaded by engine.loaders.hf_import, no conversion), its hidden states transformers' numbering,
and its batched cached greedy generation the engine's AR decode. Then the tiny recipe trains, saves, loads in the
engine and decodes; a paused and resumed run equals an uninterrupted one; bad options fail clearly.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cli.__main__ import main as cli_main
from cli.train_target import RECIPE_OPTIONS, command_line, recipe_from_args
from engine.config import DecodeConfig, ModelConfig
from engine.decoding.session import decode
from engine.loaders.fp8_blocks import FP8_BLOCK, FP8_QUANTIZATION, quantize_fp8
from engine.loaders.hf_import import read_hf_dir
from engine.loaders.loading import load_model
from engine.loaders.text import Tokenizer
from engine.model import reference
from engine.model.cache import LatentCache
from engine.model.fixtures import random_weights, tiny_config
from engine.model.target import TargetModel
from engine.model.weights import weight_shapes
from engine.training.corpus import draw_prompts, load_corpus
from engine.training.data import WindowSampler, eval_windows, token_stream
from engine.training.export import is_fp8_weight, save_hf_dir
from engine.training.generate import distinct_ngram_rate, greedy_generate
from engine.training.loop import Trainer
from engine.training.recipe import PRESETS, TrainError
from engine.training.saved_validation import saved_validation_loss
from engine.training.target_model import TargetLM, update_router_biases
from tests.greedy import assert_greedy_equal
from tests.hf_dirs import dequantize_blocks, e4m3_values
from tests.tolerance import assert_close_at_scale

FLOAT32_AT_SCALE = 3e-5  # float32 against the float64 golden model: measured up to 1.3e-5 of the largest logit
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 1.0, "mscale_all_dim": 0.8}
VARIANTS = {
    "qlora_dense1_groups": {},
    "qproj_moe0_unnormed": dict(q_lora_rank=None, first_k_dense_replace=0, rope_interleave=False,
                                norm_topk_prob=False, n_group=1, topk_group=1),
    "yarn_tied_noshared": dict(rope_scaling=YARN, tie_word_embeddings=True, n_shared_experts=0),
}


def variant_config(name: str) -> ModelConfig:
    return ModelConfig(**{**tiny_config().to_dict(), **VARIANTS[name]})


def module_with_weights(cfg: ModelConfig, seed: int) -> TargetLM:
    """A TargetLM holding the fixture generator's seeded weights (peaked logits, non-zero router biases)."""
    model = TargetLM(cfg)
    model.load_state_dict({name: torch.from_numpy(w) for name, w in random_weights(cfg, seed).items()})
    return model.eval()


def saved_and_loaded(model: TargetLM, directory: Path):
    save_hf_dir(model, directory, "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the engine takes our config.json and tensors without a remark
        return read_hf_dir(directory)


def engine_prefill_logits(model: TargetModel, cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    """The engine's absorbed-MLA logits [n, V] of ids [n] as one causal prefill into a fresh float32 cache."""
    n = ids.shape[0]
    cache = LatentCache(cfg.num_hidden_layers, n, cfg.kv_lora_rank, cfg.qk_rope_head_dim, "cpu", torch.float32,
                        model.rope(n))
    return model.forward(ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(), cache)[0]


def test_parameters_carry_the_engine_weight_names():
    for name in VARIANTS:
        cfg = variant_config(name)
        state = TargetLM(cfg).state_dict()
        assert {k: tuple(v.shape) for k, v in state.items()} == weight_shapes(cfg)
        params = dict(TargetLM(cfg).named_parameters())
        assert not [k for k in params if k.endswith("e_score_correction_bias")], "the router bias is not trained"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_equal_golden_and_engine(variant, tmp_path):
    cfg = variant_config(variant)
    seed = int(np.random.default_rng().integers(1 << 30))
    model = module_with_weights(cfg, seed)
    ckpt = saved_and_loaded(model, tmp_path)
    tokens = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(2, 24))
    with torch.no_grad():
        ours = model(torch.from_numpy(tokens)).logits.double().numpy()  # [2, 24, V]
    engine_model = TargetModel.from_checkpoint(ckpt)
    for row, ids in enumerate(tokens):
        golden = reference.forward_logits(cfg, ckpt.numpy_weights(), ids.tolist())
        assert_close_at_scale(ours[row], golden, FLOAT32_AT_SCALE, f"(seed {seed})")
        engine_logits = engine_prefill_logits(engine_model, cfg, torch.from_numpy(ids))
        assert_close_at_scale(ours[row], engine_logits.numpy(), FLOAT32_AT_SCALE, f"(seed {seed})")


def test_hidden_states_follow_transformers_numbering(tmp_path):
    from transformers import DeepseekV3ForCausalLM

    cfg = variant_config("qlora_dense1_groups")
    model = module_with_weights(cfg, seed=3)
    save_hf_dir(model, tmp_path, "float32")
    hf = DeepseekV3ForCausalLM.from_pretrained(tmp_path).eval()
    tokens = torch.from_numpy(np.random.default_rng(4).integers(0, cfg.vocab_size, size=(2, 16)))
    layers = list(range(cfg.num_hidden_layers))
    with torch.no_grad():
        ours = model(tokens, hidden_layers=layers)
        theirs = hf(tokens, output_hidden_states=True)
    for i in layers:
        torch.testing.assert_close(ours.hidden[i], theirs.hidden_states[i + 1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours.logits, theirs.logits, atol=1e-4, rtol=1e-4)
    assert model(tokens, logits_from=None).logits is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
ON_A_GPU = pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])


@pytest.mark.parametrize("device", ["cpu", ON_A_GPU])
def test_batched_greedy_generation_equals_engine_ar(device, tmp_path):
    """The prefill, then one-token steps at a position tensor (on a GPU a captured graph's replays, deterministic
    mode on as train-target runs, and on again after): float32 tokens equal the engine's AR decode."""
    cfg = variant_config("qlora_dense1_groups")
    seed = int(np.random.default_rng().integers(1 << 30))
    model = module_with_weights(cfg, seed)
    ckpt = saved_and_loaded(model, tmp_path)
    engine_model = TargetModel.from_checkpoint(ckpt)
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, size=(5, 7))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        ours = greedy_generate(model.to(device), torch.from_numpy(prompts).to(device), num_new=16,
                               batch_size=2).cpu()  # chunks of 2, 2, 1
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
    for prompt, tokens in zip(prompts.tolist(), ours.tolist(), strict=True):
        ar = decode(ckpt, prompt, DecodeConfig(max_new_tokens=16, budget=0), "ar", model=engine_model)
        assert_greedy_equal(ar.tokens, ar.logits, tokens)


def test_bias_balancing_moves_toward_the_mean_load():
    cfg = variant_config("qlora_dense1_groups")
    model = module_with_weights(cfg, seed=5)
    tokens = torch.from_numpy(np.random.default_rng(6).integers(0, cfg.vocab_size, size=(4, 32)))
    with torch.no_grad():
        loads = model(tokens).expert_loads  # [MoE layers, E]
    assert loads.shape == (cfg.num_hidden_layers - cfg.first_k_dense_replace, cfg.n_routed_experts)
    assert (loads.sum(1) == tokens.numel() * cfg.num_experts_per_tok).all()
    routers = [layer.mlp.gate for layer in model.model.layers if cfg.is_moe_layer(layer.index)]
    before = [r.e_score_correction_bias.clone() for r in routers]
    update_router_biases(model, loads, speed=0.01)
    for router, old, load in zip(routers, before, loads.float(), strict=True):
        expected = old + 0.01 * torch.sign(load.mean() - load)
        torch.testing.assert_close(router.e_score_correction_bias, expected)


def test_distinct_ngram_rate():
    assert distinct_ngram_rate(torch.arange(20)[None]) == 1.0
    loop = torch.tensor([[1, 2] * 10])  # period 2: two distinct 4-grams among 17
    assert distinct_ngram_rate(loop) == pytest.approx(2 / 17)


# ---------------------------------------------------------------------------------------------- train-target

def train(capsys, *argv: str) -> tuple[int, str]:
    code = cli_main(["train-target", *argv])
    return code, capsys.readouterr().err


def test_tiny_recipe_learns_and_the_engine_decodes_it(tiny_target_run):
    out, log = tiny_target_run
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "prompts.json",
                                                     "tokenizer.json", "training.json"]  # no checkpoints left
    report = json.loads((out / "training.json").read_text())
    losses = [entry["train_loss"] for entry in report["intervals"]]
    assert losses[0] - losses[-1] > 1.0, losses
    assert report["final_val_loss"] < np.log(report["tokenizer"]["vocab_size"]) - 1.5
    assert report["steps"] == 300 and report["tokens_seen"] == 300 * 12 * 160
    assert "step 300/300" in log and "tok/s" in log and "\r" not in log  # a plain line per interval off a TTY

    ckpt = load_model(out)
    tokenizer = Tokenizer.load(out)
    assert ckpt.config.vocab_size == tokenizer.vocab_size
    model = TargetLM(ckpt.config)
    model.load_state_dict({k: v.float() for k, v in load_file(out / "model.safetensors").items()})
    prompt = tokenizer.encode("def main(argv):\n    parser = ")
    ar = decode(ckpt, prompt, DecodeConfig(max_new_tokens=24, budget=0), "ar")
    ours = greedy_generate(model, torch.tensor([prompt]), num_new=24)[0].tolist()
    assert_greedy_equal(ar.tokens, ar.logits, ours)
    assert isinstance(tokenizer.decode(ar.tokens), str)

    # prompts.json leads with the prompt whose greedy continuation repeats itself least (the default prompt)
    recipe = PRESETS["tiny"]
    drawn = torch.from_numpy(draw_prompts(load_corpus(None), tokenizer, recipe.sample_prompts,
                                          recipe.sample_prompt_len, recipe.seed))
    rows = greedy_generate(model, drawn, num_new=recipe.sample_new_tokens).tolist()
    rates = [len({tuple(r[i:i + 4]) for i in range(len(r) - 3)}) / (len(r) - 3) for r in rows]
    best = rates.index(max(rates))
    order = [best] + [i for i in range(len(rows)) if i != best]
    texts = [p["text"] for p in json.loads((out / "prompts.json").read_text())["prompts"]]
    assert texts == [tokenizer.decode(drawn[i].tolist()) for i in order]
    assert report["greedy_sample"]["example"]["prompt"] == texts[0]
    assert report["greedy_sample"]["example"]["distinct_4gram_rate"] == pytest.approx(rates[best])
    assert report["greedy_sample"]["distinct_4gram_rate"] == pytest.approx(sum(rates) / len(rates))


def test_the_validation_loss_of_the_saved_file_is_recorded(tiny_target_run, small_corpus, tmp_path):
    """training.json's saved_val_loss is the saved file's loss over the run's held-out windows: recomputed here by the
    engine's absorbed-MLA model (another implementation) on the windows the recipe cuts, near the loss of the weights
    in training (the bf16 file rounds them), and saved_validation_loss reproduces it; another corpus or a broken
    training.json is refused with a message that says what to pass."""
    out, _ = tiny_target_run
    report = json.loads((out / "training.json").read_text())
    recipe, ckpt = PRESETS["tiny"], load_model(out)
    windows = eval_windows(token_stream(load_corpus(None), Tokenizer.load(out), "held-out"), recipe.seq_len,
                           recipe.eval_windows)
    model = TargetModel.from_checkpoint(ckpt)
    total = sum(torch.nn.functional.cross_entropy(engine_prefill_logits(model, ckpt.config, w[:-1]).double(), w[1:],
                                                  reduction="sum").item() for w in windows)
    engine_loss = total / (windows.shape[0] * recipe.seq_len)
    assert report["saved_val_loss"] == pytest.approx(engine_loss, abs=1e-4)
    assert report["saved_val_loss"] != report["final_val_loss"]
    assert report["saved_val_loss"] == pytest.approx(report["final_val_loss"], abs=0.02)
    assert saved_validation_loss(out, None, "cpu") == pytest.approx(report["saved_val_loss"], abs=1e-6)
    with pytest.raises(TrainError, match=r"held-out split is \d+ tokens .* validated on \d+; pass the corpus it was "
                                         r"trained on \(training.json: the standard library"):
        saved_validation_loss(out, small_corpus, "cpu")
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (broken / name).write_bytes((out / name).read_bytes())
    (broken / "training.json").write_text('{"recipe": {}}')
    with pytest.raises(TrainError, match="not the record train-target writes"):
        saved_validation_loss(broken, None, "cpu")


def test_resume_continues_exactly(tiny_target_run, small_corpus, tmp_path, capsys):
    common = ["--preset", "tiny", "--device", "cpu", "--tokenizer", str(tiny_target_run[0] / "tokenizer.json"),
              "--corpus-dir", str(small_corpus), "--steps", "12", "--log-every", "3", "--eval-every", "6",
              "--checkpoint-every", "6", "--dropout", "0.1", "--save-dtype", "float32"]
    assert train(capsys, "--out", str(tmp_path / "whole"), *common)[0] == 0
    code, log = train(capsys, "--out", str(tmp_path / "parts"), *common, "--pause-at", "9")
    assert code == 0 and "--resume" in log
    assert [p.name for p in (tmp_path / "parts" / "checkpoints").iterdir()] == ["step-0000006.pt", "step-0000009.pt"]
    code, err = train(capsys, "--out", str(tmp_path / "parts"), "--resume", "--compile")
    assert code == 2 and "'compile': True" in err, "a resume keeps the run's eager or compiled steps"
    assert train(capsys, "--out", str(tmp_path / "parts"), "--resume")[0] == 0
    whole, parts = (load_file(tmp_path / d / "model.safetensors") for d in ("whole", "parts"))
    assert all(torch.equal(whole[k], parts[k]) for k in whole)
    reports = [json.loads((tmp_path / d / "training.json").read_text()) for d in ("whole", "parts")]
    assert reports[0]["intervals"] == [{**e, "tokens_per_s": reports[0]["intervals"][i]["tokens_per_s"]}
                                       for i, e in enumerate(reports[1]["intervals"])]
    assert reports[1]["resumed_at"] == [9]

    assert train(capsys, "--out", str(tmp_path / "other"), *common, "--seed", "1")[0] == 0
    other = load_file(tmp_path / "other" / "model.safetensors")
    assert not torch.equal(whole["model.embed_tokens.weight"], other["model.embed_tokens.weight"])


def test_compiled_steps_train_as_the_eager_ones():
    """--compile hands the step's forward and loss to torch.compile: the same losses and, after AdamW's steps,
    the same weights up to rounding (measured: losses within 1e-6, weights within 2.1e-4 after 6 steps at lr 6e-3)."""
    recipe = dataclasses.replace(PRESETS["tiny"], steps=6, log_every=3, eval_every=3, checkpoint_every=3)
    stream = torch.randint(0, 512, (100_000,), generator=torch.Generator().manual_seed(int(time.time())))
    runs = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        model = TargetLM(recipe.model_config(512))
        trainer = Trainer(model, dataclasses.replace(recipe, compile=compiled),
                          WindowSampler(stream, recipe.seq_len, recipe.batch_size, 0), stream[:644].view(4, 161))
        losses = torch.stack([trainer.train_step() for _ in range(recipe.steps)])
        runs[compiled] = losses, model.state_dict()
    (eager_losses, eager), (compiled_losses, compiled) = runs[False], runs[True]
    torch.testing.assert_close(compiled_losses, eager_losses, rtol=1e-5, atol=0)
    assert all(torch.allclose(compiled[k], eager[k], atol=2e-3, rtol=0) for k in eager)
    assert np.isfinite(trainer.validation_loss())


BAD_OPTIONS = [
    (["--steps", "-5"], "steps=-5"),
    (["--seq-len", "4096"], "max_position_embeddings"),
    (["--eval-every", "7"], "multiple of log_every"),
    (["--resume"], "holds no checkpoint"),
    (["--resume", "--force"], "contradict"),
    (["--pause-at", "7"], "--pause-at 7"),
    (["--tokenizer", "/nonexistent/tokenizer.json"], "no such file"),
    (["--corpus-dir", "/nonexistent"], "not a directory"),
]


@pytest.mark.parametrize(("argv", "message"), BAD_OPTIONS, ids=[m for _, m in BAD_OPTIONS])
def test_bad_options_fail_clearly(argv, message, tmp_path, capsys):
    code, err = train(capsys, "--out", str(tmp_path / "run"), "--device", "cpu", *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "run").exists(), "a refused run leaves nothing behind"


def test_out_dir_conflicts_fail_clearly(tiny_target_run, tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    code, err = train(capsys, "--out", str(file), "--device", "cpu")
    assert code == 2 and "is a file" in err
    before = {p.name: p.stat().st_mtime_ns for p in tiny_target_run[0].iterdir()}
    code, err = train(capsys, "--out", str(tiny_target_run[0]), "--device", "cpu")
    assert code == 2 and "finished run" in err and "--force" in err
    code, err = train(capsys, "--out", str(tiny_target_run[0]), "--resume")
    assert code == 2 and "nothing to resume" in err
    assert {p.name: p.stat().st_mtime_ns for p in tiny_target_run[0].iterdir()} == before


def test_compile_follows_the_preset_unless_the_command_line_says(tmp_path):
    """showcase-22m compiles by default, tiny does not; --no-compile and --compile override either, and the
    recorded command line says which."""
    assert PRESETS["showcase-22m"].compile and not PRESETS["tiny"].compile
    for preset in ("tiny", "showcase-22m"):
        for flag, wanted in (("--compile", True), ("--no-compile", False)):
            args = argparse.Namespace(**{opt: None for opt in RECIPE_OPTIONS}, preset=preset)
            args.compile = wanted
            recipe = recipe_from_args(args, None)
            assert recipe.compile is wanted and recipe.preset == preset
            args.out, args.tokenizer, args.pause_at, args.resume, args.force = tmp_path, None, None, False, False
            assert command_line(args).split().count(flag) == 1


def test_compile_without_a_cpp_compiler_fails_clearly(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch._inductor.config.cpp, "cxx", (str(tmp_path / "no-such-g++"),))
    code, err = train(capsys, "--out", str(tmp_path / "run"), "--device", "cpu", "--compile")
    assert code == 2 and "needs a C++ compiler" in err and "drop --compile" in err, err
    assert not (tmp_path / "run").exists(), "a refused run leaves nothing behind"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where torch sees no GPU")
def test_cuda_without_a_gpu_fails_clearly(tmp_path, capsys):
    code, err = train(capsys, "--out", str(tmp_path / "run"), "--device", "cuda")
    assert code == 2 and "sees no CUDA GPU" in err


# ---------------------------------------------------------------------------------------------- on a GPU

def showcase_model(device: str) -> TargetLM:
    torch.manual_seed(0)
    return TargetLM(PRESETS["showcase"].model_config(4096), dropout=0.1).to(device)


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("unlikelihood_weight", [0.0, 0.5])
def test_cuda_training_steps_never_wait_for_the_device(unlikelihood_weight):
    """A step, with the unlikelihood term's greedy continuations and repeat mask too, queues its work and returns."""
    recipe = dataclasses.replace(PRESETS["showcase"], device="cuda", unlikelihood_weight=unlikelihood_weight)
    stream = torch.randint(0, 4096, (200_000,), device="cuda")
    trainer = Trainer(showcase_model("cuda"), recipe, WindowSampler(stream, recipe.seq_len, recipe.batch_size, 0),
                      eval_windows(stream.cpu(), recipe.seq_len, 4))
    losses = [trainer.train_step() for _ in range(3)]  # warm-up: cuBLAS handles, the first epoch's order
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses += [trainer.train_step() for _ in range(5)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(torch.isfinite(loss) for loss in losses)
    assert np.isfinite(trainer.validation_loss())


@pytest.mark.cuda
@needs_cuda
def test_cuda_generation_of_the_drafter_data_is_quick():
    model = showcase_model("cuda")
    prompts = torch.randint(0, 4096, (2048, 64), device="cuda")
    greedy_generate(model, prompts[:8], num_new=8, dtype="bfloat16")  # warm-up
    torch.cuda.synchronize()
    start = time.perf_counter()
    tokens = greedy_generate(model, prompts, num_new=256, dtype="bfloat16")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    print(f"2048 prompts x 256 new tokens: {seconds:.1f} s")
    assert tokens.shape == (2048, 256) and seconds < 60
    assert 0 <= int(tokens.min()) and int(tokens.max()) < 4096


@pytest.mark.cuda
@needs_cuda
def test_cuda_runs_repeat_and_resume_exactly(small_corpus, tmp_path, capsys):
    common = ["--preset", "tiny", "--device", "cuda", "--corpus-dir", str(small_corpus), "--steps", "20",
              "--log-every", "5", "--eval-every", "10", "--checkpoint-every", "10", "--dropout", "0.1",
              "--save-dtype", "float32"]
    for name in ("first", "second"):
        assert train(capsys, "--out", str(tmp_path / name), *common)[0] == 0
    assert train(capsys, "--out", str(tmp_path / "parts"), *common, "--pause-at", "10")[0] == 0
    assert train(capsys, "--out", str(tmp_path / "parts"), "--resume")[0] == 0
    first, second, parts = (load_file(tmp_path / d / "model.safetensors") for d in ("first", "second", "parts"))
    assert all(torch.equal(first[k], second[k]) and torch.equal(first[k], parts[k]) for k in first)


def test_fp8_quantization_is_within_e4m3s_rounding_of_every_block():
    """quantize_fp8 on a matrix of several partial blocks, decoded by the tests' own e4m3 decoder: every block's
    largest magnitude lands on 448 and every value within e4m3's rounding (3 mantissa bits: 2^-4 relative, plus the
    subnormal step 2^-9 of the block's scale)."""
    rng = np.random.default_rng(seed := int(np.random.SeedSequence().entropy % 2**32))
    rows, cols = int(rng.integers(129, 400)), int(rng.integers(129, 400))
    weight = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(1e-3, 10))
    weight[:128, :128] = 0.0  # a block of zeros stays zeros
    bits, scale = quantize_fp8(weight, FP8_BLOCK)
    assert bits.dtype == torch.float8_e4m3fn and scale.shape == (-(-rows // 128), -(-cols // 128))
    decoded = dequantize_blocks(bits.view(torch.uint8).numpy(), scale.numpy(), FP8_BLOCK)
    bound = 2.0 ** -4 * np.abs(weight.numpy()) + np.repeat(np.repeat(scale.numpy(), 128, 0), 128, 1)[:rows, :cols] \
        * 2.0 ** -9
    assert (np.abs(decoded - weight.numpy()) <= bound * (1 + 1e-6)).all(), f"seed {seed}"
    assert (decoded[:128, :128] == 0).all()
    tops = [np.abs(e4m3_values(bits.view(torch.uint8).numpy()[i:i + 128, j:j + 128])).max()
            for i in range(128, rows, 128) for j in range(0, cols, 128)]
    assert tops and all(t == 448.0 for t in tops), f"seed {seed}"


def test_an_fp8_target_loads_dequantized_and_decodes_as_ar(tmp_path):
    """save_hf_dir(..., "fp8") writes DeepSeek-V3's layout (projection matrices F8_E4M3 with a scale per block, the
    rest bfloat16, quantization_config), about half bfloat16's bytes; the engine loads it as the tests' decoder
    decodes it, and DDTree on it emits AR's tokens."""
    cfg = variant_config("qlora_dense1_groups")
    model = module_with_weights(cfg, seed=int(np.random.default_rng().integers(1 << 30)))
    save_hf_dir(model, tmp_path / "bf16", "bfloat16")
    save_hf_dir(model, tmp_path / "fp8", "fp8")
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert config["quantization_config"] == FP8_QUANTIZATION and config["torch_dtype"] == "bfloat16"
    stored = load_file(tmp_path / "fp8" / "model.safetensors")
    ckpt = read_hf_dir(tmp_path / "fp8")
    loaded = ckpt.numpy_weights()
    quantized = [n for n, t in model.state_dict().items() if is_fp8_weight(n, tuple(t.shape))]
    assert quantized and any(n.endswith("mlp.gate.weight") for n in model.state_dict())
    for name, t in model.state_dict().items():
        if name in quantized:
            assert stored[name].dtype == torch.float8_e4m3fn and stored[f"{name}_scale_inv"].dtype == torch.float32
            want = dequantize_blocks(stored[name].view(torch.uint8).numpy(), stored[f"{name}_scale_inv"].numpy(),
                                     FP8_BLOCK)
        else:
            assert stored[name].dtype == torch.bfloat16 and f"{name}_scale_inv" not in stored
            want = t.detach().bfloat16().float().numpy()
        np.testing.assert_array_equal(loaded[name], want, err_msg=name)
    fp8_bytes = (tmp_path / "fp8" / "model.safetensors").stat().st_size
    assert fp8_bytes < 0.75 * (tmp_path / "bf16" / "model.safetensors").stat().st_size
    prompt = [int(x) for x in np.random.default_rng().integers(0, cfg.vocab_size, 8)]
    cfg_decode = DecodeConfig(budget=16, max_new_tokens=16)
    ar = decode(ckpt, prompt, cfg_decode, "ar")
    tree = decode(ckpt, prompt, cfg_decode, "ddtree")
    assert_greedy_equal(ar.tokens, ar.logits, tree.tokens)


def test_an_unknown_save_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"dtype='fp16': expected one of \('bfloat16', 'float32', 'fp8'\)"):
        save_hf_dir(TargetLM(variant_config("qlora_dense1_groups")), Path("/nonexistent"), "fp16")
