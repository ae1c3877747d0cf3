"""The weight table: every tensor a model of a given config holds, by its Hugging Face checkpoint name.

One source of truth for names and shapes: the .kdtr validator, the fixture generator, the golden model,
the torch model and the Hugging Face importer all read it.
"""
from __future__ import annotations

from engine.config import ModelConfig


def _mlp(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.gate_proj.weight": (inter, hidden),
        f"{prefix}.up_proj.weight": (inter, hidden),
        f"{prefix}.down_proj.weight": (hidden, inter),
    }


def layer_weight_shapes(cfg: ModelConfig, layer: int) -> dict[str, tuple[int, ...]]:
    """Shapes of layer `layer`'s tensors, keyed by their full checkpoint name."""
    p = f"model.layers.{layer}"
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    shapes: dict[str, tuple[int, ...]] = {
        f"{p}.input_layernorm.weight": (h,),
        f"{p}.post_attention_layernorm.weight": (h,),
        f"{p}.self_attn.kv_a_proj_with_mqa.weight": (cfg.kv_lora_rank + cfg.qk_rope_head_dim, h),
        f"{p}.self_attn.kv_a_layernorm.weight": (cfg.kv_lora_rank,),
        f"{p}.self_attn.kv_b_proj.weight": (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank),
        f"{p}.self_attn.o_proj.weight": (h, nh * cfg.v_head_dim),
    }
    if cfg.q_lora_rank is None:
        shapes[f"{p}.self_attn.q_proj.weight"] = (nh * cfg.qk_head_dim, h)
    else:
        shapes[f"{p}.self_attn.q_a_proj.weight"] = (cfg.q_lora_rank, h)
        shapes[f"{p}.self_attn.q_a_layernorm.weight"] = (cfg.q_lora_rank,)
        shapes[f"{p}.self_attn.q_b_proj.weight"] = (nh * cfg.qk_head_dim, cfg.q_lora_rank)
    if not cfg.is_moe_layer(layer):
        shapes.update(_mlp(f"{p}.mlp", h, cfg.intermediate_size))
        return shapes
    shapes[f"{p}.mlp.gate.weight"] = (cfg.n_routed_experts, h)
    shapes[f"{p}.mlp.gate.e_score_correction_bias"] = (cfg.n_routed_experts,)
    for e in range(cfg.n_routed_experts):
        shapes.update(_mlp(f"{p}.mlp.experts.{e}", h, cfg.moe_intermediate_size))
    if cfg.n_shared_experts:
        shapes.update(_mlp(f"{p}.mlp.shared_experts", h, cfg.moe_intermediate_size * cfg.n_shared_experts))
    return shapes


def weight_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the model, in a stable order, keyed by checkpoint name."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, cfg.hidden_size)}
    for layer in range(cfg.num_hidden_layers):
        shapes.update(layer_weight_shapes(cfg, layer))
    shapes["model.norm.weight"] = (cfg.hidden_size,)
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.hidden_size)
    return shapes


def lm_head_name(cfg: ModelConfig) -> str:
    return "model.embed_tokens.weight" if cfg.tie_word_embeddings else "lm_head.weight"
