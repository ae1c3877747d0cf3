"""The DFlash forward in torch, on the target's device and dtype, with the drafter's own context K/V cache.

Context: the target's hidden states of the chosen layers, concatenated -> fc -> hidden_norm; each draft layer
applies its own k_proj / v_proj (k_norm, then RoPE at the token's position) and keeps the result in the cache.
Block: [root, MASK x L] embedded with the target's embedding, at positions n .. n + L (n = context rows). Per
layer: RMSNorm; queries from the block only (q_norm, RoPE); keys and values are the cached context rows joined
with the block's own, through the same projections; no mask (the block sees every valid context row and itself
both ways); GQA; SwiGLU MLP; residuals. Output: the block's last L rows -> the drafter's norm -> the target's
lm_head -> float32 log-softmax [L, V].

Everything runs on device tensors with static shapes: the cache has a fixed capacity, the number of valid rows
is a 0-dim device tensor, and the attention (kernels/ops.py cache_attn) reads the rows before it alone. No method
reads a device value on the host, so a decode step with this drafter captures as one CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import LAYER_TENSORS
from engine.model.dflash_layers import QK_NORM, cached_draft_layer, context_features, fused_layer, head_norms
from engine.model.layers import fused_rows, rms_norm
from engine.model.rope import cos_sin
from kernels import ops


@dataclass(frozen=True, slots=True)
class DFlashWeights:
    """The drafter's tensors on one device and dtype (read-only: decoders share them)."""

    fc: torch.Tensor  # [d, len(target_layer_ids) * d]
    hidden_norm: torch.Tensor  # [d]
    norm: torch.Tensor  # [d]
    layers: tuple[dict[str, torch.Tensor], ...]  # per draft layer: its tensors as fused_layer makes them, and QK_NORM
    context_kv: torch.Tensor  # [2 layers Hkv D, d]: every layer's k_proj rows, then every layer's v_proj rows
    context_k_norm: torch.Tensor  # [layers Hkv, D]: each layer's k_norm, once per key head

    @classmethod
    def from_tensors(cls, cfg: DFlashConfig, tensors: dict[str, torch.Tensor]) -> DFlashWeights:
        """The checkpoint's tensors, fused once: a layer's q/k/v and gate/up (fused_layer) and its query and key
        norms (head_norms); the k and v projections of every layer stacked (the context update runs them all as one
        matmul: the same context features go into each). The stack is a second copy of those rows, kept beside the
        layers' own q/k/v stacks: 176 MB at Kimi-K2.5-DFlash's widths, 2.7% of the drafter; a step reads one of the
        two."""
        layers = []
        for i in range(cfg.num_hidden_layers):
            layer = fused_layer({name: tensors[f"layers.{i}.{name}"] for name, _ in LAYER_TENSORS})
            layers.append({**layer, QK_NORM: head_norms(cfg, layer)})
        kv_rows = [tensors[f"layers.{i}.self_attn.{part}_proj.weight"] for part in "kv"
                   for i in range(cfg.num_hidden_layers)]
        k_norms = [layer[QK_NORM][cfg.num_attention_heads:] for layer in layers]
        return cls(tensors["fc.weight"], tensors["hidden_norm.weight"], tensors["norm.weight"], tuple(layers),
                   fused_rows(*kv_rows), torch.cat(k_norms))

    @property
    def device(self) -> torch.device:
        return self.fc.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype


class DFlashModel:
    """One decode's drafter: shared weights, the target's embedding and lm_head, and a context cache of
    `capacity` rows (row i holds the context token at position i)."""

    def __init__(self, cfg: DFlashConfig, weights: DFlashWeights, embed: torch.Tensor, lm_head: torch.Tensor,
                 num_draft_positions: int, capacity: int) -> None:
        self.cfg, self.w = cfg, weights
        self.embed, self.lm_head = embed, lm_head  # the target's [V, d]
        dev, dtype = weights.device, weights.dtype
        self.num_draft_positions = num_draft_positions  # L
        shape = (cfg.num_hidden_layers, capacity, cfg.num_key_value_heads, cfg.head_dim)
        self.keys = torch.zeros(shape, device=dev, dtype=dtype)  # [layers, S, Hkv, D], k_norm and RoPE applied
        self.values = torch.zeros(shape, device=dev, dtype=dtype)  # [layers, S, Hkv, D]
        self.length = torch.zeros((), dtype=torch.int64, device=dev)  # valid context rows
        self.block = torch.arange(num_draft_positions + 1, device=dev)  # offsets of the block's rows, made once
        self.mask_tokens = torch.full((num_draft_positions,), cfg.mask_token_id, dtype=torch.int64, device=dev)
        # cos and sin [2, positions, D/2] of positions 0 .. capacity + L (the block may sit past the last context
        # row), stacked so that a call's rows of both are one gather
        self.rope = torch.stack(cos_sin(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling,
                                        capacity + num_draft_positions + 1, dev))
        self.scale = cfg.head_dim ** -0.5

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def write_context(self, hidden: torch.Tensor, start: torch.Tensor | int) -> None:
        """hidden [n, len(target_layer_ids) * d], the target's states of n tokens -> cache rows start .. start+n-1
        (their positions) of every layer: fc, hidden_norm, then one matmul for every layer's keys and values and one
        context_write of them all (the keys normed and turned). Does not move the valid length."""
        cfg, w = self.cfg, self.w
        ctx = context_features(cfg, w.fc, w.hidden_norm, hidden)
        kv = F.linear(ctx, w.context_kv)  # [n, 2 layers Hkv D]
        start = start if isinstance(start, torch.Tensor) else torch.tensor(start, device=kv.device)
        ops.context_write(kv, w.context_k_norm, self.rope, start, cfg.rms_norm_eps, self.keys, self.values)

    def block_logprobs(self, root: torch.Tensor) -> torch.Tensor:
        """float32 log-probabilities [L, V] of the L tokens after root (0-dim int64), against the valid context
        rows. The block's own keys and values go to the cache rows at its positions, past the valid ones (the
        capacity holds them: engine/drafters/dflash.py context_capacity), where the next commit's context rewrites
        them; the valid length does not move."""
        cfg, w = self.cfg, self.w
        x = self.embed[torch.cat([root.view(1), self.mask_tokens])]  # [L + 1, d]
        positions = self.length + self.block
        cos, sin = self.rope[:, positions]  # [L + 1, D/2] each
        num_visible = self.length + self.block.shape[0]  # the valid context, then the block's own rows
        for i, layer in enumerate(w.layers):
            x = cached_draft_layer(cfg, layer, x, cos, sin, self.keys[i], self.values[i], positions, num_visible)
        out = rms_norm(x[1:], w.norm, cfg.rms_norm_eps)
        return F.linear(out, self.lm_head).float().log_softmax(-1)
