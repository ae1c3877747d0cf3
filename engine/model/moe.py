"""Mixture of experts: routing, the stacked expert weights, the sparse forward over each token's top-k experts, the
dense all-experts reference, and the count of the routed experts a forward touched.

The sparse forward (sparse_moe) groups the N x k (token, expert) assignments' rows by expert (kernels.ops.expert_rows:
a counting sort and a copy, two launches), runs them as two grouped matmuls, gate and up together, then down, whose
groups are the experts and whose group ends live on the device, and sums each token's k outputs back
(ops.expert_combine, one launch). Shapes are static (N x k rows whatever the routing) and nothing is read on the
host, so a CUDA step still captures in a graph; an expert no token chose is a group of no rows and its weights are
not read. The grouped matmul (grouped_matmul) is ours, kernels.ops.linear_rows with group ends, where its wgmma kernel
runs (bfloat16 on an H100/H200): at Kimi-K2's widths the routed layer runs at 0.98-1.04x the bytes floor of the
experts it touches at 17 to 257 tokens and 1.28x at one, where it takes 1.28-1.83x through torch._grouped_mm
(bench_moe's moe layer; docs/moe.md). Elsewhere it is torch._grouped_mm: on CUDA its CUTLASS kernel wants bfloat16
on compute capability 9.x / 10.x and fewer than 1024 experts, and (on every device) 16-byte rows, hidden and expert
widths a multiple of 8 in bfloat16, 4 in float32. Elsewhere on CUDA (float32, other GPUs) torch falls back to a loop
that reads the group ends on the host, which a graph cannot capture, so there the model runs the dense reference
(sparse_runs, default_path).

On the CPU torch's _grouped_mm is that loop, one matmul per expert in C++. A small matmul's call costs about as much
as its arithmetic there (about 5 us in float32, 25 us in bfloat16, whatever its size), so a layer whose routed
experts are small runs dense, in three batched calls. Measured with one thread on a 2-core Xeon at 1 to 257 tokens in
both dtypes, the grouped layout took 0.6-2.2x the dense time with the tiny fixture's experts (8 of 64 x 32: 192 KiB
in float32), 0.45-1.45x with 1.5 MiB of experts and 0.03-0.8x from 3 MiB up (32 or 64 experts, top-4 or top-8);
hence CPU_SPARSE_MIN_BYTES.

Batch invariance: torch's grouped GEMM multiplies each expert's rows as one matrix, and on the CPU a matmul's
reduction order depends on its row count, so a row's result would depend on how many other rows chose its expert.
The batch-invariant mode runs its own experts instead (engine/model/batch_rows.py InvariantRows.routed: one grouped
kernels.ops.linear_rows per projection, the kernel the fast mode runs on an H100/H200); where that does not run
(BlockRows: CUDA before sm_80, exact=True here) it gives every chosen expert exactly N rows (N = the rows of the
call: fixed blocks of ROW_BLOCK in that mode, and no expert gets more, since a token chooses an expert at most once),
zero rows filling the rest; every matmul then has the same shape and a row's result depends on that row alone. On
CUDA the grouped kernel picks its tiling from the static shapes only (torch's GroupMM.cu) and computes each output
row from that row and its group's weights, and the padding costs no extra tiles there (a tile is 64 rows or more).
The dense reference is per-row exact as it is. A token's k expert outputs are summed in float32 in its own rank
order.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.model.layers import silu_mul
from kernels import ops

EXPERT_TENSOR = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")
MAX_GROUPED_EXPERTS = 1023  # torch's CUTLASS grouped GEMM takes fewer than 1024 groups
GROUPED_MATMULS = ("linear_rows", "grouped_mm")  # the sparse forward's grouped matmul: ours, or torch._grouped_mm
CPU_SPARSE_MIN_BYTES = 2 * 2**20  # a layer's routed experts below this run dense on the CPU (module docstring)


@dataclass(slots=True)
class Experts:
    """One MoE layer's routed experts, stacked: gate_up [E, 2I, H] (each expert's gate rows, then its up rows) and
    down [E, H, I]."""

    gate_up: torch.Tensor
    down: torch.Tensor


def stack_experts(cfg: ModelConfig, tensors: Iterable[tuple[str, torch.Tensor]], held: slice | None = None
                  ) -> tuple[dict[str, torch.Tensor], dict[int, Experts]]:
    """The tensors that are not routed experts, by name, and each MoE layer's experts stacked. Each expert tensor is
    copied into its layer's stack as it arrives and then dropped, so with a stream of tensors (a WeightSource) the
    device holds the model once plus one tensor, whatever order the source reads them in. held: the experts this
    rank keeps (engine/model/parallel.py; None: all); the others are checked and dropped."""
    rest: dict[str, torch.Tensor] = {}
    stacks: dict[int, Experts] = {}
    filled: dict[int, set[tuple[int, str]]] = {}
    num, hidden, inter = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    held = held or slice(0, num)
    kept = held.stop - held.start
    for name, tensor in tensors:
        match = EXPERT_TENSOR.fullmatch(name)
        if match is None:
            rest[name] = tensor
            continue
        layer, expert, proj = int(match[1]), int(match[2]), match[3]
        if not (layer < cfg.num_hidden_layers and cfg.is_moe_layer(layer) and expert < num):
            raise ValueError(f"{name}: the config has no such routed expert (MoE layers "
                             f"{cfg.first_k_dense_replace}..{cfg.num_hidden_layers - 1}, experts 0..{num - 1})")
        want = (hidden, inter) if proj == "down" else (inter, hidden)
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}; the config says {want}")
        if layer not in stacks:
            stacks[layer] = Experts(tensor.new_empty(kept, 2 * inter, hidden), tensor.new_empty(kept, hidden, inter))
            filled[layer] = set()
        if held.start <= expert < held.stop:
            stack, e = stacks[layer], expert - held.start
            rows = {"gate": slice(None, inter), "up": slice(inter, None)}
            (stack.down[e] if proj == "down" else stack.gate_up[e, rows[proj]]).copy_(tensor)
        filled[layer].add((expert, proj))
        del tensor  # before the source makes the next one: the loop variable would keep this one alive until then
    for layer in (i for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)):
        have = filled.get(layer, set())
        missing = next(((e, p) for e in range(num) for p in ("gate", "up", "down") if (e, p) not in have), None)
        if missing is not None:
            raise ValueError(f"model.layers.{layer}.mlp.experts.{missing[0]}.{missing[1]}_proj.weight is missing")
    return rest, stacks


def route(cfg: ModelConfig, logits: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing of float32 router logits [N, E] in torch's ops, which autograd differentiates (the
    trainer's; the engine routes through ops.moe_route, route_and_count): each token's top-k experts [N, k] (chosen on
    the scores plus the correction bias, group-limited) and their float32 weights [N, k] (from the unbiased scores,
    normalised if norm_topk_prob, times routed_scaling_factor)."""
    scores = logits.sigmoid() if cfg.scoring_func == "sigmoid" else logits.softmax(-1)
    choice = scores + bias  # the bias steers selection only
    n, e = choice.shape
    per_group = e // cfg.n_group
    if cfg.n_group > 1:
        group_scores = choice.view(n, cfg.n_group, per_group).topk(min(2, per_group), dim=-1).values.sum(-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(cfg.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), -torch.inf)
    idx = choice.topk(cfg.num_experts_per_tok, dim=-1).indices
    w = scores.gather(1, idx)
    if cfg.norm_topk_prob:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return idx, w * cfg.routed_scaling_factor


def route_and_count(cfg: ModelConfig, logits: torch.Tensor, bias: torch.Tensor, counts: torch.Tensor,
                    real: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's routing of a forward's rows: route()'s choice and weights, and every chosen id of a row that real
    [N] bool marks (None: every row) counted into counts [E] int32 (ExpertLoad's row of the layer). One ops.moe_route
    launch, each row alone and in one order whatever the mode (a warp per row on CUDA), where torch's ops took a
    dozen."""
    return ops.moe_route(logits, bias, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,
                         cfg.scoring_func == "softmax", cfg.norm_topk_prob, cfg.routed_scaling_factor, counts, real)


def sparse_runs(device: torch.device, dtype: torch.dtype, cfg: ModelConfig) -> bool:
    """Whether sparse_moe runs here, and on CUDA without reading the device on the host (the module's docstring).
    torch._grouped_mm wants 16-byte row strides: widths a multiple of 4 in float32, 8 in bfloat16."""
    align = 16 // dtype.itemsize
    if cfg.hidden_size % align or cfg.moe_intermediate_size % align:
        return False
    if device.type == "cpu":
        return True
    if device.type != "cuda" or dtype != torch.bfloat16 or cfg.n_routed_experts > MAX_GROUPED_EXPERTS:
        return False
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


def default_path(device: torch.device, dtype: torch.dtype, cfg: ModelConfig) -> str:
    """"sparse" where it runs and pays, else "dense": on the CPU a layer whose routed experts hold less than
    CPU_SPARSE_MIN_BYTES runs dense (the module's docstring)."""
    if not sparse_runs(device, dtype, cfg):
        return "dense"
    layer_bytes = 3 * cfg.n_routed_experts * cfg.hidden_size * cfg.moe_intermediate_size * dtype.itemsize
    return "dense" if device.type == "cpu" and layer_bytes < CPU_SPARSE_MIN_BYTES else "sparse"


def grouped_matmul(device: torch.device, dtype: torch.dtype) -> str:
    """The sparse forward's grouped matmul here (one of GROUPED_MATMULS; the module's docstring): ours where its
    wgmma kernel runs, else torch's."""
    return "linear_rows" if ops.wgmma_runs(device, dtype) else "grouped_mm"


def local_routing(idx: torch.Tensor, weights: torch.Tensor, first: int, num_local: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """route()'s choice seen by a rank that holds experts first..first + num_local - 1 (engine/model/parallel.py):
    ids made local, another rank's expert marked num_local ("not here") with weight zero."""
    local = idx - first
    here = (local >= 0) & (local < num_local)
    return torch.where(here, local, num_local), torch.where(here, weights, 0.0)


def sparse_moe(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts,
               exact: bool = False, matmul: str | None = None) -> torch.Tensor:
    """Routed experts' output [N, H] for x [N, H] and the routing (route()): each token through its k experts only,
    its rows grouped by expert (ops.expert_rows) and its k outputs summed back in float32 in rank order
    (ops.expert_combine). idx may hold E (local_routing's "another rank's expert"): those assignments sort past every
    group and add nothing. exact: give every chosen expert N rows, so a row's result depends on that row alone (the
    module's docstring). matmul: one of GROUPED_MATMULS (None: grouped_matmul's here)."""
    matmul = matmul or grouped_matmul(x.device, x.dtype)
    if matmul not in GROUPED_MATMULS:
        raise ValueError(f"matmul={matmul!r}: expected one of {GROUPED_MATMULS} or None")
    if matmul == "linear_rows" and x.device.type != "cuda":
        raise ValueError("matmul='linear_rows' runs the expert stacks as they are on CUDA only (the CPU kernel takes "
                         "packed weights: engine/model/batch_rows.py); use 'grouped_mm' or None here")
    rows, slots, ends = ops.expert_rows(x, idx, experts.down.shape[0])  # rows [N k, H] in expert order
    if exact:
        out = _grouped_padded(rows, ends, experts, idx.shape[0], matmul)
    else:
        out = _expert_mlp(rows, experts, ends, matmul)
    return ops.expert_combine(out, slots, weights.float(), ends)


def _expert_mlp(rows: torch.Tensor, experts: Experts, offs: torch.Tensor, matmul: str) -> torch.Tensor:
    """SwiGLU of each group of rows through its expert: rows [M, H], group e = rows offs[e-1]:offs[e] (int32; rows
    past the last: zeros with linear_rows, not computed with torch._grouped_mm)."""
    if matmul == "linear_rows":  # the stacks are [E, N, K] with K a multiple of 8 (sparse_runs): packed as they are
        gate_up = ops.linear_rows(rows, experts.gate_up, experts.gate_up.shape[1], offs)
        return ops.linear_rows(silu_mul(gate_up), experts.down, experts.down.shape[1], offs)
    gate_up = torch._grouped_mm(rows, experts.gate_up.transpose(1, 2), offs=offs)
    return torch._grouped_mm(silu_mul(gate_up), experts.down.transpose(1, 2), offs=offs)


def _grouped_padded(rows: torch.Tensor, ends: torch.Tensor, experts: Experts, capacity: int, matmul: str
                    ) -> torch.Tensor:
    """_expert_mlp over expert_rows' rows and group ends with every chosen expert's group padded with zero rows to
    exactly `capacity` rows (at least its count): the per-row exact layout, its outputs in the rows' order. Static
    shapes, nothing read on the host. The rows past every group (another rank's experts) all go to one scratch row,
    which is never computed."""
    num_experts = len(ends)
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    positions = torch.arange(len(rows), device=rows.device)
    by_expert = torch.searchsorted(ends, positions.int(), right=True)  # each sorted row's expert; E past every group
    chosen = (ends > starts).int()
    offs = (chosen * capacity).cumsum(0, dtype=torch.int32)
    size = min(num_experts, len(rows)) * capacity
    first_slot = torch.cat([offs - chosen * capacity - starts, offs.new_zeros(1)]).long()  # group e's row j: first + j
    place = torch.where(by_expert < num_experts, first_slot[by_expert] + positions, size)
    padded = rows.new_zeros(size + 1, rows.shape[1]).index_copy_(0, place, rows)
    return _expert_mlp(padded, experts, offs, matmul)[place]  # rows past the last chosen group's are never read


def dense_weights(idx: torch.Tensor, weights: torch.Tensor, num_experts: int) -> torch.Tensor:
    """route()'s top-k as dense [N, E] routing weights, zero off each token's chosen experts."""
    return weights.new_zeros(idx.shape[0], num_experts).scatter(1, idx, weights)


def dense_moe(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, experts: Experts) -> torch.Tensor:
    """The reference: every expert on every token, weighted by dense [N, E] routing weights (zero off the top-k). No
    data-dependent shapes and per-row exact; E / k times the expert work of sparse_moe. idx may hold E (another
    rank's expert: local_routing), which adds nothing."""
    num_experts = experts.down.shape[0]
    dense = dense_weights(idx, weights, num_experts + 1)[:, :num_experts]
    gate_up = torch.einsum("nd,eid->eni", x, experts.gate_up)  # [E, N, 2I]
    out = torch.einsum("eni,edi->end", silu_mul(gate_up), experts.down)  # [E, N, H]
    return torch.einsum("end,ne->nd", out.float(), dense).to(x.dtype)


class ExpertLoad:
    """How many of a forward's rows chose each routed expert, per MoE layer: [num_moe_layers, E] int32 on the device,
    zeroed when a forward starts and added to by each of its row blocks' routing (route_and_count; padding rows
    excluded). Nothing is read on the host, so a CUDA graph captures it with the step."""

    def __init__(self, num_layers: int, num_experts: int, device: torch.device) -> None:
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int32, device=device)

    def reset(self) -> None:
        self.counts.zero_()

    def touched(self) -> torch.Tensor:
        """[num_moe_layers] int64: distinct routed experts the last forward's rows chose, per MoE layer."""
        return (self.counts > 0).sum(-1)
