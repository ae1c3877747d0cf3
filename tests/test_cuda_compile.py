"""The pure CUDA layer builds with plain nvcc for the H200 (sm_90a) and stays free of torch; no GPU needed.

Each kernels/csrc/cuda/*.cu is compiled three times: with the bare command for sm_90a, with the flags
kernels.load() uses on an H100/H200 (torch.utils.cpp_extension's macros, no implicit half/bfloat16
conversions, plus -DDDTREE_SM90A for the wgmma path), and for sm_80, where the wgmma kernel is compiled out.
binding.cpp needs a CUDA build of torch and is compiled only there, by kernels.load().
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parents[1] / "kernels" / "csrc" / "cuda"
SOURCES = sorted(CUDA_DIR.glob("*.cu"))
NVCC = shutil.which("nvcc")
SM90A = "-gencode=arch=compute_90a,code=sm_90a"
TORCH_MACROS = [
    "-D__CUDA_NO_HALF_OPERATORS__",
    "-D__CUDA_NO_HALF_CONVERSIONS__",
    "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-D__CUDA_NO_HALF2_OPERATORS__",
    "--expt-relaxed-constexpr",
]
FLAG_SETS = {
    "plain": [SM90A],
    # what kernels.load() passes on an H100/H200: torch's macros, sm_90a and the wgmma path switched on
    "torch-sm90a": [SM90A, "-DDDTREE_SM90A", *TORCH_MACROS],
    # an A100 build: the wgmma kernel compiles to an empty body and the mma.sync path serves bfloat16
    "torch-sm80": ["-gencode=arch=compute_80,code=sm_80", *TORCH_MACROS],
}
TORCH_INCLUDE = re.compile(r"#\s*include\s*[<\"](torch|ATen|c10|caffe2)/")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: the compile check needs the CUDA toolkit")


def _compile(source: Path, flag_set: str, out_dir: Path) -> tuple[list[str], subprocess.CompletedProcess]:
    obj = out_dir / f"{source.stem}-{flag_set}.o"
    cmd = [NVCC, "-std=c++17", "-c", *FLAG_SETS[flag_set], str(source), "-o", str(obj)]
    return cmd, subprocess.run(cmd, capture_output=True, text=True, cwd=CUDA_DIR)


@pytest.fixture(scope="module")
def builds():
    """Every (source, flag set) compiled once, in parallel (verify_attn.cu alone takes ~20 s)."""
    jobs = [(src, flags) for src in SOURCES for flags in FLAG_SETS]
    with tempfile.TemporaryDirectory() as out_dir:
        workers = max(1, min(len(jobs), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = pool.map(lambda job: _compile(*job, Path(out_dir)), jobs)
            yield {(src.name, flags): result for (src, flags), result in zip(jobs, results, strict=True)}


def test_every_op_has_a_cuda_source():
    names = {p.name for p in SOURCES}
    assert {"tree_build.cu", "verify_attn.cu", "tree_accept.cu", "kv_compact.cu", "budget_choose.cu",
            "confidence_learn.cu", "linear_rows.cu", "expert_rows.cu", "rms_norm_rows.cu", "moe_route.cu",
            "cache_attn.cu", "head_norm_rope.cu", "commit_path.cu", "latent_write.cu", "context_write.cu"} <= names
    assert (CUDA_DIR / "binding.cpp").exists()


@needs_nvcc
@pytest.mark.parametrize("flag_set", list(FLAG_SETS))
@pytest.mark.parametrize("source", [p.name for p in SOURCES])
def test_compiles(builds, source, flag_set):
    cmd, result = builds[(source, flag_set)]
    assert result.returncode == 0, f"{' '.join(cmd)} exited with {result.returncode}:\n{result.stderr}"


@pytest.mark.parametrize("path", sorted([*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.cuh")]), ids=lambda p: p.name)
def test_pure_cuda_files_include_no_torch(path):
    hits = [line for line in path.read_text().splitlines() if TORCH_INCLUDE.search(line)]
    assert not hits, f"{path.name} includes torch headers (only binding.cpp may): {hits}"


def test_only_the_binding_registers_cuda_impls():
    registering = [p.name for p in CUDA_DIR.iterdir() if "TORCH_LIBRARY_IMPL" in p.read_text()]
    assert registering == ["binding.cpp"]
