"""A trainable DFlash drafter: its checkpoint tensors as parameters, and the training forward DFlash is trained
with (SpecForge / NVIDIA ModelOpt): many blocks per sequence at once.

Each block starts at an anchor a: [token at a, MASK x L] at positions a .. a + L. It sees the context strictly
before its anchor (the target's features of positions 0 .. a - 1, as at inference, where the context holds every
committed token but the root) and itself both ways, never another block. Its row k predicts the token at a + k.
The layers are engine/model/dflash_layers.py's, the ones the engine's drafter runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_tensors import tensor_shapes
from engine.model.dflash_layers import context_features, draft_layer, fused_layer, keys_values
from engine.model.layers import rms_norm
from engine.model.rope import cos_sin


class DrafterLM(nn.Module):
    """The drafter's tensors (engine/loaders/dflash_tensors.py names) as parameters; the target lends its embedding and
    lm_head, frozen, at every call."""

    def __init__(self, cfg: DFlashConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.names = list(tensor_shapes(cfg))
        self.params = nn.ParameterList(nn.Parameter(torch.empty(shape)) for shape in tensor_shapes(cfg).values())
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Unit norms; matrices N(0, 1 / fan_in), the residual branches' outputs (o_proj, down_proj) scaled down by
        sqrt(2 * layers) so the stack starts near the identity."""
        scale = 1.0 / math.sqrt(2 * self.cfg.num_hidden_layers)
        with torch.no_grad():
            for name, p in zip(self.names, self.params, strict=True):
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, p.shape[1] ** -0.5)
                    if name.endswith(("o_proj.weight", "down_proj.weight")):
                        p.mul_(scale)

    def tensors(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.names, self.params, strict=True))

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, embed: torch.Tensor,
                lm_head: torch.Tensor) -> torch.Tensor:
        """features [B, T, len(target_layer_ids) * d] (the target's hidden states of tokens [B, T]); anchors [B, A]
        (each in 0 .. T - block_size); embed, lm_head [V, d] the target's. Returns logits [B, A, L, V] float32:
        row k of block j predicts tokens[b, anchors[b, j] + k + 1]."""
        cfg, w = self.cfg, self.tensors()
        b, t = tokens.shape
        num_anchors, size = anchors.shape[1], cfg.block_size
        dev = tokens.device
        cos, sin = cos_sin(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, t + size, dev)
        ctx = context_features(cfg, w["fc.weight"], w["hidden_norm.weight"], features)  # [B, T, d]
        ctx_positions = torch.arange(t, device=dev).expand(b, t)
        offsets = torch.arange(size, device=dev)
        positions = (anchors[:, :, None] + offsets).reshape(b, num_anchors * size)  # [B, A * size]
        block = torch.full((b, num_anchors, size), cfg.mask_token_id, dtype=torch.int64, device=dev)
        block[:, :, 0] = tokens.gather(1, anchors)
        x = F.embedding(block.reshape(b, -1), embed).to(ctx.dtype)  # [B, A * size, d]
        own_block = torch.arange(num_anchors, device=dev).repeat_interleave(size)
        mask = torch.cat([torch.arange(t, device=dev)[None, None, :] < anchors.repeat_interleave(size, 1)[:, :, None],
                          (own_block[:, None] == own_block[None, :]).expand(b, -1, -1)], dim=-1)
        for i in range(cfg.num_hidden_layers):
            layer = fused_layer({name.removeprefix(f"layers.{i}."): p for name, p in w.items()
                                 if name.startswith(f"layers.{i}.")})
            keys, values = keys_values(cfg, layer, ctx, cos[ctx_positions], sin[ctx_positions])
            x = draft_layer(cfg, layer, x, cos[positions], sin[positions], keys, values, mask)
        out = rms_norm(x.view(b, num_anchors, size, -1)[:, :, 1:], w["norm.weight"], cfg.rms_norm_eps)
        return F.linear(out, lm_head).float()


def block_loss(logits: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor, gamma: float) -> torch.Tensor:
    """DFlash's loss: cross-entropy of block row k (k = 1 .. L) against the token at anchor + k, weighted by
    exp(-(k - 1) / gamma) (the early rows matter most: acceptance stops at the first miss), over every block."""
    num_rows = logits.shape[2]
    k = torch.arange(1, num_rows + 1, device=tokens.device)
    labels = tokens.gather(1, (anchors[:, :, None] + k).flatten(1)).view(anchors.shape[0], -1, num_rows)
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(labels.shape)
    weights = torch.exp(-(k - 1) / gamma)
    return (ce * weights).sum() / (weights.sum() * anchors.numel())
