"""The target model in torch: DeepSeek-V3 / Kimi-K2 with absorbed MLA over the latent cache.

Attention never materialises per-head K or V: q_nope is absorbed into the latent space through W_UK,
ddtree.verify_attn attends over (c, rope(k_pe)) rows, and W_UV maps the latent output back per head.
The same forward serves prefill (causal block), AR (one node) and tree verify (visibility mask).
MoE runs each token through its top-k routed experts only, as grouped GEMMs with static shapes (engine/model/moe.py),
so a step needs no host sync and can be captured in a CUDA graph; every forward counts the experts its rows chose.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

import kernels
from engine.config import LATENT_NORM_EPS, ModelConfig
from engine.loaders.checkpoint import Checkpoint
from engine.model.batch_rows import FAST, exact_rows
from engine.model.cache import LatentCache
from engine.model.layers import ROPE_OP_MAX_DIM, apply_rope, fused_rows, needs_autograd, swiglu
from engine.model.moe import (
    ExpertLoad,
    Experts,
    default_path,
    local_routing,
    route_and_count,
    sparse_runs,
    stack_experts,
)
from engine.model.parallel import ATTN_REDUCE, MOE_COMBINE, MOE_DISPATCH, Shard
from engine.model.read_bytes import expert_bytes
from engine.model.rope import rope_tables
from engine.model.weights import lm_head_name
from engine.timers import StepTimer
from kernels import ops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MOE_PATHS = ("sparse", "dense")  # each token's top-k experts (engine/model/moe.py), or every expert: the reference
_NULL_TIMER = StepTimer(enabled=False)


@dataclass(slots=True)
class _Attention:
    # what the normed x feeds: q_a_proj [q_lora, hidden] (without a q low-rank path, the rank's q_proj rows) and
    # kv_a_proj_with_mqa [R + P, hidden], stacked at load (fused_rows) so one matmul computes both
    x_proj: torch.Tensor  # [q_rows + R + P, hidden]
    q_rows: int
    q_a_norm: torch.Tensor | None
    q_b: torch.Tensor | None  # [H * (nope + rope), q_lora] (None without a q low-rank path)
    kv_a_norm: torch.Tensor  # [R]
    w_uk: torch.Tensor  # [H, nope, R]
    w_uv: torch.Tensor  # [H, v, R]
    o_proj: torch.Tensor  # [hidden, H * v]


class TargetModel:
    """Weights on one device and dtype, plus the forward over a block of nodes."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
                 moe: str | None = None, shard: Shard | None = None) -> None:
        """weights: by name, or a stream of (name, tensor) (WeightSource.tensors): from a stream each routed expert is
        stacked as it arrives and dropped, so the device holds the model once. moe: one of MOE_PATHS; None picks
        sparse where it runs without a host sync and pays (moe.default_path), else dense. shard: this rank's part
        of a tensor- and expert-parallel layout (engine/model/parallel.py); None holds the whole model."""
        kernels.load()  # build or load the ops now, not inside the first (timed) prefill
        self.cfg = cfg
        self.shard = shard
        if shard is not None:
            shard.check(cfg)  # before any weight is kept
        self.heads = shard.part(cfg.num_attention_heads, "num_attention_heads") if shard else None
        has_moe = any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))
        self.held_experts = shard.part(cfg.n_routed_experts, "n_routed_experts") if shard and has_moe else None
        weights, experts = stack_experts(cfg, weights.items() if isinstance(weights, Mapping) else weights,
                                         self.held_experts)
        self.device = weights["model.embed_tokens.weight"].device
        self.dtype = weights["model.embed_tokens.weight"].dtype
        self.embed = weights["model.embed_tokens.weight"]
        self.final_norm = weights["model.norm.weight"]
        self.lm_head = weights[lm_head_name(cfg)]
        self.layers = [self._layer(weights, experts, i) for i in range(cfg.num_hidden_layers)]
        _, _, mscale = rope_tables(cfg, 1, self.device)
        self.scale = cfg.qk_head_dim ** -0.5 * mscale * mscale
        self.moe_path = moe or default_path(self.device, self.dtype, cfg)
        if self.moe_path not in MOE_PATHS:
            raise ValueError(f"moe={moe!r}: expected one of {MOE_PATHS} or None (the faster one here)")
        if self.moe_path == "sparse" and not sparse_runs(self.device, self.dtype, cfg):
            raise ValueError("moe='sparse' needs hidden and expert widths a multiple of 16 bytes, and on CUDA "
                             "bfloat16, compute capability 9.x or 10.x and fewer than 1024 experts; use 'dense'")
        self.num_moe_layers = sum(layer["moe"] for layer in self.layers)
        self.expert_load = ExpertLoad(self.num_moe_layers, cfg.n_routed_experts, self.device)
        self.bytes_per_expert = expert_bytes(cfg, self.dtype.itemsize)
        self.exact_rows = exact_rows(self.device, self.dtype)  # the batch-invariant mode's (engine/model/batch_rows.py)

    def layout(self) -> dict | None:
        """The parallel layout this model is part of (Shard.layout), or None when it is whole."""
        return self.shard.layout(self.cfg.num_attention_heads, self.cfg.n_routed_experts) if self.shard else None

    def experts_touched(self) -> torch.Tensor:
        """[num_moe_layers] int64 on the device: distinct routed experts the last forward's rows chose, per MoE layer
        (no host sync: a step reads it into its record afterwards)."""
        return self.expert_load.touched()

    def rope(self, num_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [num_positions, P/2] for positions 0..num_positions-1: a decode sizes them from what it needs
        (engine/model/cache.py keeps them), never from max_position_embeddings, which a config may claim huge."""
        cos, sin, _ = rope_tables(self.cfg, num_positions, self.device)
        return cos, sin

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: str = "cpu", dtype: str = "float32",
                        moe: str | None = None, shard: Shard | None = None) -> TargetModel:
        """The model of ckpt on device in dtype. The weights arrive one at a time, already on the device in dtype
        (ckpt.weights.tensors): a Hugging Face checkpoint goes from its files to the device without a host copy, and
        each routed expert joins its layer's stack as it arrives."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: expected one of {tuple(DTYPES)}")
        try:
            where = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device={device!r}: expected 'cpu' or 'cuda' ({exc})") from exc
        if where.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: torch {torch.__version__} sees no CUDA GPU here; use 'cpu'")
        if where.type not in ("cpu", "cuda"):
            raise ValueError(f"device={device!r}: expected 'cpu' or 'cuda'")
        return cls(ckpt.config, ckpt.weights.tensors(device, DTYPES[dtype]), moe, shard)

    def _split(self, t: torch.Tensor, dim: int, part: slice | None, groups: int | None = None) -> torch.Tensor:
        """t's share on this rank along dim: the groups (heads; by default single rows or columns) in part. The
        whole t without a shard."""
        if part is None:
            return t
        shape = t.shape
        groups = groups or shape[dim]
        grouped = t.reshape(*shape[:dim], groups, shape[dim] // groups, *shape[dim + 1:])
        share = grouped.narrow(dim, part.start, part.stop - part.start)
        return share.reshape(*shape[:dim], -1, *shape[dim + 1:]).contiguous()

    def _mlp(self, w: dict[str, torch.Tensor], prefix: str, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """gate_up (the gate and up projections stacked) and down of a SwiGLU MLP: with a shard, the rank's columns
        of its intermediate width."""
        part = self.shard.part(width, f"{prefix}'s intermediate width") if self.shard else None
        gate_up = fused_rows(self._split(w.pop(f"{prefix}.gate_proj.weight"), 0, part),
                             self._split(w.pop(f"{prefix}.up_proj.weight"), 0, part))
        return gate_up, self._split(w[f"{prefix}.down_proj.weight"], 1, part)

    def _layer(self, w: dict[str, torch.Tensor], experts: dict[int, Experts], i: int) -> dict:
        cfg, p = self.cfg, f"model.layers.{i}"
        h, nope, v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.v_head_dim
        kv_b = self._split(w[f"{p}.self_attn.kv_b_proj.weight"], 0, self.heads, h).view(-1, nope + v,
                                                                                          cfg.kv_lora_rank)
        lowrank_q = cfg.q_lora_rank is not None
        q_in = (w.pop(f"{p}.self_attn.q_a_proj.weight") if lowrank_q
                else self._split(w.pop(f"{p}.self_attn.q_proj.weight"), 0, self.heads, h))
        attn = _Attention(
            x_proj=fused_rows(q_in, w.pop(f"{p}.self_attn.kv_a_proj_with_mqa.weight")), q_rows=q_in.shape[0],
            q_a_norm=w[f"{p}.self_attn.q_a_layernorm.weight"] if lowrank_q else None,
            q_b=self._split(w[f"{p}.self_attn.q_b_proj.weight"], 0, self.heads, h) if lowrank_q else None,
            kv_a_norm=w[f"{p}.self_attn.kv_a_layernorm.weight"],
            w_uk=kv_b[:, :nope].contiguous(), w_uv=kv_b[:, nope:].contiguous(),
            o_proj=self._split(w[f"{p}.self_attn.o_proj.weight"], 1, self.heads, h),
        )
        layer = {"attn": attn, "norm1": w[f"{p}.input_layernorm.weight"],
                 "norm2": w[f"{p}.post_attention_layernorm.weight"], "moe": cfg.is_moe_layer(i)}
        if not layer["moe"]:
            layer["mlp"] = self._mlp(w, f"{p}.mlp", cfg.intermediate_size)
            return layer
        layer["router"] = w[f"{p}.mlp.gate.weight"].float()  # [E, hidden]: routing in float32
        layer["router_bias"] = w[f"{p}.mlp.gate.e_score_correction_bias"].float()  # [E]
        layer["experts"] = experts[i]
        layer["moe_index"] = i - cfg.first_k_dense_replace  # its row in expert_load
        if cfg.n_shared_experts:
            layer["shared"] = self._mlp(w, f"{p}.mlp.shared_experts", cfg.n_shared_experts * cfg.moe_intermediate_size)
        return layer

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor, block_mask: torch.Tensor, cache: LatentCache,
                timer: StepTimer = _NULL_TIMER, hidden_layers: tuple[int, ...] = (),
                batch_invariant: bool = False, float_logits: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens, depths [N]; block_mask [N, N] bool. Node i sits at position prefix_len + depths[i] and
        its KV lands in cache row prefix_len + i. Returns logits [N, V] (float32; float_logits False: the lm_head's
        own, the model's dtype, whose argmax is the same and which spares a step writing [N, V] float32, 168 MB at
        B = 256 and Kimi-K2's vocabulary) and, when hidden_layers names layers, their outputs concatenated in that
        order [N, len(hidden_layers) * hidden] (transformers' hidden_states[i + 1] for layer i: the last layer's is
        after the final norm, as there), else None.

        batch_invariant: every per-row computation (norms, projections, the FFN, the head) runs so that a row's result
        does not depend on how many rows the call holds or which (self.exact_rows: engine/model/batch_rows.py), and
        verify_attn reduces each node over its own logical sequence."""
        cfg = self.cfg
        captured: dict[int, torch.Tensor] = {}
        rows = self.exact_rows if batch_invariant else FAST
        self.expert_load.reset()
        with timer.range("embed"):
            x = self.embed[tokens]  # [N, hidden]
            # which rows are not padding: only BlockRows pads (its blocks with False); else every row, None
            real = torch.ones(x.shape[0], dtype=torch.bool, device=x.device) if rows.pads else None
            positions = cache.prefix_len + depths
            cos, sin = cache.rope[:, positions]  # [N, P/2] each
            cache_rows = cache.block_rows(x.shape[0])
            # h: the normed x the next block reads; after this one each residual add and that norm are one step
            h = rows.run(lambda x: rows.rms_norm(x, self.layers[0]["norm1"], cfg.rms_norm_eps), x)
        for i, layer in enumerate(self.layers):
            a = layer["attn"]
            with timer.range(f"layer{i}/attn"):
                q_lat, q_pe, kv = rows.run(lambda *t, a=a: self._project(rows, a, *t), h, cos, sin)
                self._write_latent(rows, a, cache, i, cache_rows, kv, cos, sin)
                with timer.range("verify_attn"):
                    o_lat, _ = ops.verify_attn(q_lat, q_pe, cache.ckv[i], cache.kpe[i], cache.prefix_len,
                                               block_mask, self.scale, batch_invariant=batch_invariant)
                out = self._reduce(rows.run(lambda o, a=a: self._attention_out(rows, a, o), o_lat), timer,
                                   ATTN_REDUCE)
                x, h = rows.add_rms_norm(x, out, layer["norm2"], cfg.rms_norm_eps)
            with timer.range(f"layer{i}/{'moe' if layer['moe'] else 'mlp'}"):
                y = rows.run(lambda h, real, layer=layer: self._ffn(rows, layer, h, real, timer), h, real)
                y = self._reduce(y, timer, MOE_COMBINE if layer["moe"] else ATTN_REDUCE)
                last = i + 1 == len(self.layers)
                x, h = rows.add_rms_norm(x, y, self.final_norm if last else self.layers[i + 1]["norm1"],
                                         cfg.rms_norm_eps)
            if i in hidden_layers:
                captured[i] = x
        with timer.range("lm_head"):
            logits = rows.run(lambda h: rows.linear(h, self.lm_head), h)
            logits = logits.float() if float_logits else logits
        captured[cfg.num_hidden_layers - 1] = h  # transformers' last hidden state is after the final norm
        hidden = torch.cat([captured[i] for i in hidden_layers], dim=-1) if hidden_layers else None
        return logits, hidden

    def _project(self, rows, a: _Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per row of the normed x: q_lat [N, H, R], rope(q_pe) [N, H, P], and the latent cache row before its norm
        and RoPE: kv [N, R + P] (c_kv | k_pe, columns of the projection's output)."""
        cfg = self.cfg
        n, h = x.shape[0], a.w_uk.shape[0]  # this rank's heads
        q, kv = rows.linear(x, a.x_proj).split([a.q_rows, cfg.kv_lora_rank + cfg.qk_rope_head_dim], dim=-1)
        if a.q_b is not None:
            q = rows.linear(rows.rms_norm(q, a.q_a_norm, LATENT_NORM_EPS), a.q_b)
        q_nope, q_pe = q.reshape(n, h, cfg.qk_head_dim).split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        q_pe = apply_rope(q_pe, cos, sin, cfg.rope_interleave)
        q_lat = rows.absorb(q_nope, a.w_uk).contiguous()
        return q_lat, q_pe, kv

    def _write_latent(self, rows, a: _Attention, cache: LatentCache, layer: int, cache_rows: torch.Tensor,
                      kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
        """The block's latent cache rows: c_kv normed by kv_a_norm and k_pe turned by RoPE, written at cache_rows. One
        ops.latent_write launch (rms_norm_rows' and head_norm_rope's bits, which every mode's norm and RoPE have
        there), where norm, RoPE and two copies took four; the separate ops where it cannot run (a RoPE wider than
        ROPE_OP_MAX_DIM, autograd)."""
        cfg = self.cfg
        if cfg.qk_rope_head_dim <= ROPE_OP_MAX_DIM and not needs_autograd(kv):
            ops.latent_write(kv, a.kv_a_norm, cos, sin, LATENT_NORM_EPS, cfg.rope_interleave, cache.ckv[layer],
                             cache.kpe[layer], cache_rows)
            return
        c_kv, k_pe = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        cache.write(layer, cache_rows, rows.rms_norm(c_kv, a.kv_a_norm, LATENT_NORM_EPS),
                    apply_rope(k_pe, cos, sin, cfg.rope_interleave))

    def _attention_out(self, rows, a: _Attention, o_lat: torch.Tensor) -> torch.Tensor:
        """Per row: the latent attention output [N, H, R] mapped back per head (W_UV), then o_proj."""
        n, h = o_lat.shape[:2]
        o = rows.expand(o_lat, a.w_uv).reshape(n, h * self.cfg.v_head_dim)
        return rows.linear(o, a.o_proj)

    def _reduce(self, partial: torch.Tensor, timer: StepTimer, name: str) -> torch.Tensor:
        """The sum over the ranks of their partial outputs (engine/model/parallel.py); the output itself alone."""
        if self.shard is None:
            return partial
        with timer.range(name):
            return self.shard.all_reduce(partial)

    def _ffn(self, rows, layer: dict, x: torch.Tensor, real: torch.Tensor | None, timer: StepTimer) -> torch.Tensor:
        """The MLP or MoE of the normed x."""
        return self._moe(rows, layer, x, real, timer) if layer["moe"] else swiglu(x, *layer["mlp"], rows.linear,
                                                                                  rows.gated)

    def _moe(self, rows, layer: dict, x: torch.Tensor, real: torch.Tensor | None, timer: StepTimer) -> torch.Tensor:
        """Routed experts (sparse, or the dense reference) plus the shared ones; real [N] marks the rows that are not
        padding (None: every row). With a shard: this rank's experts' and shared columns' part of the output."""
        logits = rows.router(x, layer["router"])
        idx, weights = route_and_count(self.cfg, logits, layer["router_bias"],  # [N, k] each
                                       self.expert_load.counts[layer["moe_index"]], real)
        held = self.held_experts
        if held is not None:
            with timer.range(MOE_DISPATCH):  # every rank holds every token: choosing its assignments moves no bytes
                idx, weights = local_routing(idx, weights, held.start, held.stop - held.start)
        y = rows.routed(self.moe_path == "sparse", x, idx, weights, layer["experts"])
        if "shared" in layer:
            y = y + swiglu(x, *layer["shared"], rows.linear, rows.gated)
        return y
