"""Drafter health (profiling/drafter_health.py, `python -m engine drafter-check`): each check on crafted cases (a
shifted layer list, a zeroed mask row, RoPE tables that do not follow the config, an ambiguous YaRN amplitude,
another block size or target depth) and the command's output and exit status."""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
from dflash_dirs import small_layout

from cli.__main__ import main
from engine.config import DecodeConfig
from engine.loaders.dflash_config import DFlashLoadError
from engine.model.dflash_fixtures import make_dflash_dir
from engine.model.rope import cos_sin
from engine.model.target import TargetModel
from profiling.drafter_health import (
    OK,
    WARN,
    block_check,
    check_drafter,
    depth_check,
    layer_verdict,
    mask_check,
    rope_check,
)

DECODE = DecodeConfig(budget=48, block_size=8, max_new_tokens=10)


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def by_name(checks):
    return {c.name: c for c in checks}


@pytest.mark.parametrize("taus, verdict, blamed", [
    ({0: 3.0, -1: 2.9, 1: 3.5}, WARN, "ids +1 accept more"),
    ({0: 3.0, -1: 3.4, 1: None}, WARN, "ids -1 accept more"),
    ({0: 3.0, -1: None, 1: 3.05}, OK, None),  # within the margin
    ({0: 2.0, -1: 1.5, 1: 2.0}, OK, None),
])
def test_the_layer_verdict_warns_when_a_shifted_list_accepts_more(taus, verdict, blamed):
    check = layer_verdict((1, 12, 24), taus)
    assert check.verdict == verdict and "vLLM #42704" in check.rule
    assert (blamed in check.found) if blamed else "off by one" not in check.found
    assert "with [1, 12, 24]" in check.found and ("n/a with ids" in check.found) == (None in taus.values())


def test_the_shifted_variants_decode_with_the_shifted_layers(tiny, tmp_path):
    """Two checkpoints with the same weights, one listing the target layers one lower: each one's shifted
    measurement is the other's configured one."""
    ckpt, model = tiny
    prompt = ckpt.prompt.tolist()
    layout = small_layout(ckpt.config, "plain", target_layer_ids=(1,))
    seed = random.randrange(10**6)
    right = make_dflash_dir(tmp_path / "right", layout, seed=seed)
    low = make_dflash_dir(tmp_path / "low", dataclasses.replace(layout, target_layer_ids=(0,)), seed=seed)
    right_tau = by_name(check_drafter(model, prompt, DECODE, str(right)))["target layers"].values["tau"]
    low_tau = by_name(check_drafter(model, prompt, DECODE, str(low)))["target layers"].values["tau"]
    assert low_tau["1"] == right_tau["0"] and right_tau["-1"] == low_tau["0"]
    assert low_tau["-1"] is None  # layer -1 is not a target layer
    assert all(1 <= t <= DECODE.block_size for t in (*right_tau.values(), low_tau["0"], low_tau["1"]))


def test_a_zeroed_mask_row_warns_and_a_trained_looking_one_is_ok(tiny):
    ckpt, model = tiny
    cfg = small_layout(ckpt.config)
    check = mask_check(cfg, model.embed)
    assert check.verdict == OK and 0.5 < check.values["ratio"] < 2  # a random row is an ordinary row
    zeroed = model.embed.clone()
    zeroed[cfg.mask_token_id] = 0
    check = mask_check(cfg, zeroed)
    assert check.verdict == WARN and check.values["ratio"] == 0 and "SGLang #27924" in check.rule
    zeroed[cfg.mask_token_id] = 0.05 * model.embed[cfg.mask_token_id]  # a faint row is near zero too
    norms = zeroed.norm(dim=1)
    faint = mask_check(cfg, zeroed)
    assert faint.verdict == WARN and faint.values["ratio"] == pytest.approx(float(norms[cfg.mask_token_id] /
                                                                                  norms.median()))


def test_rope_tables_that_do_not_follow_the_config_warn(tiny_checkpoint):
    cfg = small_layout(tiny_checkpoint.config, "yarn-factor")
    cos, sin = cos_sin(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, 4, "cpu")
    good = rope_check(cfg, cos, sin, 2.0, None)
    assert good.verdict == OK and good.values["tables_match"]
    assert good.values["amplitude"] == pytest.approx(0.1 * math.log(4.0) + 1)  # mscale(factor) of plain YaRN
    for wrong in (cos_sin(cfg.head_dim, 2 * cfg.rope_theta, cfg.rope_scaling, 4, "cpu"),  # another base
                  cos_sin(cfg.head_dim, cfg.rope_theta, None, 4, "cpu")):  # YaRN dropped: amplitude 1
        check = rope_check(cfg, *wrong, 2.0, None)
        assert check.verdict == WARN and not check.values["tables_match"] and "the config implies" in check.found


def test_an_ambiguous_yarn_amplitude_warns_with_tau_under_both_rules(tiny, tmp_path):
    ckpt, model = tiny
    layout = small_layout(ckpt.config, "kimi-yarn", target_layer_ids=(0, 1, 2))  # both shifts leave the target
    root = make_dflash_dir(tmp_path / "kimi", layout)
    checks = by_name(check_drafter(model, ckpt.prompt.tolist(), DECODE, str(root)))
    rope = checks["RoPE"]
    assert rope.verdict == WARN and rope.values["tables_match"]
    assert rope.values["amplitude"] == pytest.approx(1.0)  # transformers: mscale / mscale_all_dim = 1 / 1
    assert rope.values["legacy_amplitude"] == pytest.approx(0.1 * math.log(64) + 1)
    assert 1 <= rope.values["legacy_tau"] <= DECODE.block_size and "vLLM #56446" in rope.rule
    pinned = dataclasses.replace(layout, rope_scaling={**layout.rope_scaling, "attention_factor": 1.0})
    cos, sin = cos_sin(pinned.head_dim, pinned.rope_theta, pinned.rope_scaling, 4, "cpu")
    assert rope_check(pinned, cos, sin, 2.0, None).verdict == OK, "an explicit attention_factor settles it"
    assert checks["target layers"].verdict == OK and checks["mask embedding"].verdict == OK


def test_block_size_and_depth_checks(tiny_checkpoint):
    cfg = small_layout(tiny_checkpoint.config)
    assert block_check(cfg, 8).verdict == OK
    other = block_check(cfg, 5)
    assert other.verdict == WARN and "block_size 5 differs from the checkpoint's 8" in other.found
    assert depth_check(cfg, 3).verdict == OK
    assert depth_check(dataclasses.replace(cfg, num_target_layers=61), 3).verdict == WARN


def test_the_command_prints_every_check_and_exits_by_the_verdicts(tiny_checkpoint, tmp_path, capsys):
    cfg = small_layout(tiny_checkpoint.config, "plain", target_layer_ids=(0, 1, 2))
    root = make_dflash_dir(tmp_path / "d", cfg)
    base = ["drafter-check", "--fixture", "models/model_tiny.kdtr", "--drafter-model", str(root), "--max-new", "8"]
    assert main([*base, "--tree", "chain"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"drafter-check: {root} on model_tiny.kdtr, chain, block size 8, 8 tokens")
    verdicts = [line.split()[0] for line in out[1:-1:2]]
    assert verdicts == ["ok"] * 5 and out[-1] == "all 5 checks ok"
    assert main([*base, "--block-size", "4"]) == 1
    out = capsys.readouterr().out
    assert "warn  block size" in out and out.rstrip().endswith("1 of 5 checks warn")
    wide = make_dflash_dir(tmp_path / "wide", small_layout(tiny_checkpoint.config, hidden_size=32))
    assert main([*base[:4], str(wide)]) == 2
    assert "hidden_size=32, but the target's hidden_size is 64" in capsys.readouterr().err


def test_a_drafter_that_cannot_run_is_refused_before_any_decode(tiny, tmp_path):
    ckpt, model = tiny
    root = make_dflash_dir(tmp_path / "d", small_layout(ckpt.config, vocab_size=1000))
    with pytest.raises(DFlashLoadError, match="vocab_size=1000 is beyond"):
        check_drafter(model, ckpt.prompt.tolist(), DECODE, str(root))
