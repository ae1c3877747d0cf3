"""What loading costs on the host: peak RSS while a Hugging Face directory streams to a bf16 run, the .kdtr
checksum's time against the time to read the file, and the time and memory to open the largest recording the
report reader admits (profiling/report_reader.py's limits; benchmarks/big_recording.py builds it).

    python -m benchmarks.bench_load [--hf-mb 400] [--kdtr-mb 1024] [--dir DIR] [--only hf|kdtr|recording]

Each measurement runs in a fresh child process (its peak RSS, VmHWM, restarted after imports and the header
checks). The files are written into DIR (default: a temporary directory) and removed afterwards.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from benchmarks.big_recording import largest_admitted
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.kdtr import write_kdtr
from engine.model.fixtures import tiny_config
from engine.model.weights import weight_shapes

REPO = Path(__file__).resolve().parent.parent
_CHILD = textwrap.dedent("""
    import hashlib, json, os, sys, time, torch
    from engine.loaders.hf_import import read_hf_dir
    from engine.loaders.kdtr import read_kdtr
    from engine.loaders.safetensors_file import read_exactly

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    def restart_peak():
        open("/proc/self/clear_refs", "w").write("5")
        return status("VmRSS")

    kind, path = sys.argv[1], sys.argv[2]
    if kind == "hf":
        ckpt = read_hf_dir(path)
        before = restart_peak()
        for name, tensor in ckpt.weights.tensors("cpu", torch.bfloat16):
            del tensor  # a consumer that keeps nothing: the host side of a GPU load
        stream = status("VmHWM") - before
        before = restart_peak()
        arrays = ckpt.numpy_weights()  # float32 host arrays: what the loader used to hold for every model
        print(json.dumps({"stream_bytes": stream, "float32_bytes": status("VmHWM") - before}))
    elif kind == "recording":
        import engine.drafters  # torch, which the dashboard has loaded before any recording
        from profiling.report_reader import read_report_file
        before = restart_peak()
        wall, cpu = time.perf_counter(), time.process_time()
        recording = read_report_file(path)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(json.dumps({"wall_s": wall, "cpu_s": cpu, "peak_bytes": status("VmHWM") - before,
                          "kept_bytes": status("VmRSS") - before}))
    else:
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            data = bytearray(os.fstat(f.fileno()).st_size)
            read_exactly(f, 0, memoryview(data), path, ValueError)
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        hashlib.sha256(memoryview(data)[8 + int.from_bytes(data[:8], "little"):]).hexdigest()
        hash_s = time.perf_counter() - start
        del data
        start = time.perf_counter()
        read_kdtr(path)
        print(json.dumps({"read_s": read_s, "sha256_s": hash_s, "read_kdtr_s": time.perf_counter() - start}))
""")


def _child(kind: str, path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CHILD, kind, str(path)], cwd=REPO, capture_output=True,
                          text=True, check=True)
    return json.loads(proc.stdout)


def hf_dir(root: Path, megabytes: int) -> tuple[int, int]:
    """A bf16 model of about megabytes MB (a wide vocabulary, dense layers); returns (total, largest) bytes."""
    hidden, vocab = 2048, 32768  # embed and lm_head: 128 MB each in bf16
    layers = max(1, (megabytes - 256) // 64)  # each dense layer with intermediate 4096: about 56 MB
    cfg = dataclasses.replace(tiny_config(), vocab_size=vocab, hidden_size=hidden, intermediate_size=4096,
                              num_hidden_layers=layers, first_k_dense_replace=layers, num_attention_heads=16,
                              q_lora_rank=512, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                              v_head_dim=128)
    tensors = {name: torch.randn(shape, dtype=torch.bfloat16) for name, shape in weight_shapes(cfg).items()}
    save_file(tensors, root / "model.safetensors")
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **cfg.to_dict()}
    (root / "config.json").write_text(json.dumps(config))
    return sum(t.nbytes for t in tensors.values()), max(t.nbytes for t in tensors.values())


def kdtr_file(path: Path, megabytes: int) -> int:
    """A .kdtr of about megabytes MB, most of it one tied embedding."""
    cfg = dataclasses.replace(tiny_config(), vocab_size=megabytes * 2**20 // (4 * 4096), hidden_size=4096,
                              tie_word_embeddings=True)
    rng = np.random.default_rng(0)
    weights = {name: rng.standard_normal(shape, dtype=np.float32) for name, shape in weight_shapes(cfg).items()}
    write_kdtr(path, Checkpoint(cfg, weights, "bench", prompt=np.arange(4)))
    return path.stat().st_size


def _recording(root: Path) -> None:
    data = largest_admitted()
    (root / "largest.json").write_bytes(data)
    got = _child("recording", root / "largest.json")
    mb = 2**20
    print(f"largest recording the reader admits: {len(data) / mb:.0f} MiB, {data.count(b',') / 1e6:.1f} million JSON "
          f"values, trees of 1,025 nodes: opened in {got['wall_s']:.1f} s ({got['cpu_s']:.1f} s of CPU)")
    print(f"  peak RSS growth opening it: {got['peak_bytes'] / mb:.0f} MB; kept while it is open: "
          f"{got['kept_bytes'] / mb:.0f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-mb", type=int, default=400, help="size of the bf16 Hugging Face directory")
    parser.add_argument("--kdtr-mb", type=int, default=1024, help="size of the .kdtr file")
    parser.add_argument("--dir", type=Path, help="where to write the files (default: a temporary directory)")
    parser.add_argument("--only", choices=["hf", "kdtr", "recording"], help="run one measurement (default: all)")
    args = parser.parse_args(argv)
    mb = 2**20
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if args.only in (None, "hf"):
            total, largest = hf_dir(Path(tmp), args.hf_mb)
            hf = _child("hf", Path(tmp))
            print(f"Hugging Face bf16 directory: {total / mb:.0f} MB, largest tensor {largest / mb:.0f} MB")
            print(f"  peak RSS growth streaming it to a bf16 run: {hf['stream_bytes'] / mb:.0f} MB")
            print(f"  peak RSS growth holding it as float32 arrays (numpy_weights): {hf['float32_bytes'] / mb:.0f} MB")
            (Path(tmp) / "model.safetensors").unlink()
        if args.only in (None, "kdtr"):
            size = kdtr_file(Path(tmp) / "big.kdtr", args.kdtr_mb)
            kdtr = _child("kdtr", Path(tmp) / "big.kdtr")
            print(f".kdtr of {size / mb:.0f} MB (in the page cache): read {kdtr['read_s']:.2f} s, SHA-256 of the data "
                  f"{kdtr['sha256_s']:.2f} s, read_kdtr in full {kdtr['read_kdtr_s']:.2f} s")
            (Path(tmp) / "big.kdtr").unlink()
        if args.only in (None, "recording"):
            _recording(Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
