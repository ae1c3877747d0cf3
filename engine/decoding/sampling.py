"""The target's pick at every node: greedy at temperature 0, else a sample of softmax(logits / T) restricted by
top-k and top-p, drawn with Gumbel-max noise keyed by (seed, absolute position, token id).

Why keyed noise: the node at position p on the accepted path draws exactly the noise AR draws at p, so the
accepted path's picks are AR's picks whatever the drafter proposed, and DDTree == AR stays a token-exact test
at any temperature. The noise is a counter-based hash in int64 arithmetic (no generator state, no host sync),
so CPU and CUDA draw the same uniforms for the same seed.
"""
from __future__ import annotations

import torch

from engine.config import DecodeConfig

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # odd constants of the mixing rounds (the integer hash "lowbias32")
_MIX1, _MIX2 = 0x7FEB352D, 0x846CA68B


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), in int64 without overflow: the product is split at 16 bits."""
    low = (x & 0xFFFF) * c
    high = (((x >> 16) * c) & 0xFFFF) << 16
    return (low + high) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _MIX1)
    x = x ^ (x >> 15)
    x = _mul32(x, _MIX2)
    return x ^ (x >> 16)


def uniforms(seed: int, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [N, V] in (0, 1): one uniform per (seed, positions[n], token id), the same on every device."""
    dev = positions.device
    key = _hash32(torch.full((), seed & _MASK32, dtype=torch.int64, device=dev) ^ ((seed >> 32) & _MASK32))
    row = _hash32(_mul32(positions.to(torch.int64) & _MASK32, _GOLDEN) ^ key)  # [N]
    ids = torch.arange(vocab_size, dtype=torch.int64, device=dev)
    return bits_to_uniforms(_hash32(row[:, None] ^ _hash32(ids + key)[None, :]))  # [N, V]


def bits_to_uniforms(bits: torch.Tensor) -> torch.Tensor:
    """32-bit hashes -> float32 in (0, 1). 23 bits, so (k + 0.5) / 2**23 is exact in float32 and the largest
    stays below 1 (with 24 bits it rounds to 1.0, whose Gumbel noise is +inf: inf + -inf is NaN, and argmax
    would pick a token that top-k / top-p filtered out)."""
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def filtered_logits(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """logits / T with the tokens outside top-k and outside the top-p nucleus set to -inf (float32 [N, V])."""
    scaled = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < scaled.shape[-1]:
        kth = scaled.topk(cfg.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if cfg.top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)
        before = ordered.softmax(-1).cumsum(-1) - ordered.softmax(-1)  # mass of the better tokens
        drop = torch.zeros_like(scaled, dtype=torch.bool).scatter(-1, order, before >= cfg.top_p)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return scaled


def pick(logits: torch.Tensor, positions: torch.Tensor | None, cfg: DecodeConfig) -> torch.Tensor:
    """The target's token [N] for each row of logits [N, V]; positions [N] are the absolute positions of the
    tokens being chosen (the row's own position + 1), which key the sampling noise: None at temperature 0."""
    if cfg.temperature == 0.0:
        return logits.argmax(-1)
    if positions is None:
        raise ValueError(f"temperature {cfg.temperature} samples: pick needs the positions that key its noise")
    gumbel = -torch.log(-torch.log(uniforms(cfg.seed, positions, logits.shape[-1])))
    return (filtered_logits(logits, cfg) + gumbel).argmax(-1)


def probabilities(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """The target's distribution at each row [N, V] under cfg: a point mass on the argmax at temperature 0."""
    if cfg.temperature == 0.0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return filtered_logits(logits, cfg).softmax(-1)
