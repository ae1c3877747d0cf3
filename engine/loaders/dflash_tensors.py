"""The DFlash tensor table: every tensor a drafter of a given config holds, by its checkpoint name (z-lab's
DFlashDraftModel state dict: no embedding and no head, the target lends both). The loader, the writer, the
torch model and the numpy reference all read it."""
from __future__ import annotations

from engine.loaders.dflash_config import DFlashConfig

# Per draft layer: (name after "layers.{i}.", shape as a function of d, heads * head_dim, kv heads * head_dim,
# head_dim, intermediate). The order is the table's order.
LAYER_TENSORS = (
    ("input_layernorm.weight", lambda d, q, kv, hd, i: (d,)),
    ("post_attention_layernorm.weight", lambda d, q, kv, hd, i: (d,)),
    ("self_attn.q_proj.weight", lambda d, q, kv, hd, i: (q, d)),
    ("self_attn.k_proj.weight", lambda d, q, kv, hd, i: (kv, d)),
    ("self_attn.v_proj.weight", lambda d, q, kv, hd, i: (kv, d)),
    ("self_attn.o_proj.weight", lambda d, q, kv, hd, i: (d, q)),
    ("self_attn.q_norm.weight", lambda d, q, kv, hd, i: (hd,)),
    ("self_attn.k_norm.weight", lambda d, q, kv, hd, i: (hd,)),
    ("mlp.gate_proj.weight", lambda d, q, kv, hd, i: (i, d)),
    ("mlp.up_proj.weight", lambda d, q, kv, hd, i: (i, d)),
    ("mlp.down_proj.weight", lambda d, q, kv, hd, i: (d, i)),
)


def tensor_shapes(cfg: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the drafter, in a stable order: fc, hidden_norm, the layers, norm."""
    d, hd = cfg.hidden_size, cfg.head_dim
    dims = (d, cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd, hd, cfg.intermediate_size)
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (d, cfg.num_context_features), "hidden_norm.weight": (d,)}
    for layer in range(cfg.num_hidden_layers):
        shapes.update({f"layers.{layer}.{name}": shape(*dims) for name, shape in LAYER_TENSORS})
    shapes["norm.weight"] = (d,)
    return shapes
