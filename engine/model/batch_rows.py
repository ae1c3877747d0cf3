"""How the target's forward computes its rows: in the fast mode, or in one of the batch-invariant mode's two ways.

The forward's per-row work (norms, projections, the FFN, the head) goes through a Rows: `run(fn, *rows)` calls fn on
the rows, `linear` is F.linear, `absorb` and `expand` the per-head maps of absorbed attention (q_nope through W_UK,
the latent output through W_UV), `rms_norm`, `add_rms_norm` (a residual add and the norm after it), `gated`
(SwiGLU's silu(gate) * up), `router` an MoE router's float32 logits (torch's float32 matmul in the fast mode; in the
batch-invariant one ops.router_logits on CUDA, each logit in an order fixed by H) and `routed` the routed experts'
output. The routing is each row alone in every mode (ops.moe_route: engine/model/moe.py route_and_count).
- FAST: every row at once through torch's kernels, whose reductions (matmuls, means) change order with the row count.
- InvariantRows (batch-invariant, the CPU and CUDA): every row at once through ops whose every output is reduced in
  an order fixed by its row alone: kernels.ops.linear_rows for the matmuls and each routed expert over the rows that
  chose it (one grouped call per projection), ops.rms_norm_rows for the norms, ops.expert_combine for a token's k
  expert outputs. No row padding: an AR step's row costs one row's
  work. Elementwise work rounds each element alike whatever the call holds (on CUDA the norms and SwiGLU's
  activation are every mode's fused ops: engine/model/layers.py), except torch's CPU silu, which computes the elements
  past a tensor's last full vectors by a scalar path that rounds differently: on the CPU InvariantRows pads each row
  to a multiple of ROW_VECTOR elements for it.
- BlockRows (batch-invariant, the fallback where linear_rows' bfloat16 kernel does not run: CUDA before sm_80):
  blocks of exactly ROW_BLOCK rows, the last zero-padded; a kernel is chosen by its shapes, so every row goes through
  the same kernels whatever the call holds; the experts padded alike (engine/model/moe.py).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.layers import add_rms_norm, needs_autograd, rms_norm, router_logits, rowwise, silu_mul
from engine.model.moe import Experts, dense_moe, sparse_moe
from kernels import ops

ROW_BLOCK = 16  # rows per block in BlockRows: AR's single row is padded to one block
ROW_VECTOR = 64  # elements: two of torch's widest CPU vectors (AVX-512 bfloat16), so no row ends in a scalar tail
GRAIN_ELEMENTS = 32768  # at::internal::GRAIN_SIZE: a pointwise call of at most this many elements runs on one thread


def per_head_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [N, H, a] through weight [H, a, b], head by head: [N, H, b]. On CUDA one batched matmul writes straight into
    contiguous [N, H, b] rows (the batch strided by b, each head's rows by H b), where einsum's [H, N, b] result needed
    a copy of its own (verify_attn reads q_lat contiguous; o_proj the heads side by side): 16.8 MB at N = 257 on
    Kimi-K2. einsum on the CPU (there the batched matmul into strided rows was slower at 65 rows) and where autograd
    needs it (out= records no backward)."""
    if not x.is_cuda or needs_autograd(x, weight):
        return torch.einsum("nha,hab->nhb", x, weight)
    out = x.new_empty(x.shape[0], x.shape[1], weight.shape[2])
    torch.bmm(x.transpose(0, 1), weight, out=out.transpose(0, 1))
    return out


class FastRows:
    """Every row at once, torch's kernels (the fast mode)."""

    exact = False
    pads = False  # whether run() pads the rows (the forward then marks which are real)

    def run(self, fn, *rows: torch.Tensor):
        return fn(*rows)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    def absorb(self, q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        """q_nope [N, H, nope] through w_uk [H, nope, R]: [N, H, R]."""
        return per_head_matmul(q_nope, w_uk)

    def expand(self, o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
        """o_lat [N, H, R] through w_uv [H, v, R]: [N, H, v]."""
        return per_head_matmul(o_lat, w_uv.transpose(1, 2))

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return rms_norm(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, delta, weight, eps, self.rms_norm)

    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul(gate_up)

    def router(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), weight)

    def routed(self, sparse: bool, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts
               ) -> torch.Tensor:
        """The routed experts' output [N, H]: each token's top-k (sparse) or the dense reference. An id of E (another
        rank's expert) adds nothing."""
        if sparse:
            return sparse_moe(x, idx, weights, experts, self.exact)
        return dense_moe(x, idx, weights, experts)


class BlockRows(FastRows):
    """The batch-invariant mode where linear_rows' bfloat16 kernel does not run: torch's kernels on blocks of exactly
    ROW_BLOCK rows."""

    exact = True
    pads = True

    def run(self, fn, *rows: torch.Tensor):
        return rowwise(fn, ROW_BLOCK, *rows)


class InvariantRows:
    """The batch-invariant mode through ops.linear_rows, on the CPU (float32: a bfloat16 model's rows are computed in
    float32 and rounded back) and on CUDA (in the rows' dtype). Weights are packed on first use and kept (keyed by the
    weight tensor, which the model holds as long as it holds this): on the CPU a float32 copy of every weight, made by
    the mode's first forward; on CUDA the weights themselves where their K is a multiple of 8."""

    pads = False

    def __init__(self, device: torch.device) -> None:
        self.on_cpu = device.type == "cpu"
        self._packed: dict[tuple[int, bool, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def _dtype(self, x: torch.Tensor) -> torch.dtype:
        return torch.float32 if self.on_cpu else x.dtype

    def packed(self, weight: torch.Tensor, dtype: torch.dtype, in_out: bool = False) -> torch.Tensor:
        """weight [N, K] (or [G, N, K]; in_out: [G, K, N]) packed for ops.linear_rows at dtype, once."""
        key = (id(weight), in_out, dtype)
        if key not in self._packed:
            self._packed[key] = (weight, ops.pack_linear_rows(weight.transpose(1, 2) if in_out else weight, dtype))
        return self._packed[key][1]

    def _rows(self, x: torch.Tensor, weight: torch.Tensor, out_features: int, in_out: bool = False,
              group_ends: torch.Tensor | None = None) -> torch.Tensor:
        dtype = self._dtype(x)
        out = ops.linear_rows(x.to(dtype), self.packed(weight, dtype, in_out), out_features, group_ends)
        return out.to(x.dtype)

    def run(self, fn, *rows: torch.Tensor):
        return fn(*rows)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = self._rows(x.reshape(-1, x.shape[-1]), weight, weight.shape[0])
        return out.reshape(*x.shape[:-1], weight.shape[0])

    def absorb(self, q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        return self._rows(q_nope, w_uk, w_uk.shape[2], in_out=True)

    def expand(self, o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
        return self._rows(o_lat, w_uv, w_uv.shape[1])

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """layers.rms_norm with each row reduced in an order fixed by its width alone (ops.rms_norm_rows)."""
        return ops.rms_norm_rows(x, weight, eps)

    def add_rms_norm(self, x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, delta, weight, eps, self.rms_norm)

    def router(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return router_logits(x, weight, self.linear)

    def gated(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, each row's silu on the CPU over whole vectors (_whole_vectors)."""
        if not self.on_cpu:
            return silu_mul(gate_up)
        gate, up = gate_up.tensor_split(2, dim=-1)
        return _whole_vectors(F.silu, gate) * up

    def routed(self, sparse: bool, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts
               ) -> torch.Tensor:
        """Each chosen expert over the rows that chose it (sparse or not: the dense reference's result, each row
        alone): the token-expert assignments grouped by expert (ops.expert_rows), one grouped linear_rows per
        projection, and a token's k outputs summed in float32 in its own rank order (ops.expert_combine), on the
        device with nothing read on the host. An expert id past the held ones (another rank's) sorts past every
        group and adds nothing."""
        num_experts, hidden, width = experts.down.shape
        rows, slots, ends = ops.expert_rows(x, idx, num_experts)
        gate_up = self._rows(rows, experts.gate_up, 2 * width, group_ends=ends)
        out = self._rows(self.gated(gate_up), experts.down, hidden, group_ends=ends)
        return ops.expert_combine(out, slots, weights.float(), ends)


def _whole_vectors(fn, t: torch.Tensor) -> torch.Tensor:
    """An elementwise fn over t [..., D], each row zero-padded to a multiple of ROW_VECTOR elements, in calls of at
    most GRAIN_ELEMENTS elements (or one row): torch runs such a call on one thread, whose vector loop then takes
    every element, where a call split over threads could start a thread's share (and end the last one's) mid-vector.
    Every row then goes through the same instructions whatever the call holds."""
    width = t.shape[-1]
    rows = F.pad(t.reshape(math.prod(t.shape[:-1]), width), (0, -width % ROW_VECTOR))
    out = torch.cat([fn(part) for part in rows.split(max(1, GRAIN_ELEMENTS // max(1, rows.shape[1])))])
    return out[:, :width].reshape(t.shape)


FAST = FastRows()


def exact_rows(device: torch.device, dtype: torch.dtype) -> FastRows | InvariantRows:
    """The batch-invariant mode's rows for a model's device and dtype: InvariantRows wherever linear_rows runs at that
    dtype (the CPU; CUDA in float32, and in bfloat16 from sm_80), BlockRows elsewhere."""
    if device.type == "cpu" or dtype == torch.float32 or (
            dtype == torch.bfloat16 and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8):
        return InvariantRows(device)
    return BlockRows()
