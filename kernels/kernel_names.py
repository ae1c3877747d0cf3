"""Which implementation of an op a CUDA kernel is, by its `__global__` name in csrc/cuda (a profile lists device
kernels by these names): verify_attn's kernels are the DDTREE_VERIFY_ATTN_KERNEL choices plus the batch-invariant
ones (the tensor-core kernel and its combine step, which run in that mode only, and the CUDA-core kernel);
tree_build's last kernel is its heap or its threshold build (the DDTREE_TREE_BUILD choices; the threshold kernel's
fallback to the heap, where the build gives up, runs inside it). verify_attn's split-KV combine kernel and
tree_build's top-k kernels run with every choice, so they name none."""
from __future__ import annotations

IMPLEMENTATIONS = {
    "verify_attn_wgmma_kernel": ("verify_attn", "wgmma"),
    "verify_attn_mma_kernel": ("verify_attn", "mma"),
    "verify_attn_partial_kernel": ("verify_attn", "cuda-core"),
    "verify_attn_exact_kernel": ("verify_attn", "batch-invariant"),
    "verify_attn_exact_wgmma_kernel": ("verify_attn", "batch-invariant"),
    "verify_attn_exact_combine_kernel": ("verify_attn", "batch-invariant"),
    "tree_build_heap_kernel": ("tree_build", "heap"),
    "tree_build_threshold_kernel": ("tree_build", "threshold"),
}


def implementation(identifier: str) -> tuple[str, str] | None:
    """(op, implementation) of a kernel's bare name ("verify_attn_wgmma_kernel"), None for any other kernel."""
    return IMPLEMENTATIONS.get(identifier)
