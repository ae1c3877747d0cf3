"""benchmarks/flex_attention_mla.py: FlexAttention set up as absorbed MLA (multi-query, qk 576 / v 512, the tree's
visibility as its block mask) computes verify_attn's output where it compiles (here: the CPU, a small shape)."""
from __future__ import annotations

import numpy as np
import torch

from benchmarks.baselines import attn_set, ours_attention
from benchmarks.flex_attention_mla import check, flex_verify


def test_flex_attention_as_mla_equals_verify_attn():
    a = attn_set(7, 150, torch.float32, torch.device("cpu"), np.random.default_rng(np.random.randint(2**31)))
    got = flex_verify(a)(a)
    want = ours_attention(a).o_lat
    assert got.shape == want.shape and torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    assert not torch.allclose(got[1:], got[:1].expand_as(got[1:]))  # the nodes' masks differ, so do their rows


def test_the_check_line_reports_a_run_or_the_error():
    line = check(3, 80, torch.device("cpu"), torch.float32)
    assert line.startswith("FlexAttention (N = 3, S = 80, H = 64, qk 576 / v 512") and ("runs," in line or
                                                                                       "does not run:" in line)
