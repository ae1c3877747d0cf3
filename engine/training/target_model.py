"""The target architecture (DeepSeek-V3 / Kimi-K2) as a trainable torch nn.Module.

It computes the forward of engine/model/reference.py and engine/model/target.py (RMSNorm, MLA with an optional q
low-rank path, RoPE, dense SwiGLU below first_k_dense_replace and MoE above it, final norm, lm_head), but the naive way
that trains fast: kv_b_proj expands the latent to per-head K and V, and scaled_dot_product_attention attends
causally. Parameters carry exactly engine.model.weights' names (Hugging Face checkpoint names), so the state_dict
saved as safetensors is a checkpoint engine.loaders.hf_import.read_hf_dir loads as it is.

The MoE runs every routed expert on every token with the routing weights (zero off each token's top-k) folded
in before the down projection: the experts side by side are one SwiGLU of width E * moe_intermediate_size,
three matmuls with static shapes and no host sync. Routing is engine.model.moe.route, the engine's own.
e_score_correction_bias is a buffer, not a parameter: gradients never touch it. It follows DeepSeek-V3's
auxiliary-loss-free balancing instead (update_router_biases), from the per-expert loads each forward returns.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.config import LATENT_NORM_EPS, ModelConfig
from engine.model.layers import apply_rope, rms_norm
from engine.model.moe import dense_weights, route
from engine.model.rope import rope_tables

INIT_STD = 0.02  # transformers' DeepseekV3Config.initializer_range


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class KVCache:
    """Per-layer expanded K and V [B, H, capacity, max(qk_head_dim, v_head_dim)] (zero-padded to one width) for
    incremental decoding, allocated zeroed on the first write in the dtype the attention computes in.

    A write at an int start (the prefill, or eager steps) returns the rows 0..start+T-1; a write at a position tensor
    [1] (one token a step, the graph-captured decode of engine/training/generate.py) returns every row, the later ones
    still zero, for the attention to mask: the same shapes every step, and no position read on the host."""

    def __init__(self, num_layers: int, capacity: int) -> None:
        self.capacity = capacity
        self.k: list[torch.Tensor | None] = [None] * num_layers
        self.v: list[torch.Tensor | None] = [None] * num_layers

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor,
               start: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, H, T, .] at positions start..start+T-1; return the cached rows as above."""
        if self.k[layer] is None:
            b, h = k.shape[:2]
            self.k[layer] = k.new_zeros(b, h, self.capacity, k.shape[3])
            self.v[layer] = v.new_zeros(b, h, self.capacity, v.shape[3])
        if isinstance(start, torch.Tensor):
            self.k[layer].index_copy_(2, start, k)
            self.v[layer].index_copy_(2, start, v)
            return self.k[layer], self.v[layer]
        end = start + k.shape[2]
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]


class Attention(nn.Module):
    """MLA with full per-head K and V (kv_b_proj expanded), causal."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        h, nh = cfg.hidden_size, cfg.num_attention_heads
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(h, nh * cfg.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, cfg.q_lora_rank, bias=False)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, nh * cfg.qk_head_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, cfg.kv_lora_rank + cfg.qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), bias=False)
        self.o_proj = nn.Linear(nh * cfg.v_head_dim, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float,
                cache: KVCache | None, layer: int, start: int | torch.Tensor) -> torch.Tensor:
        """x [B, T, hidden] at positions start..start+T-1 (cos, sin [T, P/2]) -> [B, T, hidden]; start a position
        tensor [1]: one token attending to the cache's rows up to it (KVCache)."""
        cfg = self.cfg
        b, t, _ = x.shape
        nh, nope, rope, vdim = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
        q = self.q_proj(x) if cfg.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(b, t, nh, nope + rope).split([nope, rope], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, rope], dim=-1)
        k_nope, v = self.kv_b_proj(self.kv_a_layernorm(c_kv)).view(b, t, nh, nope + vdim).split([nope, vdim], -1)
        # apply_rope broadcasts cos [T, P/2] over the dims after the first: put T first
        q_pe = apply_rope(q_pe.transpose(0, 1), cos, sin, cfg.rope_interleave).transpose(0, 1)  # [B, T, H, P]
        k_pe = apply_rope(k_pe.transpose(0, 1), cos, sin, cfg.rope_interleave).transpose(0, 1)  # [B, T, P]
        # zero-pad q, k and v to one head width (scores and outputs unchanged): flash attention needs equal
        # widths, and it has a deterministic backward
        width = max(nope + rope, vdim)
        q = F.pad(torch.cat([q_nope, q_pe], dim=-1), (0, width - nope - rope)).transpose(1, 2)  # [B, H, T, width]
        k = F.pad(torch.cat([k_nope, k_pe[:, :, None].expand(b, t, nh, rope)], dim=-1),
                  (0, width - nope - rope)).transpose(1, 2)
        v = F.pad(v, (0, width - vdim)).transpose(1, 2)
        mask = None
        if cache is not None:
            if not isinstance(start, torch.Tensor) and start > 0 and t > 1:
                raise ValueError(f"a cached forward takes a prefill at position 0 or one token a step, not {t} "
                                 f"tokens at position {start}")
            k, v = cache.append(layer, k, v, start)
            if isinstance(start, torch.Tensor):  # every cached row comes back: keep those up to the position
                mask = (torch.arange(cache.capacity, device=x.device) <= start).view(1, 1, 1, -1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=t > 1, scale=scale)[..., :vdim]
        return self.o_proj(o.transpose(1, 2).reshape(b, t, nh * vdim))


class Router(nn.Module):
    """mlp.gate: the router weight (trained) and e_score_correction_bias (a buffer: balanced, not trained)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(cfg.n_routed_experts))


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts = nn.ModuleList(MLP(cfg.hidden_size, cfg.moe_intermediate_size)
                                     for _ in range(cfg.n_routed_experts))
        if cfg.n_shared_experts:
            self.shared_experts = MLP(cfg.hidden_size, cfg.moe_intermediate_size * cfg.n_shared_experts)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, hidden] -> (out [B, T, hidden], tokens routed to each expert [E] int64)."""
        cfg = self.cfg
        flat = x.reshape(-1, cfg.hidden_size)  # [N, hidden]
        with torch.autocast(device_type=x.device.type, enabled=False):  # routing in float32, as DeepSeek-V3
            idx, topk = route(cfg, flat.float() @ self.gate.weight.float().T, self.gate.e_score_correction_bias)
            weights = dense_weights(idx, topk, cfg.n_routed_experts)  # [N, E]
        load = (weights > 0).sum(0)  # [E]
        n, e, inter = flat.shape[0], cfg.n_routed_experts, cfg.moe_intermediate_size
        gate_w = torch.cat([ex.gate_proj.weight for ex in self.experts])  # [E * I, hidden]
        up_w = torch.cat([ex.up_proj.weight for ex in self.experts])
        down_w = torch.cat([ex.down_proj.weight for ex in self.experts], dim=1)  # [hidden, E * I]
        act = (F.silu(F.linear(flat, gate_w)) * F.linear(flat, up_w)).view(n, e, inter)
        out = F.linear((act * weights[:, :, None].to(act.dtype)).view(n, e * inter), down_w)
        if cfg.n_shared_experts:
            out = out + self.shared_experts(flat)
        return out.view_as(x), load


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, index: int, dropout: float) -> None:
        super().__init__()
        self.index = index
        self.dropout = nn.Dropout(dropout)  # on each branch before the residual add; identity in eval()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MoE(cfg) if cfg.is_moe_layer(index) else MLP(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, scale: float, cache: KVCache | None,
                start: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = x + self.dropout(self.self_attn(self.input_layernorm(x), cos, sin, scale, cache, self.index, start))
        h = self.post_attention_layernorm(x)
        ffn, load = self.mlp(h) if isinstance(self.mlp, MoE) else (self.mlp(h), None)
        return x + self.dropout(ffn), load


class Backbone(nn.Module):
    """`model.*`: the embedding, the decoder layers and the final norm."""

    def __init__(self, cfg: ModelConfig, dropout: float) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dropout) for i in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


@dataclass(slots=True)
class TargetOutput:
    logits: torch.Tensor | None  # [B, T', V] float32 for positions logits_from.., None when not asked for
    hidden: tuple[torch.Tensor, ...]  # [B, T, hidden] per requested layer, in the order asked
    expert_loads: torch.Tensor | None  # [num MoE layers, E] tokens routed to each expert (None: no MoE layer)


class TargetLM(nn.Module):
    """DeepseekV3ForCausalLM: `model` (Backbone) and `lm_head` (absent when tie_word_embeddings).

    dropout (training only, a regulariser for many epochs over a small corpus) adds no parameters: the saved
    model is the plain architecture."""

    def __init__(self, cfg: ModelConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg, dropout)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin, mscale = rope_tables(cfg, cfg.max_position_embeddings, "cpu")
        self.register_buffer("rope_cos", cos, persistent=False)  # [max positions, P/2] float32
        self.register_buffer("rope_sin", sin, persistent=False)
        self.softmax_scale = cfg.qk_head_dim ** -0.5 * mscale * mscale
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """transformers' init: N(0, INIT_STD) matrices and embedding, unit norms, zero router biases."""
        for name, tensor in self.state_dict(keep_vars=True).items():
            with torch.no_grad():
                if name.endswith("e_score_correction_bias"):
                    tensor.zero_()
                elif tensor.dim() == 1:
                    tensor.fill_(1.0)
                else:
                    tensor.normal_(0.0, INIT_STD)

    @property
    def output_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.cfg.tie_word_embeddings else self.lm_head.weight

    def forward(self, tokens: torch.Tensor, hidden_layers: Sequence[int] = (), logits_from: int | None = 0,
                cache: KVCache | None = None, start: int | torch.Tensor = 0) -> TargetOutput:
        """tokens [B, T] at positions start..start+T-1 (a position tensor [1]: one token a step through the cache,
        in bounds by the caller's word, KVCache says why).

        hidden_layers: the output of each listed layer i, which is transformers' hidden_states[i + 1] (for the
        last layer that entry is after the final norm, as in transformers). logits_from: the first position
        whose logits to compute (-1: the last only; None: no logits, e.g. for features alone)."""
        cfg = self.cfg
        t = tokens.shape[1]
        if isinstance(start, torch.Tensor):
            if cache is None or t != 1:
                raise ValueError("a position tensor start takes one token a step through a KVCache")
            cos, sin = self.rope_cos.index_select(0, start), self.rope_sin.index_select(0, start)
        elif start + t > cfg.max_position_embeddings:
            raise ValueError(f"positions up to {start + t} exceed max_position_embeddings="
                             f"{cfg.max_position_embeddings}")
        else:
            cos, sin = self.rope_cos[start:start + t], self.rope_sin[start:start + t]
        bad = [i for i in hidden_layers if not 0 <= i < cfg.num_hidden_layers]
        if bad:
            raise ValueError(f"hidden_layers {bad}: layers are numbered 0..{cfg.num_hidden_layers - 1}")
        x = self.model.embed_tokens(tokens)  # [B, T, hidden]
        outputs, loads = {}, []
        for layer in self.model.layers:
            x, load = layer(x, cos, sin, self.softmax_scale, cache, start)
            outputs[layer.index] = x
            if load is not None:
                loads.append(load)
        x = self.model.norm(x)
        outputs[cfg.num_hidden_layers - 1] = x
        logits = None if logits_from is None else F.linear(x[:, logits_from:], self.output_weight).float()
        return TargetOutput(logits, tuple(outputs[i] for i in hidden_layers),
                            torch.stack(loads) if loads else None)


@torch.no_grad()
def update_router_biases(model: TargetLM, expert_loads: torch.Tensor, speed: float) -> None:
    """DeepSeek-V3's auxiliary-loss-free balancing, once per step: bias_e += speed * sign(mean load - load_e),
    so an overloaded expert gets picked less next time and an idle one more. expert_loads [MoE layers, E]."""
    routers = [layer.mlp.gate for layer in model.model.layers if isinstance(layer.mlp, MoE)]
    for router, load in zip(routers, expert_loads.float(), strict=True):
        router.e_score_correction_bias.add_(speed * torch.sign(load.mean() - load))
