"""`python -m engine gpu-check`: build the CUDA extension, run the CUDA tests, decode on the GPU, print a table.

Needs only what a bare GPU server has: torch, numpy, pytest (no streamlit, plotly or nvtx).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import numpy as np
import torch

from engine.config import DecodeConfig
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.loaders.kdtr import read_kdtr
from engine.model.target import TargetModel

CUDA_TESTS = ("tests/test_ops_cuda.py", "tests/test_decode_cuda.py", "tests/test_dflash_cuda.py",
              "tests/test_linear_rows_cuda.py", "tests/test_moe_cuda.py", "tests/test_expert_rows.py",
              "tests/test_rms_norm_rows.py", "tests/test_model_layers.py", "tests/test_cache_attn.py",
              "tests/test_head_norm_rope.py", "tests/test_moe_route.py", "tests/test_commit_path.py",
              "tests/test_latent_write.py", "tests/test_latent_cache_write.py", "tests/test_add_rms_norm.py",
              "tests/test_silu_mul.py", "tests/test_router_logits.py", "tests/test_context_write.py",
              "tests/test_verify_attn_exact.py", "tests/test_budget_ops_cuda.py", "tests/test_graph_kernels.py",
              "tests/test_cuda_compile.py")
# files that mix CUDA tests with CPU ones: gpu-check runs only their CUDA tests (pytest -m cuda; tests/conftest.py
# marks every test skipped for want of a GPU)
CUDA_MARKED_TESTS = ("tests/test_auto_budget.py", "tests/test_budget_ops.py", "tests/test_capture_view.py",
                     "tests/test_graph_switch.py", "tests/test_graph_upload.py", "tests/test_hf_weights.py",
                     "tests/test_parallel.py", "tests/test_sampling.py", "tests/test_train_target.py")


def _decode_checks(fixture: str) -> list[tuple[str, bool, str]]:
    ckpt = read_kdtr(fixture)
    prompt, golden = ckpt.prompt.tolist(), ckpt.golden_tokens.tolist()
    rows = []
    runs = {}
    for dtype in ("float32", "bfloat16"):
        model = TargetModel.from_checkpoint(ckpt, "cuda", dtype)
        cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=len(golden), device="cuda", dtype=dtype)
        ar = decode(ckpt, prompt, cfg, "ar", model=model)
        dds = [decode(ckpt, prompt, cfg, "ddtree", DrafterSpec(noise=noise, seed=1), model=model)
               for noise in (0.0, 0.5)]
        runs[dtype] = ar
        same = all(dd.tokens == ar.tokens for dd in dds)
        if dtype == "float32":
            ok = same and ar.tokens == golden
            diff = float(np.abs(ar.logits - ckpt.golden_logits).max())
            rows.append(("decode fp32: DDTree == AR == golden", ok, f"max |logit - golden| {diff:.2e}"))
        else:
            tau = (dds[0].num_committed - 1) / max(dds[0].num_steps, 1)
            rows.append(("decode bf16: DDTree == AR", same, f"exact-oracle tokens/step {tau:.2f}"))
    fp32, bf16 = runs["float32"], runs["bfloat16"]
    for pos, (a, b) in enumerate(zip(fp32.tokens, bf16.tokens, strict=True)):
        if a != b:
            top2 = np.sort(fp32.logits[pos])[-2:]
            print(f"bf16 differs from fp32 at position {pos}: fp32 {a}, bf16 {b}; "
                  f"fp32 top-1/top-2 logit gap there {top2[1] - top2[0]:.4f}")
            break
    return rows


def gpu_check(fixture: str, pytest_args: list[str]) -> int:
    if not torch.cuda.is_available():
        print("gpu-check needs a CUDA GPU: torch sees none (torch.cuda.is_available() is False)")
        return 2
    from kernels import build_info, load

    start = time.perf_counter()
    load()
    rows = [("build extension (CPU + CUDA)", True, f"{time.perf_counter() - start:.1f} s; {build_info()}")]
    for files, select in ((CUDA_TESTS, []), (CUDA_MARKED_TESTS, ["-m", "cuda"])):
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", *select, *files, *pytest_args], check=False)
        rows.append((" ".join(["pytest", *select, *files]), result.returncode == 0, f"exit {result.returncode}"))
    rows += _decode_checks(fixture)
    print(f"\n{torch.cuda.get_device_name()} | torch {torch.__version__} | CUDA {torch.version.cuda}")
    width = max(len(r[0]) for r in rows)
    for name, ok, detail in rows:
        print(f"{'PASS' if ok else 'FAIL'}  {name:<{width}}  {detail}")
    return 0 if all(ok for _, ok, _ in rows) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gpu-check", help="build the CUDA kernels, run the CUDA tests, decode on the GPU")
    p.add_argument("--fixture", default="models/model_tiny.kdtr")
    p.add_argument("pytest_args", nargs="*", help="extra arguments for pytest")
    p.set_defaults(func=lambda a: gpu_check(a.fixture, a.pytest_args))
