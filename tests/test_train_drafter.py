"""`train-drafter`: the training forward is the engine's drafter forward (one anchor = one engine block), and
the tiny recipe trains a DFlash drafter on the tiny trained target end to end on the CPU: the loss goes down, the
directory loads with the engine's DFlash loader, DDTree and the chain with it emit exactly the AR tokens, a
paused and resumed run equals an uninterrupted one, and bad options fail clearly."""
from __future__ import annotations

import contextlib
import io
import json
import random

import numpy as np
import pytest
import torch
from greedy import assert_greedy_equal
from test_train_target import module_with_weights, saved_and_loaded, variant_config

from cli.__main__ import main
from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.dflash_checkpoint import load_tensors, read_dflash_dir
from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import tensor_shapes
from engine.loaders.text import Tokenizer
from engine.model.dflash import DFlashModel, DFlashWeights
from engine.model.target import TargetModel
from engine.training.drafter_model import DrafterLM, block_loss
from engine.training.drafter_recipe import DRAFTER_PRESETS


def drafter_config(target_cfg, **overrides) -> DFlashConfig:
    base = dict(hidden_size=target_cfg.hidden_size, vocab_size=target_cfg.vocab_size, block_size=5,
                num_target_layers=target_cfg.num_hidden_layers, mask_token_id=3, target_layer_ids=(0, 2),
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=48)
    return DFlashConfig(**{**base, **overrides})


def test_the_training_forward_is_the_engine_forward_block_by_block(tmp_path):
    """Every block of a multi-anchor training forward equals the engine's drafter run on the context strictly
    before that anchor, in float32."""
    seed = random.randrange(2**20)
    target_lm = module_with_weights(variant_config("qlora_dense1_groups"), seed)
    engine_target = TargetModel.from_checkpoint(saved_and_loaded(target_lm, tmp_path / "t"))
    cfg = drafter_config(target_lm.cfg, rope_theta=random.choice([10000.0, 5e5]))
    torch.manual_seed(seed)
    drafter = DrafterLM(cfg)
    with torch.no_grad():
        for p in drafter.parameters():  # norms off 1 too, so a skipped norm would show
            p.add_(0.1 * torch.randn_like(p))
    rng = np.random.default_rng(seed)
    tokens = torch.from_numpy(rng.integers(0, cfg.vocab_size, size=(2, 30)))
    anchors = torch.from_numpy(np.sort(np.stack([rng.choice(np.arange(1, 26), 4, replace=False) for _ in range(2)])))
    with torch.no_grad():
        hidden = torch.cat(target_lm(tokens, hidden_layers=cfg.target_layer_ids, logits_from=None).hidden, -1)
        logits = drafter(hidden, tokens, anchors, target_lm.model.embed_tokens.weight, target_lm.output_weight)
        weights = DFlashWeights.from_tensors(cfg, {n: p.detach() for n, p in drafter.tensors().items()})
        for b in range(2):
            for j, a in enumerate(anchors[b].tolist()):
                model = DFlashModel(cfg, weights, engine_target.embed, engine_target.lm_head,
                                    cfg.block_size - 1, capacity=40)
                model.write_context(hidden[b, :a], 0)
                model.length.fill_(a)
                ours = model.block_logprobs(tokens[b, a])
                np.testing.assert_allclose(logits[b, j].log_softmax(-1).numpy(), ours.numpy(), atol=1e-4, rtol=0)


def test_block_loss_weights_rows_by_depth():
    logits = torch.randn(2, 3, 4, 11)
    tokens = torch.randint(0, 11, (2, 12))
    anchors = torch.tensor([[0, 3, 7], [1, 2, 6]])
    gamma = 4.0
    total = 0.0
    for b in range(2):
        for j in range(3):
            for k in range(4):
                ce = torch.nn.functional.cross_entropy(logits[b, j, k], tokens[b, anchors[b, j] + k + 1])
                total += float(ce) * np.exp(-k / gamma)
    norm = sum(np.exp(-k / gamma) for k in range(4)) * 6
    assert float(block_loss(logits, tokens, anchors, gamma)) == pytest.approx(total / norm, rel=1e-5)


def run_drafter(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train-drafter", *argv])
    return code, err.getvalue()


@pytest.fixture(scope="module")
def tiny_drafter(tiny_target_run, tmp_path_factory):
    target, _ = tiny_target_run
    out = tmp_path_factory.mktemp("drafter") / "dflash"
    code, log = run_drafter("--target", str(target), "--out", str(out), "--preset", "tiny", "--device", "cpu")
    assert code == 0, log
    return target, out, log


def test_tiny_drafter_learns_and_drafts_inside_the_engine(tiny_drafter):
    target, out, log = tiny_drafter
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "training.json"]
    report = json.loads((out / "training.json").read_text())
    losses = [e["train_loss"] for e in report["intervals"]]
    recipe = DRAFTER_PRESETS["tiny"]
    assert losses[0] - losses[-1] > 0.5, losses
    assert report["steps"] == recipe.steps and report["final_val_accepted"] > 0.5
    assert f"step {recipe.steps}/{recipe.steps}" in log
    ckpt = read_dflash_dir(out)
    assert ckpt.config.block_size == recipe.block_size and ckpt.config.mask_token_id == Tokenizer.load(
        target).end_of_text_id
    from engine.loaders.loading import load_model

    model_ckpt = load_model(target)
    tokenizer = Tokenizer.load(target)
    prompt = tokenizer.encode("def main(argv):\n    parser = argparse.")
    cfg = DecodeConfig(budget=24, block_size=recipe.block_size, max_new_tokens=32)
    ar = decode(model_ckpt, prompt, cfg, "ar")
    spec = DrafterSpec("dflash", model=str(out))
    chain = decode(model_ckpt, prompt, cfg, "chain", spec)
    tree = decode(model_ckpt, prompt, cfg, "ddtree", spec)
    assert_greedy_equal(ar.tokens, ar.logits, chain.tokens)
    assert_greedy_equal(ar.tokens, ar.logits, tree.tokens)
    assert sum(s.num_accepted for s in tree.steps) > 0, "the trained drafter's guesses get accepted"


def test_pause_and_resume_equal_an_uninterrupted_run(tiny_target_run, tmp_path):
    target, _ = tiny_target_run
    short = ["--target", str(target), "--preset", "tiny", "--device", "cpu", "--steps", "40", "--num-sequences",
             "32", "--log-every", "10", "--eval-every", "20", "--checkpoint-every", "20"]
    assert run_drafter(*short, "--out", str(tmp_path / "a"))[0] == 0
    assert run_drafter(*short, "--out", str(tmp_path / "b"), "--pause-at", "20")[0] == 0
    assert (tmp_path / "b" / "checkpoints").is_dir() and not (tmp_path / "b" / "training.json").exists()
    code, log = run_drafter(*short, "--out", str(tmp_path / "b"), "--resume")
    assert code == 0, log
    a, b = (load_tensors(read_dflash_dir(tmp_path / n), "cpu", torch.float32) for n in "ab")
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_an_fp8_drafter_is_saved_block_wise_and_drafts_ar_s_tokens(tiny_target_run, tmp_path):
    """--save-dtype fp8: the matrices F8_E4M3 with their scales (half the bytes of bfloat16), and the drafter
    loaded from them still decodes AR's tokens in the engine."""
    target, _ = tiny_target_run
    short = ["--target", str(target), "--preset", "tiny", "--device", "cpu", "--steps", "20", "--num-sequences",
             "32", "--log-every", "10", "--eval-every", "20", "--checkpoint-every", "20"]
    for dtype in ("bfloat16", "fp8"):
        code, log = run_drafter(*short, "--out", str(tmp_path / dtype), "--save-dtype", dtype)
        assert code == 0, log
    ckpt = read_dflash_dir(tmp_path / "fp8")
    assert ckpt.block == (128, 128) and sorted(ckpt.scales) == sorted(
        n for n, s in tensor_shapes(ckpt.config).items() if len(s) == 2)
    fp8_bytes, bf16_bytes = ((tmp_path / d / "model.safetensors").stat().st_size for d in ("fp8", "bfloat16"))
    assert fp8_bytes < 0.6 * bf16_bytes
    fp8, bf16 = (load_tensors(read_dflash_dir(tmp_path / d), "cpu", torch.float32) for d in ("fp8", "bfloat16"))
    for name, tensor in bf16.items():  # the same run (same seed): e4m3's rounding apart
        assert (fp8[name] - tensor).abs().max() <= tensor.abs().max() / 8, name
    from engine.loaders.loading import load_model

    model_ckpt = load_model(target)
    prompt = Tokenizer.load(target).encode("class Config:\n    def __init__(self")
    cfg = DecodeConfig(budget=16, block_size=DRAFTER_PRESETS["tiny"].block_size, max_new_tokens=24)
    ar = decode(model_ckpt, prompt, cfg, "ar")
    tree = decode(model_ckpt, prompt, cfg, "ddtree", DrafterSpec("dflash", model=str(tmp_path / "fp8")))
    assert_greedy_equal(ar.tokens, ar.logits, tree.tokens)


@pytest.mark.parametrize("argv, message", [
    (["--target", "/no/such/target"], "not a directory"),
    (["--steps", "0"], "steps=0"),
    (["--anchors", "500"], "new_tokens"),
    (["--resume"], "no checkpoint"),
])
def test_bad_options_fail_clearly(tiny_target_run, tmp_path, argv, message):
    target, _ = tiny_target_run
    base = ["--out", str(tmp_path / "d"), "--device", "cpu"]
    if "--target" not in argv:
        base += ["--target", str(target)]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["train-drafter", *base, *argv])
    assert code == 2 and message in err.getvalue()
    assert not (tmp_path / "d").exists(), "nothing written"


def new_text_steps(run) -> list[bool]:
    """Per step, whether it is on new text, counted the slow way: the 4-gram of the 3 tokens before it and the
    token of its depth-1, rank-0 node is not among the 4-grams of the last 32 tokens before it."""
    context, out = [*run.prompt, run.first_token], []
    for step in run.steps:
        tree = step.tree
        first = [t for t, p, d, r in zip(tree.tokens, tree.parents, tree.depths, tree.ranks, strict=True)
                 if (p, d, r) == (0, 1, 0)]
        window = context[-32:]
        seen = {tuple(window[i:i + 4]) for i in range(len(window) - 3)}
        out.append(not first or len(context) < 3 or (*context[-3:], first[0]) not in seen)
        context += step.committed
    return out


def test_the_pair_benchmark_runs_on_the_trained_pair(tiny_drafter, tmp_path, capsys, monkeypatch):
    from benchmarks import bench_pair

    target, drafter, _ = tiny_drafter
    measured, measure = [], bench_pair.measure  # every row's run records, to recompute its columns from
    monkeypatch.setattr(bench_pair, "measure", lambda *args: measured.append(measure(*args)) or measured[-1])
    assert bench_pair.main(["--model", str(target), "--drafter", str(drafter), "--quick", "--device", "cpu",
                            "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "pair-cpu.json").read_text())
    rows = result["rows"]
    assert [(r["prompts"], r["mode"], r["temperature"]) for r in rows] == [
        *(("held-out", m, t) for m, t in (("AR", 0), ("chain", 0), ("DDTree", 0), ("DDTree", 0), ("AR", 0.8),
                                          ("chain", 0.8), ("DDTree", 0.8))),
        ("written", "AR", 0), ("written", "chain", 0), ("written", "DDTree", 0)]
    assert all(r["exact"] == "4/4" for r in rows[:7]), "== AR, token-exact at T = 0.8 too"
    assert all(r["exact"] == "2/2" for r in rows[7:]), "the first two written prompts under --quick"
    assert result["written_distinct_4gram_rate"] == rows[7]["distinct_4gram_rate"] and "written" in out
    assert [r["budget"] for r in rows if r["mode"] == "DDTree"] == [16, "auto:16", 16, 16] and "auto (auto:16):" in out
    auto = rows[3]  # its timed decodes' own choices and tau, beside the recorded runs'
    assert auto["timed_tau"] >= 1 and sum(int(c.split(":")[1]) for c in auto["timed_chosen"].split()) >= 4
    assert 0 < result["distinct_4gram_rate"] <= 1 and "tau / chain" in out and "tau on new text" in out
    tree = rows[2]
    assert tree["tau"] >= rows[1]["tau"] - 1e-9 and len(tree["per_position_acceptance"]) == 7
    assert all(r["real_divergences"] == 0 for r in rows)
    assert len(measured) == len(rows)
    assert [run.decode["seed"] for run in measured[6]["runs"]] == [0, 1, 2, 3], "prompt i under seed i"
    for row, m in zip(rows, measured, strict=True):
        runs = m["runs"]
        steps = [s for run in runs for s in run.steps]
        assert row["tau"] == pytest.approx(sum(len(s.committed) for s in steps) / len(steps)), "all over all"
        fresh = [s for run in runs for s, new in zip(run.steps, new_text_steps(run), strict=True) if new]
        assert row["new_text_steps"] == len(fresh) and row["new_text"].endswith(f"({len(fresh)} of {len(steps)})")
        if fresh:
            assert row["new_text_tau"] == pytest.approx(sum(len(s.committed) for s in fresh) / len(fresh))
        rates = [len({tuple(r.tokens[i:i + 4]) for i in range(len(r.tokens) - 3)}) / (len(r.tokens) - 3) for r in runs]
        assert row["distinct_4gram_rate"] == pytest.approx(sum(rates) / len(rates))
        if row["mode"] != "AR":
            assert row["tau"] == pytest.approx(1 + sum(row["per_position_acceptance"])), "pooled alike"
    assert rows[0]["distinct_4gram_rate"] == result["distinct_4gram_rate"]
    assert rows[6]["tau_over_chain"] == pytest.approx(rows[6]["tau"] / rows[5]["tau"]), "over the chain at T = 0.8"
    assert bench_pair.main(["--model", str(target), "--drafter", str(drafter), "--quick", "--device", "cpu",
                            "--batch-invariant", "--prompts", "2", "--out", str(tmp_path)]) == 0
    exact = json.loads((tmp_path / "pair-cpu.json").read_text())
    assert "batch-invariant" in exact["setup"] and all(r["exact"] == "2/2" for r in exact["rows"])
    saved = json.loads((target / "training.json").read_text())["saved_val_loss"]
    assert exact["saved_val_loss"] == saved and f"{saved:.3f} as saved" in exact["setup"]
    assert exact["measured_val_loss"] is None


def test_the_pair_benchmark_refuses_a_corpus_the_target_was_not_trained_on(tiny_drafter, small_corpus, tmp_path):
    """--corpus-dir measures the saved target's validation loss on its training's held-out windows, so another
    corpus stops the run, before any decode, with a message naming the corpus it was trained on."""
    from benchmarks import bench_pair

    target, drafter, _ = tiny_drafter
    with pytest.raises(SystemExit, match=r"--corpus-dir: .*held-out split is \d+ tokens.*the standard library"):
        bench_pair.main(["--model", str(target), "--drafter", str(drafter), "--quick", "--device", "cpu",
                         "--corpus-dir", str(small_corpus), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--corpus-dir: .*not a directory"):
        bench_pair.main(["--model", str(target), "--drafter", str(drafter), "--quick", "--device", "cpu",
                         "--corpus-dir", str(tmp_path / "missing"), "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_the_shipped_pair_fits_the_shipping_budget():
    """models/ in all (the pair, the fixture, the card) stays within 30 MiB; the pair is the showcase-22m presets'
    (the target's shape, the drafter's layers and block), both stored in DeepSeek-V3's FP8 layout, and the drafter
    reads the target's last layer."""
    from engine.loaders.shipped import DEFAULT_MODEL
    from engine.training.recipe import PRESETS

    total = sum(p.stat().st_size for p in DEFAULT_MODEL.parent.rglob("*") if p.is_file())
    assert total <= 30 * 2**20, f"{total / 2**20:.1f} MiB"
    target = json.loads((DEFAULT_MODEL / "config.json").read_text())
    drafter = json.loads((DEFAULT_MODEL / "dflash" / "config.json").read_text())
    recipe, drafter_recipe = PRESETS["showcase-22m"], DRAFTER_PRESETS["showcase-22m"]
    assert {k: target[k] for k in recipe.model} == recipe.model
    assert {k: drafter[k] for k in drafter_recipe.drafter} == drafter_recipe.drafter
    assert drafter["block_size"] == drafter_recipe.block_size
    assert drafter["dflash_config"]["target_layer_ids"] == list(drafter_recipe.target_layer_ids)
    assert drafter_recipe.target_layer_ids[-1] == target["num_hidden_layers"] - 1
    assert target["quantization_config"]["quant_method"] == drafter["quantization_config"]["quant_method"] == "fp8"
