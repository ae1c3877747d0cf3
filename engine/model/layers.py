"""The layer functions the target, the DFlash drafter and the trainers share: RMSNorm, SwiGLU, RoPE, and rows in
fixed blocks (the batch-invariant mode's matmuls on CUDA: engine/model/batch_rows.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import ops

ROPE_OP_MAX_DIM = 512  # the widest head ops.head_norm_rope takes (kMaxHeadNormRopeDim, kernels/csrc/checks.h)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim, in float32, rounded to x's dtype once. On CUDA one
    launch: ops.rms_norm_rows (16-byte loads, all in flight: about 2x faster than torch's fused kernel at a decode
    step's few rows on the H200, where the float32 ops below would take eight launches), or torch's fused kernel
    where autograd needs it (the trainers); within a bfloat16 ulp of the float32 ops."""
    if x.is_cuda:
        if needs_autograd(x, weight):
            return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)
        return ops.rms_norm_rows(x, weight if weight.dtype == torch.float32 else weight.to(x.dtype), eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, norm=rms_norm
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after a block and the norm the next block reads: (x + delta, norm(x + delta)). On CUDA one
    ops.add_rms_norm launch (rms_norm's bits there, in every mode) where the add and the norm took two; else, and
    under autograd, the add and norm (the batch-invariant mode's on the CPU: engine/model/batch_rows.py)."""
    if x.is_cuda and not needs_autograd(x, delta, weight):
        return ops.add_rms_norm(x, delta, weight if weight.dtype == torch.float32 else weight.to(x.dtype), eps)
    x = x + delta
    return x, norm(x, weight, eps)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of gate_up [..., 2I]'s halves (a fused gate/up projection's output): on CUDA one ops.silu_mul
    launch with the bits of the two torch kernels it replaces; torch's where autograd needs it and on the CPU."""
    if gate_up.is_cuda and not needs_autograd(gate_up):
        return ops.silu_mul(gate_up)
    gate, up = gate_up.tensor_split(2, dim=-1)
    return F.silu(gate) * up


def router_logits(x: torch.Tensor, weight: torch.Tensor, linear=F.linear) -> torch.Tensor:
    """The batch-invariant mode's MoE router: float32 logits [N, E] of x [N, H] through the float32 weight [E, H].
    On CUDA one ops.router_logits launch, no float32 copy of x and each logit in an order fixed by H; linear(x.float(),
    weight) where autograd needs it and on the CPU (linear: the mode's matmul). The fast mode keeps cuBLAS's float32
    gemm, 2-3x faster past a few rows (benchmarks/RESULTS.md)."""
    if x.is_cuda and not needs_autograd(x, weight):
        return ops.router_logits(x, weight)
    return linear(x.float(), weight)


def swiglu(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, linear=F.linear, gated=silu_mul
           ) -> torch.Tensor:
    """down(silu(gate x) * up x) with gate_up the gate and up projections stacked [2I, d] (fused_rows): one matmul
    for both. linear, gated: the batch-invariant mode's on the CPU (engine/model/batch_rows.py), else silu_mul and
    torch's matmul."""
    return linear(gated(linear(x, gate_up)), down)


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """Whether an op on tensors would be recorded for backward (a trainer's forward): the fused ops have none."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def fused_rows(*weights: torch.Tensor) -> torch.Tensor:
    """Projections of the same input stacked along their output rows, so that one matmul computes them all: done
    once when weights load (a trainer's parameters: on every forward, through autograd)."""
    return torch.cat(weights, dim=0)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """x [..., P] with cos/sin [N, P/2] broadcast over the middle dims; NeoX rotate-half layout.
    interleave=True first permutes (x0, x1, x2, ...) to evens-then-odds, as transformers does.

    Without autograd, a [N, P] or [N, H, P] float32 / bfloat16 x is one ops.head_norm_rope launch (no norm weight;
    x's rows and heads at any stride): the target's q_pe and k_pe take two launches a layer where the forms below
    take four (complex, CUDA) or ten (real, the CPU) each. Each row alone, so in both modes. The trainers' forms:
    _rope_complex on CUDA, the real arithmetic below on the CPU (whose bits do not depend on the call's size)."""
    if _rope_op_takes(x, cos, sin) and not needs_autograd(x):
        heads = x if x.dim() == 3 else x[:, None]
        return ops.head_norm_rope(heads, None, cos, sin, 0.0, interleave).view(x.shape)
    if x.is_cuda:
        return _rope_complex(x, cos, sin, interleave)
    if interleave:
        x = torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1)
    x1, x2 = x.float().chunk(2, dim=-1)
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.view(shape), sin.view(shape)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def _rope_op_takes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    return (x.dim() in (2, 3) and x.dtype in (torch.float32, torch.bfloat16) and cos.dtype == torch.float32
            and x.shape[-1] <= ROPE_OP_MAX_DIM and x.stride(-1) == 1 and cos.is_contiguous() and sin.is_contiguous())


def _rope_complex(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """apply_rope on CUDA under autograd: each rotated pair one complex number times e^(i theta) in float32
    (rotate-half pairs dim j with j + P/2; the interleaved layout j with j + 1, whose result then lands in
    evens-then-odds order). Four kernels where the real arithmetic takes ten. Not on the CPU: there a complex
    multiply's vector and scalar paths round differently, so a row's bits would depend on the call's size."""
    half = x.shape[-1] // 2
    xf = x.float()
    pairs = xf.unflatten(-1, (half, 2)) if interleave else xf.unflatten(-1, (2, half)).transpose(-1, -2).contiguous()
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (half,)
    turned = torch.view_as_real(torch.view_as_complex(pairs) * torch.complex(cos, sin).view(shape))  # [..., P/2, 2]
    return turned.transpose(-1, -2).to(x.dtype, memory_format=torch.contiguous_format).flatten(-2)


def rowwise(fn, row_block: int | None, *rows: torch.Tensor):
    """fn over tensors that share their first (row) dimension: at once, or on blocks of exactly row_block rows
    (the last zero-padded, its padding dropped from the result). fn returns a tensor or a tuple of them."""
    if row_block is None:
        return fn(*rows)
    n = rows[0].shape[0]
    padded = [torch.cat([t, t.new_zeros((-n % row_block, *t.shape[1:]))]) for t in rows]
    blocks = [fn(*(t[s:s + row_block] for t in padded)) for s in range(0, padded[0].shape[0], row_block)]
    if isinstance(blocks[0], tuple):
        return tuple(torch.cat(parts)[:n] for parts in zip(*blocks, strict=True))
    return torch.cat(blocks)[:n]
