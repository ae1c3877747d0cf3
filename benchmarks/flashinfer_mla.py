"""FlashInfer's MLA kernel (`flashinfer.mla.BatchMLAPagedAttentionWrapper`) on bench_kernels' verify_attn inputs,
where FlashInfer imports (never a requirement; it travels to the H200 as a wheel, docs/ops.md).

Two ways to time it, both checked against the float64 reference:
- the prefix pass alone: every node over the S - N committed rows (non-causal, pages of one row), what a serving
  engine's MLA decode kernel does for the tree's prefix;
- the whole verify: that prefix pass, then the tree's own rows by our verify_attn at prefix_len 0 with the node
  mask (FlashInfer's MLA kernel takes no custom mask), the two merged by their log-sum-exps (`merge`, in torch:
  FlashInfer's own merge_state does not launch at R = 512). FlashInfer's log-sum-exp is base 2 (its default),
  ours is natural, so its is multiplied by ln 2 before the merge.
"""
from __future__ import annotations

import math
from types import ModuleType

import torch

from benchmarks.baselines import SCALE, AttnSet
from kernels import ops

WORKSPACE_BYTES = 128 * 1024 * 1024  # FlashInfer's own examples' float workspace


def load() -> tuple[ModuleType | None, str]:
    """(flashinfer, a line saying what bench_kernels does with it) or (None, why it is skipped)."""
    try:
        import flashinfer  # optional: never installed by the project
    except Exception as err:  # noqa: BLE001  (any failure to import means: skip it)
        return None, f"FlashInfer: skipped (does not import here: {type(err).__name__})"
    return flashinfer, (f"FlashInfer {flashinfer.__version__}: timed beside ours (its MLA prefix pass alone, and the "
                        "prefix pass + our tree rows + the merge)")


class FlashInferVerify:
    """One verify_attn shape planned once for FlashInfer: `prefix(a)` and `verify(a)` for any AttnSet of it."""

    def __init__(self, flashinfer: ModuleType, a: AttnSet) -> None:
        n, heads, rank = a.q_lat.shape
        device = a.q_lat.device
        self._prefix = a.prefix
        workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.int8, device=device)
        self._wrapper = flashinfer.mla.BatchMLAPagedAttentionWrapper(workspace, backend="auto")

        def i32(values: list[int] | torch.Tensor) -> torch.Tensor:
            return torch.as_tensor(values, dtype=torch.int32, device=device)

        self._wrapper.plan(i32([0, n]), i32([0, a.prefix]), i32(torch.arange(a.prefix)), i32([a.prefix]), heads,
                           rank, a.q_pe.shape[-1], 1, False, SCALE, a.q_lat.dtype, a.ckv.dtype)
        self._no_prefix = torch.zeros((), dtype=torch.int64, device=device)

    def prefix(self, a: AttnSet) -> tuple[torch.Tensor, torch.Tensor]:
        """o_lat [N, H, R] and base-2 lse [N, H] of every node over the committed rows alone."""
        return self._wrapper.run(a.q_lat, a.q_pe, a.ckv[:, None, :], a.kpe[:, None, :], return_lse=True)

    def verify(self, a: AttnSet) -> torch.Tensor:
        """o_lat [N, H, R] over the prefix and the rows each node's mask allows, as verify_attn computes it."""
        o_prefix, lse_prefix = self.prefix(a)
        tree = ops.verify_attn(a.q_lat, a.q_pe, a.ckv[self._prefix:], a.kpe[self._prefix:], self._no_prefix,
                               a.block_mask, SCALE)
        return merge(o_prefix, lse_prefix * math.log(2.0), tree.o_lat, tree.lse)


def merge(o_a: torch.Tensor, lse_a: torch.Tensor, o_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Two attention states over disjoint key sets ([N, H, R] outputs, [N, H] natural log-sum-exps) as one, in
    float32 (FlashInfer 0.5.3's merge_state does not launch at R = 512 on the H200: "invalid argument")."""
    top = torch.maximum(lse_a, lse_b)
    w_a, w_b = (lse_a - top).exp()[..., None], (lse_b - top).exp()[..., None]
    return ((w_a * o_a.float() + w_b * o_b.float()) / (w_a + w_b)).to(o_a.dtype)
