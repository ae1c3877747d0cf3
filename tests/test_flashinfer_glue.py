"""benchmarks/flashinfer_mla.py's glue (pages of one row, the prefix-only plan, base-2 log-sum-exp and the merge
with our tree rows) against the float64 reference, on the CPU. FlashInfer itself is CUDA-only, so it is stood in
for by a plain-torch model of the contract its 0.5.3 docstrings state: `BatchMLAPagedAttentionWrapper.plan` takes
int32 indptr/indices/lengths, `run` attends over the planned pages and returns the log-sum-exp in base 2 (unless
`return_lse_base_on_e`). The merge with our tree rows is the glue's own (`merge`)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.baselines import attn_set, float64_attention
from benchmarks.bench_kernels import flashinfer_case, prefix_only, rel_err
from benchmarks.common import QUICK
from benchmarks.flashinfer_mla import FlashInferVerify, load, merge


class StandInWrapper:
    def __init__(self, workspace: torch.Tensor, backend: str) -> None:
        assert workspace.dtype == torch.int8 and backend == "auto"

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len, num_heads, head_dim_ckv, head_dim_kpe, page_size,
             causal, sm_scale, q_dtype, kv_dtype) -> None:
        assert all(t.dtype == torch.int32 for t in (qo_indptr, kv_indptr, kv_indices, kv_len))
        assert page_size == 1 and not causal and int(kv_len[0]) == int(kv_indptr[-1]) == len(kv_indices)
        self.rows, self.scale, self.num_heads = kv_indices.long(), sm_scale, num_heads
        self.num_queries = int(qo_indptr[-1])

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, return_lse=False, return_lse_base_on_e=False):
        assert q_nope.shape[:2] == (self.num_queries, self.num_heads) and ckv_cache.shape[1] == 1
        ckv, kpe = ckv_cache[self.rows, 0].float(), kpe_cache[self.rows, 0].float()
        scores = self.scale * (torch.einsum("nhr,sr->nhs", q_nope.float(), ckv)
                               + torch.einsum("nhp,sp->nhs", q_pe.float(), kpe))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.einsum("nhs,sr->nhr", torch.softmax(scores, dim=-1), ckv).to(q_nope.dtype)
        return (out, lse if return_lse_base_on_e else lse / math.log(2.0)) if return_lse else out


STAND_IN = SimpleNamespace(mla=SimpleNamespace(BatchMLAPagedAttentionWrapper=StandInWrapper))


@pytest.mark.parametrize(("n", "s"), [(1, 40), (8, 64), (33, 200)])
def test_the_prefix_pass_and_the_merged_verify_equal_the_float64_reference(n, s):
    rng = np.random.default_rng(seed := int(np.random.SeedSequence().entropy % 2**32))
    torch.manual_seed(seed)
    a = attn_set(n, s, torch.float32, torch.device("cpu"), rng)
    fi = FlashInferVerify(STAND_IN, a)
    prefix_o, prefix_lse = fi.prefix(a)
    ref_o, ref_lse = float64_attention(prefix_only(a))
    assert rel_err(prefix_o, ref_o) < 1e-5, seed
    torch.testing.assert_close(prefix_lse.double() * math.log(2.0), ref_lse, rtol=1e-5, atol=1e-5)
    assert rel_err(fi.verify(a), float64_attention(a)[0]) < 1e-5, seed


def test_without_flashinfer_the_benchmark_says_it_skips_it():
    module, note = load()
    if module is None:
        assert note.startswith("FlashInfer: skipped (does not import here:")
    else:
        assert note.startswith(f"FlashInfer {module.__version__}: timed beside ours")


def test_a_case_times_flashinfer_beside_ours_and_a_failing_flashinfer_loses_none_of_ours():
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    a = attn_set(8, 64, torch.float32, torch.device("cpu"), rng)
    ref_o = float64_attention(a)[0]
    fields, timings = flashinfer_case(STAND_IN, a, [a], ref_o, torch.device("cpu"), QUICK)
    assert fields["fi_prefix_us"] > 0 and fields["fi_verify_us"] > 0 and set(timings) == {"fi_prefix", "fi_verify"}
    assert fields["err_fi_prefix"] < 1e-5 and fields["err_fi_verify"] < 1e-5

    class BrokenRun(StandInWrapper):  # a FlashInfer whose kernel fails at run time, after planning
        def run(self, *args, **kwargs):
            raise RuntimeError("no kernel image for this device")

    broken = SimpleNamespace(mla=SimpleNamespace(BatchMLAPagedAttentionWrapper=BrokenRun))
    assert flashinfer_case(broken, a, [a], ref_o, torch.device("cpu"), QUICK) == (
        {"fi_error": "RuntimeError: no kernel image for this device"}, {})


def test_a_failing_verify_pass_keeps_the_prefix_pass(monkeypatch):
    rng = np.random.default_rng(int(np.random.SeedSequence().entropy % 2**32))
    a = attn_set(4, 48, torch.float32, torch.device("cpu"), rng)

    def broken_verify(self, _):
        raise RuntimeError("invalid argument")

    monkeypatch.setattr(FlashInferVerify, "verify", broken_verify)
    fields, timings = flashinfer_case(STAND_IN, a, [a], float64_attention(a)[0], torch.device("cpu"), QUICK)
    assert fields["fi_error"] == "RuntimeError: invalid argument" and "fi_verify_us" not in fields
    assert fields["fi_prefix_us"] > 0 and fields["err_fi_prefix"] < 1e-5 and set(timings) == {"fi_prefix"}


def test_the_merge_of_two_key_sets_is_the_attention_over_both():
    rng = np.random.default_rng(seed := int(np.random.SeedSequence().entropy % 2**32))
    n, h, r = (int(x) for x in rng.integers(1, 9, 3))
    scores = torch.as_tensor(rng.normal(size=(n, h, 11)) * 3)
    values = torch.as_tensor(rng.normal(size=(11, r)))
    cut = int(rng.integers(1, 10))

    def state(cols):
        part = scores[..., cols]
        return torch.einsum("nhs,sr->nhr", part.softmax(-1), values[cols]), part.logsumexp(-1)

    whole = torch.einsum("nhs,sr->nhr", scores.softmax(-1), values)
    torch.testing.assert_close(merge(*state(slice(0, cut)), *state(slice(cut, 11))), whole, msg=f"seed {seed}")
