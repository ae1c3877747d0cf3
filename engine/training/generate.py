"""Batched generation with TargetLM: the target's own continuations of many prompts at once (the drafter's training
data), greedy or sampled at a temperature under a seed, through an incremental cache of expanded per-head K/V whose
one-token steps replay a captured CUDA graph on a GPU."""
from __future__ import annotations

import contextlib

import torch

from engine.training.ngrams import distinct_ngram_rate as distinct_ngram_rate  # its callers import it from here
from engine.training.target_model import KVCache, TargetLM
from kernels.graph_capture import capture

AUTOCAST_DTYPES = {"float32": None, "bfloat16": torch.bfloat16}


def generation_dtype(device: str) -> str:
    """The dtype the training code generates in on a device: bf16 autocast on CUDA, as it trains; float32 elsewhere."""
    return "bfloat16" if device == "cuda" else "float32"


def greedy_generate(model: TargetLM, prompts: torch.Tensor, num_new: int, batch_size: int = 1024,
                    dtype: str = "float32") -> torch.Tensor:
    """prompts [N, P] int64 on the model's device -> the greedy continuation [N, num_new] int64: token j is the
    argmax (lowest id on ties) after the prompt and tokens 0..j-1. Prompts run batch_size at a time; dtype
    "bfloat16" runs the matmuls under bf16 autocast (the weights stay as they are)."""
    return _continuations(model, prompts, num_new, batch_size, dtype, _argmax)


def sample_generate(model: TargetLM, prompts: torch.Tensor, num_new: int, temperature: float, seed: int,
                    batch_size: int = 1024, dtype: str = "float32") -> torch.Tensor:
    """As greedy_generate, but token j is drawn from softmax(logits / temperature) under a generator seeded with
    seed: the same seed, prompts and device give the same tokens."""
    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise ValueError(f"temperature={temperature!r}: expected a temperature > 0 (0 is greedy_generate)")
    return _continuations(model, prompts, num_new, batch_size, dtype, _sampler(temperature, seed, prompts.device))


@torch.no_grad()
def _continuations(model: TargetLM, prompts: torch.Tensor, num_new: int, batch_size: int, dtype: str,
                   pick) -> torch.Tensor:
    if prompts.dim() != 2 or prompts.shape[1] < 1:
        raise ValueError(f"prompts must be [N, P] with P >= 1, got shape {tuple(prompts.shape)}")
    if num_new < 1:
        raise ValueError(f"num_new={num_new}: expected at least 1 token to generate")
    total = prompts.shape[1] + num_new - 1
    if total > model.cfg.max_position_embeddings:
        raise ValueError(f"a prompt of {prompts.shape[1]} tokens + {num_new} new tokens needs {total} positions; "
                         f"the model has max_position_embeddings={model.cfg.max_position_embeddings}")
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype={dtype!r}: expected one of {tuple(AUTOCAST_DTYPES)}")
    # no cast cache: a graph capture must not reuse casts made outside it
    autocast = (torch.autocast(device_type=prompts.device.type, dtype=AUTOCAST_DTYPES[dtype], cache_enabled=False)
                if AUTOCAST_DTYPES[dtype] else contextlib.nullcontext())
    was_training = model.training
    model.eval()
    try:
        with autocast:
            return torch.cat([_generate(model, chunk, num_new, total, pick) for chunk in prompts.split(batch_size)])
    finally:
        model.train(was_training)


def _argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(-1)


def _sampler(temperature: float, seed: int, device: torch.device):
    generator = torch.Generator(device=device).manual_seed(seed)

    def pick(logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator)[:, 0]

    return pick


def _generate(model: TargetLM, prompts: torch.Tensor, num_new: int, capacity: int, pick) -> torch.Tensor:
    """The prompts' prefill, then num_new - 1 one-token steps, each at a position tensor through the cache
    (KVCache): the same shapes every step, so on CUDA one captured graph replays them, where eager steps were bound
    by launching hundreds of small kernels a token. pick runs after each step, outside the graph."""
    cache = KVCache(model.cfg.num_hidden_layers, capacity)
    out = torch.empty(prompts.shape[0], num_new, dtype=torch.int64, device=prompts.device)
    out[:, 0] = pick(model(prompts, logits_from=-1, cache=cache).logits[:, -1])
    token = out[:, :1].clone()  # [B, 1]: the step's input, and position its place, both updated in place
    position = torch.full((1,), prompts.shape[1], dtype=torch.int64, device=prompts.device)

    def step() -> torch.Tensor:
        return model(token, logits_from=-1, cache=cache, start=position).logits[:, -1]

    step_logits = _captured(step) if prompts.device.type == "cuda" and num_new > 1 else step
    for j in range(1, num_new):
        out[:, j] = pick(step_logits())
        token.copy_(out[:, j:j + 1])
        position += 1
    return out


def _captured(step):
    """step captured in a CUDA graph, after a warm-up run on a side stream (which writes the cache row the first
    replay writes again, with the same values): returns a function that replays it and gives its output.

    Both run with torch's deterministic mode off (train-target turns it on): its sort-based index writes cannot be
    captured, and the step's writes (the cache row, the routing's scatter) hit each element once, so the default
    kernels give the same values every run anyway."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)
    try:
        graph, logits = capture(step, step)
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)

    def replay() -> torch.Tensor:
        graph.replay()
        return logits

    return replay
