"""The drafter's data: the frozen target, and its own greedy continuations of corpus prompts (train split for
training, held-out split for validation), generated once per run and kept in the run directory so that a
resumed run trains on exactly the same sequences."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loaders.hf_import import read_hf_dir
from engine.loaders.text import Tokenizer
from engine.training.corpus import draw_prompts, load_corpus
from engine.training.drafter_recipe import DrafterRecipe
from engine.training.generate import distinct_ngram_rate, greedy_generate
from engine.training.recipe import TrainError
from engine.training.target_model import TargetLM

SEQUENCES_FILE = "sequences.pt"


def load_frozen_target(directory: str | Path, device: str) -> tuple[TargetLM, Tokenizer]:
    """The target train-target wrote (config.json, model.safetensors, tokenizer.json) as a frozen TargetLM."""
    ckpt = read_hf_dir(directory)
    tokenizer = Tokenizer.load(directory)
    if tokenizer.vocab_size != ckpt.config.vocab_size:
        raise TrainError(f"{directory}: tokenizer.json has {tokenizer.vocab_size} tokens but config.json "
                         f"vocab_size={ckpt.config.vocab_size}; the two do not belong together")
    model = TargetLM(ckpt.config)
    state = model.state_dict()
    state.update(dict(ckpt.weights.tensors(device, torch.float32)))
    model.load_state_dict(state)
    model.requires_grad_(False)
    return model.to(device).eval(), tokenizer


def _generate(target: TargetLM, tokenizer: Tokenizer, recipe: DrafterRecipe, split: str, num: int) -> torch.Tensor:
    corpus = load_corpus(recipe.corpus_dir)
    seed = recipe.seed if split == "train" else recipe.seed + 1
    prompts = torch.from_numpy(draw_prompts(corpus, tokenizer, num, recipe.prompt_len, seed, split))
    prompts = prompts.to(recipe.device)
    dtype = "bfloat16" if recipe.device == "cuda" else "float32"
    return torch.cat([prompts, greedy_generate(target, prompts, recipe.new_tokens, dtype=dtype)], dim=1)


def make_sequences(target: TargetLM, tokenizer: Tokenizer, recipe: DrafterRecipe,
                   run_dir: Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train [N, T], held-out [M, T]) int64 on the recipe's device, T = prompt_len + new_tokens, and what
    training.json says about them. Generated on the first call of a run, read back on a resume."""
    path = run_dir / SEQUENCES_FILE
    key = {"seed": recipe.seed, "num_sequences": recipe.num_sequences, "eval_sequences": recipe.eval_sequences,
           "prompt_len": recipe.prompt_len, "new_tokens": recipe.new_tokens, "corpus_dir": recipe.corpus_dir}
    if path.is_file():
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if saved["key"] != key:
            raise TrainError(f"{path} holds sequences of another recipe ({saved['key']}); start over with --force")
        train, held_out = saved["train"], saved["held_out"]
    else:
        train = _generate(target, tokenizer, recipe, "train", recipe.num_sequences).cpu()
        held_out = _generate(target, tokenizer, recipe, "held-out", recipe.eval_sequences).cpu()
        partial = path.with_suffix(".partial")
        torch.save({"key": key, "train": train, "held_out": held_out}, partial)
        partial.replace(path)
    info = {**key, "train_tokens": train.numel(), "held_out_tokens": held_out.numel(),
            "continuation_distinct_4gram_rate": distinct_ngram_rate(held_out[:, recipe.prompt_len:], 4)}
    return train.to(recipe.device), held_out.to(recipe.device), info
