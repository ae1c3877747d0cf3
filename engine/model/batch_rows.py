"""How the target's forward computes its rows: in the fast mode, or in one of the batch-invariant mode's two ways.

The forward's per-row work (norms, projections, the FFN, the head) goes through a Rows: `run(fn, *rows)` calls fn on
the rows, `linear` is F.linear, `absorb` and `expand` the per-head maps of absorbed attention (q_nope through W_UK,
the latent output through W_UV), `silu` and `sigmoid` the activations and `routed` the routed experts' output.
- FAST: every row at once through torch's kernels, whose matmul reduction order changes with the row count.
- BlockRows (batch-invariant, CUDA): blocks of exactly ROW_BLOCK rows, the last zero-padded. A kernel is chosen by
  its shapes, so every row goes through the same kernels whatever the call holds; the experts padded alike
  (engine/model/moe.py).
- InvariantRows (batch-invariant, CPU): every row at once through kernels.ops.linear_rows, whose every output is a
  chain fixed by its row alone, and each routed expert over the rows that chose it. No row padding: an AR step's row
  costs one row's work. torch's CPU sigmoid and silu compute the elements past a tensor's last full vectors by a
  scalar path that rounds differently, so which of a row's elements take it would depend on the rows before it:
  InvariantRows pads each row to a multiple of ROW_VECTOR elements for them (norms, softmax and the matmuls' other
  elementwise work round alike on both paths).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.model.layers import rowwise
from engine.model.moe import Experts, dense_moe, sparse_moe
from kernels import ops

ROW_BLOCK = 16  # rows per block in BlockRows: AR's single row is padded to one block
ROW_VECTOR = 64  # elements: two of torch's widest CPU vectors (AVX-512 bfloat16), so no row ends in a scalar tail
GRAIN_ELEMENTS = 32768  # at::internal::GRAIN_SIZE: a pointwise call of at most this many elements runs on one thread


class FastRows:
    """Every row at once, torch's kernels (the fast mode)."""

    exact = False

    def run(self, fn, *rows: torch.Tensor):
        return fn(*rows)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)

    def absorb(self, q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        """q_nope [N, H, nope] through w_uk [H, nope, R]: [N, H, R]."""
        return torch.einsum("nhd,hdr->nhr", q_nope, w_uk)

    def expand(self, o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
        """o_lat [N, H, R] through w_uv [H, v, R]: [N, H, v]."""
        return torch.einsum("nhr,hvr->nhv", o_lat, w_uv)

    def silu(self, t: torch.Tensor) -> torch.Tensor:
        return F.silu(t)

    def sigmoid(self, t: torch.Tensor) -> torch.Tensor:
        return t.sigmoid()

    def routed(self, sparse: bool, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts,
               foreign: bool) -> torch.Tensor:
        """The routed experts' output [N, H]: each token's top-k (sparse) or the dense reference."""
        if sparse:
            return sparse_moe(x, idx, weights, experts, self.exact, foreign=foreign)
        return dense_moe(x, idx, weights, experts)


class BlockRows(FastRows):
    """The batch-invariant mode on CUDA: torch's kernels on blocks of exactly ROW_BLOCK rows."""

    exact = True

    def run(self, fn, *rows: torch.Tensor):
        return rowwise(fn, ROW_BLOCK, *rows)


class InvariantRows:
    """The batch-invariant mode on the CPU: every matmul through ops.linear_rows, its weights packed on first use and
    kept (keyed by the weight tensor, which the model holds as long as it holds this): a float32 copy of the
    weights, made by the mode's first forward."""

    def __init__(self) -> None:
        self._packed: dict[tuple[int, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    def packed(self, weight: torch.Tensor, in_out: bool = False) -> torch.Tensor:
        """weight [N, K] (or [G, N, K]; in_out: [G, K, N]) packed for ops.linear_rows, once."""
        key = (id(weight), in_out)
        if key not in self._packed:
            self._packed[key] = (weight, ops.pack_linear_rows(weight.transpose(1, 2) if in_out else weight))
        return self._packed[key][1]

    def run(self, fn, *rows: torch.Tensor):
        return fn(*rows)

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        out = ops.linear_rows(x.reshape(-1, x.shape[-1]).float().contiguous(), self.packed(weight), weight.shape[0])
        return out.reshape(*x.shape[:-1], weight.shape[0]).to(x.dtype)

    def absorb(self, q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
        return ops.linear_rows(q_nope.float(), self.packed(w_uk, in_out=True), w_uk.shape[2]).to(q_nope.dtype)

    def expand(self, o_lat: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
        return ops.linear_rows(o_lat.float(), self.packed(w_uv), w_uv.shape[1]).to(o_lat.dtype)

    def silu(self, t: torch.Tensor) -> torch.Tensor:
        return _whole_vectors(F.silu, t)

    def sigmoid(self, t: torch.Tensor) -> torch.Tensor:
        return _whole_vectors(torch.sigmoid, t)

    def routed(self, sparse: bool, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts,
               foreign: bool) -> torch.Tensor:
        """Each chosen expert over the rows that chose it (sparse or not: the dense reference's result, each row
        alone), a token's k outputs summed in float32 in its own rank order. An expert id past the held ones
        (foreign: another rank's) adds nothing."""
        n, k = idx.shape
        num_experts, hidden, width = experts.down.shape
        gate_up, down = self.packed(experts.gate_up), self.packed(experts.down)
        out = torch.zeros(n, k, hidden, dtype=torch.float32, device=x.device)
        for e in idx.unique().tolist():  # read on the host: this runs on the CPU only
            if e >= num_experts:
                continue
            token, slot = (idx == e).nonzero(as_tuple=True)
            gate, up = ops.linear_rows(x[token, None].float(), gate_up[e:e + 1], 2 * width)[:, 0].chunk(2, dim=-1)
            out[token, slot] = ops.linear_rows((self.silu(gate) * up)[:, None], down[e:e + 1], hidden)[:, 0]
        return (out * weights.unsqueeze(-1).float()).sum(1).to(x.dtype)


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


def exact_rows(device: torch.device) -> FastRows | InvariantRows:
    """The batch-invariant mode's rows on a model's device: InvariantRows on the CPU, BlockRows elsewhere."""
    return InvariantRows() if device.type == "cpu" else BlockRows()
