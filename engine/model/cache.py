"""The latent KV cache of absorbed MLA: per token and layer, c (kv_lora_rank) and rope(k_pe) (qk_rope_head_dim),
and the RoPE tables of the positions the decode can reach.

prefix_len is a 0-dim device tensor, so a whole decode step (write rows, verify, compact, advance) runs
without reading it on the host.
"""
from __future__ import annotations

import torch

from kernels import ops


class LatentCache:
    def __init__(self, num_layers: int, capacity: int, kv_lora_rank: int, rope_dim: int,
                 device: torch.device | str, dtype: torch.dtype, rope: tuple[torch.Tensor, torch.Tensor]) -> None:
        self.capacity = capacity
        # cos and sin [2, positions, P/2], stacked so that a forward's rows of both are one gather
        self.rope = torch.stack(rope)
        self.cos, self.sin = self.rope  # [positions, P/2] each
        self.ckv = torch.zeros(num_layers, capacity, kv_lora_rank, device=device, dtype=dtype)  # [layers, S, R]
        self.kpe = torch.zeros(num_layers, capacity, rope_dim, device=device, dtype=dtype)  # [layers, S, P]
        self.prefix_len = torch.zeros((), dtype=torch.int64, device=device)  # rows holding committed tokens
        self.offsets = torch.arange(capacity, device=device)  # a block's row offsets, made once

    def block_rows(self, num_nodes: int) -> torch.Tensor:
        """The rows a block of num_nodes writes: prefix_len, prefix_len + 1, ... (node i -> row prefix_len + i);
        computed once a forward, for every layer's write."""
        return self.prefix_len + self.offsets[:num_nodes]

    def write(self, layer: int, rows: torch.Tensor, c: torch.Tensor, k_pe: torch.Tensor) -> None:
        """Write a block's c and k_pe rows into layer's cache at rows (block_rows)."""
        self.ckv[layer].index_copy_(0, rows, c.to(self.ckv.dtype))
        self.kpe[layer].index_copy_(0, rows, k_pe.to(self.kpe.dtype))

    def compact(self, path: torch.Tensor) -> None:
        """Move the accepted nodes' rows into place (path order), past the committed prefix; the step's commit then
        extends the prefix by them (ops.commit_path). A path of one node (AR's root) is in place already: no launch."""
        if path.shape[0] > 1:
            ops.kv_compact(self.ckv, self.kpe, self.prefix_len, path)

    def reset(self) -> None:
        self.prefix_len.zero_()
