"""The drafter's data: the frozen target's own continuations of corpus prompts (train split for training,
held-out split for validation; greedy, and for recipe.sampled_share of the training sequences sampled at
recipe.sampled_temperature), generated once per run (before the run directory is touched) and
kept in it so that a resumed run trains on exactly the same sequences."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loaders.text import Tokenizer
from engine.training.corpus import draw_prompts, load_corpus
from engine.training.drafter_recipe import DrafterRecipe
from engine.training.generate import distinct_ngram_rate, generation_dtype, greedy_generate, sample_generate
from engine.training.recipe import TrainError
from engine.training.target_model import TargetLM

SEQUENCES_FILE = "sequences.pt"


def _generate(target: TargetLM, tokenizer: Tokenizer, recipe: DrafterRecipe, split: str, num: int) -> torch.Tensor:
    """num prompts of the split with the target's continuations: the first round(num x sampled_share) of a training
    split's sampled, the rest (and every held-out one) greedy."""
    corpus = load_corpus(recipe.corpus_dir)
    seed = recipe.seed if split == "train" else recipe.seed + 1
    prompts = torch.from_numpy(draw_prompts(corpus, tokenizer, num, recipe.prompt_len, seed, split,
                                            advice="use a --corpus-dir with more text, or fewer --num-sequences"))
    prompts = prompts.to(recipe.device)
    dtype = generation_dtype(recipe.device)
    num_sampled = round(num * recipe.sampled_share) if split == "train" else 0
    parts = []
    if num_sampled:
        parts.append(sample_generate(target, prompts[:num_sampled], recipe.new_tokens, recipe.sampled_temperature,
                                     recipe.seed, dtype=dtype))
    if num_sampled < num:
        parts.append(greedy_generate(target, prompts[num_sampled:], recipe.new_tokens, dtype=dtype))
    return torch.cat([prompts, torch.cat(parts)], dim=1)


def _key(recipe: DrafterRecipe) -> dict:
    return {"seed": recipe.seed, "num_sequences": recipe.num_sequences, "eval_sequences": recipe.eval_sequences,
            "prompt_len": recipe.prompt_len, "new_tokens": recipe.new_tokens, "corpus_dir": recipe.corpus_dir,
            "sampled_share": recipe.sampled_share, "sampled_temperature": recipe.sampled_temperature}


def generate_sequences(target: TargetLM, tokenizer: Tokenizer, recipe: DrafterRecipe) -> dict:
    """A fresh run's sequences, in memory: {"key", "train" [N, T], "held_out" [M, T]} int64 on the CPU,
    T = prompt_len + new_tokens. Reads the corpus, so a file that cannot be read stops the run here."""
    return {"key": _key(recipe),
            "train": _generate(target, tokenizer, recipe, "train", recipe.num_sequences).cpu(),
            "held_out": _generate(target, tokenizer, recipe, "held-out", recipe.eval_sequences).cpu()}


def save_sequences(run_dir: Path, sequences: dict) -> None:
    """sequences into the run directory (a temporary name, then renamed), for a resumed run to read back."""
    path = run_dir / SEQUENCES_FILE
    partial = path.with_suffix(".partial")
    torch.save(sequences, partial)
    partial.replace(path)


def load_sequences(run_dir: Path, recipe: DrafterRecipe) -> dict:
    """The sequences a paused run saved, checked against its recipe."""
    path = run_dir / SEQUENCES_FILE
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # missing, truncated or foreign: torch raises many types
        raise TrainError(f"{path}: not the run's readable sequences ({exc}); start over with --force") from exc
    if not isinstance(saved, dict) or saved.get("key") != _key(recipe) or not all(
            isinstance(saved.get(k), torch.Tensor) and saved[k].dim() == 2 and saved[k].shape[1] == recipe.seq_len
            for k in ("train", "held_out")):
        raise TrainError(f"{path} does not hold the sequences of this run's recipe; start over with --force")
    return saved


def sequence_tensors(sequences: dict, recipe: DrafterRecipe) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(train, held-out) on the recipe's device, and what training.json says about them."""
    train, held_out = sequences["train"], sequences["held_out"]
    info = {**sequences["key"], "train_tokens": train.numel(), "held_out_tokens": held_out.numel(),
            "continuation_distinct_4gram_rate": distinct_ngram_rate(held_out[:, recipe.prompt_len:], 4)}
    return train.to(recipe.device), held_out.to(recipe.device), info
