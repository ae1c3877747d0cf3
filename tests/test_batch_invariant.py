"""The batch-invariant mode: every node on the accepted path has logits bit for bit equal to AR's at that
position, in float32 and bfloat16, so DDTree == AR exactly; and in the fast mode every divergence is classified
(numerics near tie or real) and a real one makes `run` and `verify` exit 1."""
from __future__ import annotations

import random

import numpy as np
import pytest
from fake_records import fake_runs
from test_decode import make_config

from cli import run as run_cli
from cli.__main__ import main
from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.model.batch_rows import ROW_BLOCK
from engine.model.fixtures import random_weights
from engine.model.layers import rowwise
from engine.model.target import TargetModel
from profiling.divergence import NEAR_TIE, REAL, classify, tolerance, verdict
from profiling.measurement import Measurement
from profiling.metrics import summarize


def random_model(seed: int, dtype: str) -> tuple[Checkpoint, TargetModel]:
    rng = random.Random(seed)
    cfg = make_config({"heads": rng.randint(1, 3), "kv_lora": 16, "rope": 8, "q_lora": rng.choice([None, 12]),
                       "layers": rng.randint(1, 3), "dense": rng.randint(0, 2), "experts": (4, 2, 1, 2),
                       "interleave": rng.random() < 0.5, "yarn": rng.random() < 0.5, "norm_topk": True})
    ckpt = Checkpoint(cfg, random_weights(cfg, seed), "random")
    return ckpt, TargetModel.from_checkpoint(ckpt, "cpu", dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_accepted_nodes_have_ar_logits_bit_for_bit(dtype):
    seed = random.randrange(2**31)
    ckpt, model = random_model(seed, dtype)
    rng = random.Random(seed)
    for _ in range(3):
        prompt = [rng.randrange(ckpt.config.vocab_size) for _ in range(rng.randint(1, 9))]
        cfg = DecodeConfig(budget=rng.choice([3, 17, 64, 200]), block_size=rng.randint(2, 12), max_new_tokens=16,
                           dtype=dtype, batch_invariant=True, temperature=rng.choice([0.0, 0.8]),
                           seed=rng.randrange(99))
        ar = decode(ckpt, prompt, cfg, "ar", model=model)
        for mode in ("ddtree", "chain"):
            run = decode(ckpt, prompt, cfg, mode, DrafterSpec(noise=rng.random(), seed=rng.randrange(99)), model=model)
            assert run.tokens == ar.tokens, (mode, seed)
            assert np.array_equal(run.logits, ar.logits), f"{mode}: the path's logits are AR's, bit for bit"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_long_prefixes_stay_bit_for_bit(tiny_checkpoint, dtype):
    """Prefixes past the CPU kernel's key blocks (64 rows): the exact kernel walks keys in position order for a
    tree node as for an AR row, so long contexts keep the path's logits AR's."""
    seed = random.randrange(2**31)
    rng = random.Random(seed)
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cpu", dtype)
    prompt = [rng.randrange(tiny_checkpoint.config.vocab_size) for _ in range(rng.randint(60, 130))]
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=48, dtype=dtype, batch_invariant=True)
    ar = decode(tiny_checkpoint, prompt, cfg, "ar", model=model)
    dd = decode(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=0.4, seed=rng.randrange(99)), model=model)
    assert dd.tokens == ar.tokens and np.array_equal(dd.logits, ar.logits), f"seed {seed}"


def test_the_bfloat16_case_that_diverged_in_the_fast_mode(tiny_checkpoint):
    prompt = [3, 14, 15, 92, 65, 35]
    base = DecodeConfig(budget=256, block_size=16, max_new_tokens=24, dtype="bfloat16")
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cpu", "bfloat16")
    spec = DrafterSpec(noise=0.5)
    for batch_invariant in (False, True):
        cfg = DecodeConfig(**{**base.to_dict(), "batch_invariant": batch_invariant})
        ar = decode(tiny_checkpoint, prompt, cfg, "ar", model=model)
        dd = decode(tiny_checkpoint, prompt, cfg, "ddtree", spec, model=model)
        div = summarize(ar, dd)["first_divergence"]
        if batch_invariant:
            assert div is None and np.array_equal(ar.logits, dd.logits)
        else:  # the fast mode parts from AR at a one-bfloat16-step near tie, and says so
            assert div is None or div["kind"] == NEAR_TIE, div


def test_rowwise_pads_and_keeps_rows():
    rng = np.random.default_rng()
    import torch

    x = torch.from_numpy(rng.normal(size=(int(rng.integers(1, 50)), 7))).float()
    double = rowwise(lambda t: (2 * t, t.sum(-1)), ROW_BLOCK, x)
    assert torch.equal(double[0], 2 * x) and torch.allclose(double[1], x.sum(-1))
    seen = []
    rowwise(lambda t: seen.append(t.shape[0]) or t, ROW_BLOCK, x)
    assert set(seen) == {ROW_BLOCK}, "every block has exactly ROW_BLOCK rows"


def test_divergences_are_classified_by_the_stated_rule():
    runs = fake_runs(random.randrange(2**31), max_new=12, diverge_at=5)
    ar, dd = runs["ar"], runs["ddtree"]
    row = ar.logits[5]
    best = float(row.max())
    tol = tolerance(ar.decode, abs(best))
    assert tol == pytest.approx(1e-5 * max(1.0, abs(best)))
    for gap, kind in ((tol / 2, NEAR_TIE), (tol * 2, REAL)):
        ar.logits[5, dd.tokens[5]] = best - gap
        assert classify(ar, 5, dd.tokens[5])[0] == kind
        s = summarize(ar, dd)
        assert s["first_divergence"]["kind"] == kind
        assert ("REAL DIVERGENCE" in verdict(s, "DDTree")) == (kind == REAL)
    ar.decode = {**ar.decode, "batch_invariant": True}
    ar.logits[5, dd.tokens[5]] = best - tol / 2
    assert classify(ar, 5, dd.tokens[5])[0] == REAL, "the exact mode forgives nothing"
    assert tolerance({"dtype": "bfloat16", "temperature": 0.5}, 8.0) == pytest.approx(2**-6 * 8 / 0.5)


def test_run_exits_1_on_a_real_divergence_and_says_so(monkeypatch, capsys):
    runs = fake_runs(random.randrange(2**31), max_new=12, diverge_at=4)
    runs["ar"].logits[4, runs["ddtree"].tokens[4]] = runs["ar"].logits[4].max() - 1.0
    monkeypatch.setattr(run_cli, "measure", lambda *a, **k: Measurement.of(runs))
    assert main(["run", "--max-new", "12"]) == 1
    out = capsys.readouterr().out
    assert "REAL DIVERGENCE" in out and "speedup measured over different outputs" in out


def test_the_cli_flag_reaches_the_decode(capsys):
    assert main(["verify", "--batch-invariant", "--dtype", "bfloat16", "--noise", "0.5", "--tree", "both"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("PASS model_ddtree CHAIN==AR and DDTREE==AR in")
