"""The drafter's sampled training continuations: sample_generate against greedy_generate and against a
temperature's limit, the recipe's checks, and the split of a run's sequences into sampled and greedy ones."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from test_train_target import module_with_weights, variant_config

from engine.loaders.shipped import DEFAULT_MODEL
from engine.loaders.text import Tokenizer
from engine.training import drafter_data
from engine.training.drafter_recipe import DRAFTER_PRESETS
from engine.training.generate import greedy_generate, sample_generate
from engine.training.recipe import TrainError


def model_and_prompts(vocab: int | None = None, num: int = 6, length: int = 5):
    """A small target with the fixture generator's weights (vocab_size as given), random prompts and their seed."""
    seed = int(np.random.SeedSequence().entropy % 2**30)
    cfg = variant_config("qlora_dense1_groups")
    model = module_with_weights(dataclasses.replace(cfg, vocab_size=vocab) if vocab else cfg, seed)
    prompts = torch.from_numpy(np.random.default_rng(seed).integers(0, model.cfg.vocab_size, (num, length)))
    return model, prompts, seed


def test_a_sampled_continuation_follows_its_seed_and_leaves_greedy_text():
    model, prompts, seed = model_and_prompts()
    first = sample_generate(model, prompts, 12, temperature=0.8, seed=seed)
    assert torch.equal(first, sample_generate(model, prompts, 12, temperature=0.8, seed=seed)), "the same seed"
    assert first.shape == (6, 12) and first.dtype == torch.int64 and 0 <= int(first.min())
    assert int(first.max()) < model.cfg.vocab_size
    assert not torch.equal(first, greedy_generate(model, prompts, 12)), f"T = 0.8 samples (seed {seed})"
    assert not torch.equal(first, sample_generate(model, prompts, 12, temperature=0.8, seed=seed + 1))
    cold = sample_generate(model, prompts, 12, temperature=1e-6, seed=seed)
    assert torch.equal(cold, greedy_generate(model, prompts, 12)), "a temperature near 0 is the argmax"
    with pytest.raises(ValueError, match="temperature=0: expected a temperature > 0"):
        sample_generate(model, prompts, 12, temperature=0, seed=seed)


@pytest.mark.parametrize("field, value, message", [
    ("sampled_share", 1.5, r"sampled_share=1\.5: expected a share in \[0, 1\]"),
    ("sampled_share", -0.1, r"sampled_share=-0\.1: expected a share in \[0, 1\]"),
    ("sampled_temperature", 0.0, r"sampled_temperature=0\.0: expected a temperature > 0"),
])
def test_the_recipe_refuses_a_bad_share_or_temperature(field, value, message):
    with pytest.raises(TrainError, match=message):
        dataclasses.replace(DRAFTER_PRESETS["tiny"], **{field: value})


def test_a_runs_training_sequences_open_with_the_sampled_share_and_its_held_out_ones_stay_greedy():
    tokenizer = Tokenizer.load(DEFAULT_MODEL)
    model, _, seed = model_and_prompts(vocab=tokenizer.vocab_size)
    recipe = dataclasses.replace(DRAFTER_PRESETS["tiny"], num_sequences=8, eval_sequences=3, sampled_share=0.5,
                                 new_tokens=DRAFTER_PRESETS["tiny"].new_tokens, seed=seed % 1000)
    sequences = drafter_data.generate_sequences(model, tokenizer, recipe)
    train, held_out = sequences["train"], sequences["held_out"]
    p = recipe.prompt_len
    assert sequences["key"]["sampled_share"] == 0.5 and train.shape == (8, recipe.seq_len)
    greedy = greedy_generate(model, train[:, :p], recipe.new_tokens)
    assert torch.equal(train[4:, p:], greedy[4:]), "the rest greedy"
    assert torch.equal(train[:4, p:], sample_generate(model, train[:4, :p], recipe.new_tokens,
                                                      recipe.sampled_temperature, recipe.seed)), "the first 4 sampled"
    assert not torch.equal(train[:4, p:], greedy[:4])
    assert torch.equal(held_out[:, p:], greedy_generate(model, held_out[:, :p], recipe.new_tokens))
