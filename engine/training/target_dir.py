"""A target directory train-target wrote (config.json, model.safetensors, tokenizer.json) read back as a TargetLM:
frozen, for the drafter's training and the end-of-run sample, or as the starting weights of another run."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.loaders.hf_import import read_hf_dir
from engine.loaders.text import Tokenizer
from engine.training.recipe import TrainError
from engine.training.target_model import TargetLM


def load_target(directory: str | Path, device: str, dropout: float = 0.0) -> tuple[TargetLM, Tokenizer]:
    """The directory's target (weights in float32, FP8 ones dequantized) and tokenizer, trainable."""
    ckpt = read_hf_dir(directory)
    tokenizer = Tokenizer.load(directory)
    if tokenizer.vocab_size != ckpt.config.vocab_size:
        raise TrainError(f"{directory}: tokenizer.json has {tokenizer.vocab_size} tokens but config.json "
                         f"vocab_size={ckpt.config.vocab_size}; the two do not belong together")
    model = TargetLM(ckpt.config, dropout=dropout)
    state = model.state_dict()
    state.update(dict(ckpt.weights.tensors(device, torch.float32)))
    model.load_state_dict(state)
    return model.to(device), tokenizer


def load_frozen_target(directory: str | Path, device: str) -> tuple[TargetLM, Tokenizer]:
    """As load_target, with no gradients and in eval mode."""
    model, tokenizer = load_target(directory, device)
    model.requires_grad_(False)
    return model.eval(), tokenizer
