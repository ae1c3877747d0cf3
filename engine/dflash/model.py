"""The DFlash forward in torch, on the target's device and dtype, with the drafter's own context K/V cache.

Context: the target's hidden states of the chosen layers, concatenated -> fc -> hidden_norm; each draft layer
applies its own k_proj / v_proj (k_norm, then RoPE at the token's position) and keeps the result in the cache.
Block: [root, MASK x L] embedded with the target's embedding, at positions n .. n + L (n = context rows). Per
layer: RMSNorm; queries from the block only (q_norm, RoPE); keys and values are the cached context rows joined
with the block's own, through the same projections; no mask (the block sees every valid context row and itself
both ways); GQA; SwiGLU MLP; residuals. Output: the block's last L rows -> the drafter's norm -> the target's
lm_head -> float32 log-softmax [L, V].

Everything runs on device tensors with static shapes: the cache has a fixed capacity, the number of valid rows
is a 0-dim device tensor, and rows at or past it are masked out. No method reads a device value on the host,
so a decode step with this drafter captures as one CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..model import apply_rope, rms_norm, swiglu
from ..rope import cos_sin
from .config import DFlashConfig
from .tensors import LAYER_TENSORS


@dataclass(frozen=True, slots=True)
class DFlashWeights:
    """The drafter's tensors on one device and dtype (read-only: decoders share them)."""

    fc: torch.Tensor  # [d, len(target_layer_ids) * d]
    hidden_norm: torch.Tensor  # [d]
    norm: torch.Tensor  # [d]
    layers: tuple[dict[str, torch.Tensor], ...]  # per draft layer: LAYER_TENSORS names -> tensor

    @classmethod
    def from_tensors(cls, cfg: DFlashConfig, tensors: dict[str, torch.Tensor]) -> DFlashWeights:
        layers = tuple({name: tensors[f"layers.{i}.{name}"] for name, _ in LAYER_TENSORS}
                       for i in range(cfg.num_hidden_layers))
        return cls(tensors["fc.weight"], tensors["hidden_norm.weight"], tensors["norm.weight"], layers)

    @property
    def device(self) -> torch.device:
        return self.fc.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype


def _grouped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """q [N, Hq, D]; k, v [S, Hkv, D]; visible [S] bool -> [N, Hq * D]. Query head h reads key/value head
    h // (Hq / Hkv) (transformers' repeat_kv), without repeating the keys: the G query heads of a key/value head
    attend as G * N rows of one head."""
    n, num_heads, dim = q.shape
    num_kv = k.shape[1]
    groups = num_heads // num_kv
    q = q.view(n, num_kv, groups, dim).permute(1, 2, 0, 3).reshape(1, num_kv, groups * n, dim)
    out = F.scaled_dot_product_attention(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=visible.view(1, 1, 1, -1), scale=scale)  # [1, Hkv, G*N, D]
    return out.view(num_kv, groups, n, dim).permute(2, 0, 1, 3).reshape(n, num_heads * dim)


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
        self.rows = torch.arange(capacity, device=dev)
        self.block = torch.arange(num_draft_positions + 1, device=dev)  # offsets of the block's rows
        self.mask_tokens = torch.full((num_draft_positions,), cfg.mask_token_id, dtype=torch.int64, device=dev)
        # positions 0 .. capacity + L: the block may sit past the last context row
        self.cos, self.sin = cos_sin(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, capacity + num_draft_positions
                                     + 1, dev)
        self.scale = cfg.head_dim ** -0.5

    @property
    def capacity(self) -> int:
        return self.keys.shape[1]

    def _keys_values(self, layer: dict[str, torch.Tensor], x: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [n, d] -> keys (k_norm, RoPE), values [n, Hkv, D]."""
        cfg, n = self.cfg, x.shape[0]
        k = F.linear(x, layer["self_attn.k_proj.weight"]).view(n, cfg.num_key_value_heads, cfg.head_dim)
        k = apply_rope(rms_norm(k, layer["self_attn.k_norm.weight"], cfg.rms_norm_eps), cos, sin, False)
        v = F.linear(x, layer["self_attn.v_proj.weight"]).view(n, cfg.num_key_value_heads, cfg.head_dim)
        return k, v

    def write_context(self, hidden: torch.Tensor, start: torch.Tensor | int) -> None:
        """hidden [n, len(target_layer_ids) * d], the target's states of n tokens -> cache rows start .. start+n-1
        (their positions). Does not move the valid length."""
        cfg = self.cfg
        ctx = rms_norm(F.linear(hidden.to(self.w.dtype), self.w.fc), self.w.hidden_norm, cfg.rms_norm_eps)
        positions = start + torch.arange(hidden.shape[0], device=self.rows.device)
        cos, sin = self.cos[positions], self.sin[positions]
        for i, layer in enumerate(self.w.layers):
            k, v = self._keys_values(layer, ctx, cos, sin)
            self.keys[i].index_copy_(0, positions, k)
            self.values[i].index_copy_(0, positions, v)

    def block_logprobs(self, root: torch.Tensor) -> torch.Tensor:
        """float32 log-probabilities [L, V] of the L tokens after root (0-dim int64), against the valid context
        rows. The block's own keys and values are not stored."""
        cfg, w = self.cfg, self.w
        num_rows = self.num_draft_positions + 1
        x = self.embed[torch.cat([root.view(1), self.mask_tokens])]  # [L + 1, d]
        positions = self.length + self.block
        cos, sin = self.cos[positions], self.sin[positions]  # [L + 1, D/2]
        visible = torch.cat([self.rows < self.length, torch.ones(num_rows, dtype=torch.bool, device=x.device)])
        for i, layer in enumerate(w.layers):
            h = rms_norm(x, layer["input_layernorm.weight"], cfg.rms_norm_eps)
            q = F.linear(h, layer["self_attn.q_proj.weight"]).view(num_rows, cfg.num_attention_heads, cfg.head_dim)
            q = apply_rope(rms_norm(q, layer["self_attn.q_norm.weight"], cfg.rms_norm_eps), cos, sin, False)
            k_block, v_block = self._keys_values(layer, h, cos, sin)
            keys, values = torch.cat([self.keys[i], k_block]), torch.cat([self.values[i], v_block])
            attn = _grouped_attention(q, keys, values, visible, self.scale)
            x = x + F.linear(attn, layer["self_attn.o_proj.weight"])
            h = rms_norm(x, layer["post_attention_layernorm.weight"], cfg.rms_norm_eps)
            x = x + swiglu(h, layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"], layer["mlp.down_proj.weight"])
        out = rms_norm(x[1:], w.norm, cfg.rms_norm_eps)
        return F.linear(out, self.lm_head).float().log_softmax(-1)
