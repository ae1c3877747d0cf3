"""bench_kernels' verify_attn_splits section: the batch-invariant verify_attn beside the fast one at every verify_attn
shape, on CUDA also at each other split target (DDTREE_VERIFY_ATTN_EXACT_SPLITS: the most splits a row is cut into;
a row's split is the shortest 256 x 2^k positions that makes at most that many). Fewer, longer splits cost a large
tree fewer folds of its state and an AR call (N = 1) parallelism; the default is the target this section picked.
Only ours are timed (no torch, FlashInfer or mma.sync columns), so a sweep fits one device call."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from benchmarks.baselines import attn_sets, exact_attention, ours_attention
from benchmarks.common import Budget, Column, guarded, op_setting, ratio

SPLIT_TARGETS = (16, 32, 64, 128)  # 32: the kernel's default; 128: every 256 positions up to S = 32768
TARGET_VAR = "DDTREE_VERIFY_ATTN_EXACT_SPLITS"


def splits_case(n: int, s: int, device: torch.device, dtype: torch.dtype, budget: Budget, rng: np.random.Generator,
                measure: Callable) -> dict:
    sets = attn_sets(n, s, dtype, device, rng)
    row: dict = {"N": n, "S": s, "ours_us": measure(ours_attention, sets, device, budget).us}
    row["exact_us"] = measure(exact_attention, sets, device, budget).us
    row["exact_over_ours"] = ratio(row["exact_us"], row["ours_us"])
    for target in SPLIT_TARGETS if device.type == "cuda" else ():
        with op_setting(TARGET_VAR, str(target)):
            row[f"exact_{target}_us"] = measure(exact_attention, sets, device, budget).us
        row[f"exact_{target}_over_ours"] = ratio(row[f"exact_{target}_us"], row["ours_us"])
    return row


def bench_exact_splits(attn_nodes: Sequence[int], attn_rows: Sequence[int], device: torch.device,
                       dtype: torch.dtype, budget: Budget, rng: np.random.Generator, measure: Callable) -> list[dict]:
    return [guarded({"N": n, "S": s}, lambda n=n, s=s: splits_case(n, s, device, dtype, budget, rng, measure))
            for s in attn_rows for n in attn_nodes]


SPLITS_COLUMNS = [
    Column("N", "N", "{}"), Column("S", "S", "{}"), Column("ours_us", "ours us", "{:.1f}"),
    Column("exact_us", "batch-inv. us", "{:.1f}"), Column("exact_over_ours", "batch-inv./ours", "{:.2f}"),
    *[Column(f"exact_{t}_over_ours", f"at {t} splits / ours", "{:.2f}") for t in SPLIT_TARGETS],
]
