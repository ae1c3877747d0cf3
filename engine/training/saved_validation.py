"""The validation loss of a target directory as saved: its file's weights (FP8 or bf16 rounding included) over the
held-out windows its training validated on, where training.json's loss is that of the weights in training."""
from __future__ import annotations

import json
from pathlib import Path

from engine.training.corpus import load_corpus
from engine.training.data import eval_windows, token_stream
from engine.training.loop import held_out_loss
from engine.training.recipe import TrainError
from engine.training.run_dir import TRAINING_FILE
from engine.training.target_dir import load_frozen_target
from engine.training.trainer import autocast_for


def saved_validation_loss(directory: str | Path, corpus_dir: str | Path | None, device: str) -> float:
    """Nats/token of the directory's target over its training's held-out windows: corpus_dir's held-out split (None:
    the standard library's) tokenised with the directory's tokenizer, cut at training.json's seq_len and eval_windows,
    in float32 (bf16 autocast on CUDA, as training validates). A corpus whose held-out split has another token count
    than training.json records is not the one the target was trained on, and is refused."""
    directory = Path(directory)
    try:
        training = json.loads((directory / TRAINING_FILE).read_text())
        recipe, expected = training["recipe"], training["tokenizer"]["held_out_tokens"]
        seq_len, windows, batch_size = recipe["seq_len"], recipe["eval_windows"], recipe["batch_size"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainError(f"{directory / TRAINING_FILE}: not the record train-target writes ({e}); the validation loss "
                         "needs the run's recipe and held-out token count") from e
    model, tokenizer = load_frozen_target(directory, device)
    held_out = token_stream(load_corpus(corpus_dir), tokenizer, "held-out")
    if held_out.numel() != expected:
        trained_on = recipe.get("corpus_dir") or "the standard library (no --corpus-dir)"
        raise TrainError(f"{corpus_dir or 'the standard library'}: its held-out split is {held_out.numel()} tokens "
                         f"with {directory.name}'s tokenizer, where its training validated on {expected}; pass the "
                         f"corpus it was trained on (training.json: {trained_on})")
    held_out_windows = eval_windows(held_out, seq_len, windows).to(device)
    return held_out_loss(model, held_out_windows, batch_size, autocast_for(device))
