"""Whether torch's FlexAttention can serve verify_attn: absorbed MLA as multi-query attention (every head's query
[q_lat | q_pe], 576 wide, against one key [ckv | kpe] and one value ckv, 512 wide) with the tree's visibility as
its block mask, compiled by torch.compile. Where it compiles, its output is checked against our verify_attn and
timed beside it; where it does not, the error is printed (it is a baseline, never a requirement).

    python -m benchmarks.flex_attention_mla [--device cuda|cpu] [--nodes N] [--rows S]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np
import torch

from benchmarks.baselines import SCALE, AttnSet, attn_set, ours_attention
from benchmarks.common import QUICK, resolve_device, time_calls


def flex_inputs(a: AttnSet) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [1, H, N, R + P], k [1, 1, S, R + P], v [1, 1, S, R] of one verify_attn call."""
    q = torch.cat([a.q_lat, a.q_pe], -1).transpose(0, 1).unsqueeze(0)
    k = torch.cat([a.ckv, a.kpe], -1)[None, None]
    return q, k, a.ckv[None, None]


def flex_verify(a: AttnSet):
    """A callable running FlexAttention on `a`'s shape: each node sees what a.visible [N, S] allows."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    visible = a.visible

    def mask_mod(b, h, q_idx, kv_idx):
        return visible[q_idx, kv_idx]

    n, s = visible.shape
    block_mask = create_block_mask(mask_mod, None, None, n, s, device=str(visible.device))
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(x: AttnSet) -> torch.Tensor:
        q, k, v = flex_inputs(x)
        return compiled(q, k, v, block_mask=block_mask, scale=SCALE, enable_gqa=True)[0].transpose(0, 1)

    return run


def check(n: int, s: int, device: torch.device, dtype: torch.dtype) -> str:
    """One line: FlexAttention's error and time beside ours, or why it did not run."""
    a = attn_set(n, s, dtype, device, np.random.default_rng(0))
    ours = ours_attention(a).o_lat
    shape = f"N = {n}, S = {s}, H = {a.q_lat.shape[1]}, qk {a.q_lat.shape[2] + a.q_pe.shape[2]} / v {a.ckv.shape[1]}"
    try:
        run = flex_verify(a)
        got = run(a)
    except Exception as err:  # noqa: BLE001  (whatever it raises is the finding)
        message = str(err).strip().splitlines()[0] if str(err).strip() else ""
        return f"FlexAttention ({shape}, {dtype}): does not run: {type(err).__name__}: {message[:300]}"
    err = float((got.double() - ours.double()).norm() / ours.double().norm())
    flex_us = time_calls(run, [a], device, QUICK).median_us
    ours_us = time_calls(ours_attention, [a], device, QUICK).median_us
    return (f"FlexAttention ({shape}, {dtype}): runs, {flex_us:.1f} us against ours {ours_us:.1f} us, "
            f"relative difference from ours {err:.1e}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--nodes", type=int, default=65)
    parser.add_argument("--rows", type=int, default=4096)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.nodes < 1 or args.rows <= args.nodes:
        raise SystemExit(f"--nodes {args.nodes} --rows {args.rows}: need 1 <= N < S")
    device = resolve_device(args.device)
    print(check(args.nodes, args.rows, device, torch.bfloat16 if device.type == "cuda" else torch.float32))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
