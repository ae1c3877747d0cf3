"""The dflash drafter in the engine: built from its spec against a target (refused where it cannot run, warned
where it runs but should accept less), weights shared across decoders, and DDTree and the chain with a random
DFlash drafter emitting exactly the AR tokens."""
from __future__ import annotations

import dataclasses
import os
import random

import numpy as np
import pytest
from dflash_dirs import ROPES, small_layout
from greedy import assert_greedy_equal, assert_sampled_equal

from engine.config import DecodeConfig
from engine.decoding.session import decode, make_decoder
from engine.drafters import DrafterSpec
from engine.loaders.dflash_config import DFlashLoadError
from engine.model.dflash_fixtures import make_dflash_dir
from engine.model.target import TargetModel


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def spec_for(path) -> DrafterSpec:
    return DrafterSpec("dflash", model=str(path))


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", 32, r"hidden_size=32, but the target's hidden_size is 64"),
    ("vocab_size", 600, r"vocab_size=600 is beyond the target's vocabulary of 512"),
    ("target_layer_ids", (0, 3), r"target_layer_ids=\[0, 3\] names layer\(s\) \[3\], but the target has layers 0..2"),
])
def test_a_drafter_that_does_not_fit_the_target_is_refused_naming_the_field(tiny, tmp_path, field, value, message):
    ckpt, model = tiny
    overrides = {field: value} | ({"num_target_layers": 4} if field == "target_layer_ids" else {})
    root = make_dflash_dir(tmp_path / "d", small_layout(ckpt.config, **overrides))
    with pytest.raises(DFlashLoadError, match=message):
        make_decoder(ckpt, ckpt.prompt.tolist(), DecodeConfig(), "ddtree", spec_for(root), model=model)


def test_another_block_size_or_target_depth_warns_and_still_decodes_exactly(tiny, tmp_path):
    ckpt, model = tiny
    root = make_dflash_dir(tmp_path / "d", small_layout(ckpt.config, block_size=8, num_target_layers=61))
    cfg = DecodeConfig(budget=16, block_size=5, max_new_tokens=12)
    with pytest.warns(UserWarning) as caught:
        run = decode(ckpt, ckpt.prompt.tolist(), cfg, "ddtree", spec_for(root), model=model)
    notes = " | ".join(str(w.message) for w in caught)
    assert "block_size 5 differs from the checkpoint's 8" in notes and "decode at block size 8 to match" in notes
    assert "num_target_layers=61, but the target has 3 layers" in notes
    assert run.tokens == decode(ckpt, ckpt.prompt.tolist(), cfg, "ar", model=model).tokens


def test_a_spec_without_a_directory_is_refused():
    with pytest.raises(ValueError, match=r"needs a checkpoint directory \(--drafter-model DIR\)"):
        DrafterSpec("dflash")
    with pytest.raises(ValueError, match="does not take noise"):
        DrafterSpec("dflash", model="x", noise=0.5)


def test_weights_load_once_per_checkpoint_and_decoders_keep_their_own_cache(tiny, tmp_path):
    ckpt, model = tiny
    layout = small_layout(ckpt.config)
    root = make_dflash_dir(tmp_path / "d", layout, seed=1)
    prompt = ckpt.prompt.tolist()
    first, second = (make_decoder(ckpt, prompt, DecodeConfig(block_size=8), "chain", spec_for(root), model=model)
                     for _ in range(2))
    assert first.drafter.model.w is second.drafter.model.w, "one load, shared"
    assert first.drafter.model.keys.data_ptr() != second.drafter.model.keys.data_ptr()
    first.step()
    assert int(first.drafter.model.length) > int(second.drafter.model.length)
    described = first.drafter.describe()
    assert described == {"name": "dflash", "model": str(root), "num_layers": 2, "block_size": 8,
                         "target_layer_ids": list(layout.target_layer_ids), "mask_token_id": layout.mask_token_id,
                         "hidden_size": 64}
    stat = (root / "model.safetensors").stat()
    replaced = make_dflash_dir(tmp_path / "other", layout, seed=2)
    os.replace(replaced / "model.safetensors", root / "model.safetensors")
    os.utime(root / "model.safetensors", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    third = make_decoder(ckpt, prompt, DecodeConfig(block_size=8), "chain", spec_for(root), model=model)
    assert third.drafter.model.w is not first.drafter.model.w, "a rewritten checkpoint loads again"
    assert not (third.drafter.model.w.fc == first.drafter.model.w.fc).all()


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_speculative_decodes_with_a_random_dflash_drafter_emit_the_ar_tokens(tiny, tmp_path, mode):
    ckpt, model = tiny
    for case in range(2):
        block_size = random.randint(2, 9)
        layout = small_layout(ckpt.config, random.choice(list(ROPES)), block_size=block_size)
        root = make_dflash_dir(tmp_path / f"d{case}", layout, seed=random.randrange(10**6))
        cfg = DecodeConfig(budget=random.choice([1, 7, 40, 200]), block_size=block_size, max_new_tokens=10)
        prompt = np.random.default_rng().integers(0, ckpt.config.vocab_size, random.randint(1, 10)).tolist()
        ar = decode(ckpt, prompt, cfg, "ar", model=model)
        run = decode(ckpt, prompt, cfg, mode, spec_for(root), model=model)
        assert_greedy_equal(ar.tokens, ar.logits, run.tokens)
        assert run.drafter["name"] == "dflash" and run.num_steps <= ar.num_steps


def test_sampled_and_batch_invariant_decodes_with_a_dflash_drafter_equal_ar(tiny, tmp_path):
    """At T > 0 every committed token is AR's sample at its position; in the batch-invariant mode the tokens are
    AR's bit for bit: the drafter only changes how many a step accepts."""
    ckpt, model = tiny
    root = make_dflash_dir(tmp_path / "d", small_layout(ckpt.config), seed=random.randrange(10**6))
    prompt = np.random.default_rng().integers(0, ckpt.config.vocab_size, random.randint(2, 8)).tolist()
    sampled = DecodeConfig(budget=24, block_size=8, max_new_tokens=10, temperature=0.8, top_k=40,
                           seed=random.randrange(1000))
    ar = decode(ckpt, prompt, sampled, "ar", model=model)
    for mode in ("chain", "ddtree"):
        assert_sampled_equal(ar, decode(ckpt, prompt, sampled, mode, spec_for(root), model=model).tokens, sampled)
    exact = DecodeConfig(budget=24, block_size=8, max_new_tokens=10, batch_invariant=True)
    ar = decode(ckpt, prompt, exact, "ar", model=model)
    assert decode(ckpt, prompt, exact, "ddtree", spec_for(root), model=model).tokens == ar.tokens


def test_the_fixture_prompt_decodes_its_golden_tokens_with_a_dflash_drafter(tiny, tmp_path):
    ckpt, model = tiny
    root = make_dflash_dir(tmp_path / "d", small_layout(ckpt.config))
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=12)
    for mode in ("chain", "ddtree"):
        assert decode(ckpt, ckpt.prompt.tolist(), cfg, mode, spec_for(root), model=model).tokens == \
            ckpt.golden_tokens.tolist()[:12]


def test_the_layout_helper_keeps_the_kimi_shape_ratios(tiny_checkpoint):
    cfg = small_layout(tiny_checkpoint.config)
    assert cfg.num_attention_heads // cfg.num_key_value_heads == 2 and cfg.block_size == 8
    assert dataclasses.replace(cfg, target_layer_ids=(0,)).num_context_features == cfg.hidden_size
