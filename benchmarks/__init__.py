"""Kernel and end-to-end benchmarks: `python -m benchmarks.bench_kernels`, `python -m benchmarks.bench_decode`."""
