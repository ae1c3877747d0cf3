"""The sparse MoE on CUDA: the grouped GEMM against the dense reference, its per-row exact layout, a step with no
host sync whose CUDA graph counts the same experts, and a load that holds the model once."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from moe_cases import TOLERANCE, moe_config, random_experts, relative_error

from engine.config import DecodeConfig
from engine.decoding.session import decode, make_decoder
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.model.batch_rows import ROW_BLOCK
from engine.model.fixtures import random_weights
from engine.model.moe import GROUPED_MATMULS, Experts, dense_moe, grouped_matmul, sparse_moe
from engine.model.target import TargetModel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")


def test_cuda_grouped_gemm_matches_dense_and_its_exact_layout_is_per_row_exact():
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    num, k, hidden, inter = 64, 8, 256, 128
    ex = random_experts(num, hidden, inter, torch.bfloat16, gen)
    ex = Experts(ex.gate_up.cuda(), ex.down.cuda())
    for n in (1, 16, 65, 257):
        x = torch.randn(n, hidden, generator=gen).bfloat16().cuda()
        idx = torch.rand(n, num, generator=gen).topk(k, -1).indices.cuda()
        w = torch.rand(n, k, generator=gen).cuda()
        want = dense_moe(x, idx, w, ex)
        assert relative_error(sparse_moe(x, idx, w, ex), want) < TOLERANCE[torch.bfloat16]
        assert relative_error(sparse_moe(x, idx, w, ex, exact=True), want) < TOLERANCE[torch.bfloat16]
    blocks = [torch.randn(ROW_BLOCK, hidden, generator=gen).bfloat16().cuda() for _ in range(3)]
    idxs = [torch.rand(ROW_BLOCK, num, generator=gen).topk(k, -1).indices.cuda() for _ in range(3)]
    w = torch.rand(ROW_BLOCK, k, generator=gen).cuda()
    for b in range(1, 3):  # the first block's row 0 placed at row b of another block
        blocks[b][b], idxs[b][b] = blocks[0][0], idxs[0][0]
    rows = [sparse_moe(blocks[b], idxs[b], w[[0] * ROW_BLOCK], ex, exact=True)[b] for b in range(3)]
    assert all(torch.equal(r, rows[0]) for r in rows)


@pytest.mark.parametrize("matmul", GROUPED_MATMULS)
def test_cuda_grouped_matmuls_match_dense_at_kimi_k2_routing(matmul):
    """Both grouped matmuls at Kimi-K2's 384 experts top-8 (narrow widths) and the token counts of AR and of B = 16,
    64, 256, with routing skewed so a few experts take many rows and most none, and another rank's experts skipped."""
    if matmul == "linear_rows" and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("linear_rows' bfloat16 kernels need sm_80 or later")
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    num, k, hidden, inter = 384, 8, 256, 128
    ex = random_experts(num, hidden, inter, torch.bfloat16, gen)
    ex = Experts(ex.gate_up.cuda(), ex.down.cuda())
    for n in (1, 17, 65, 257):
        x = torch.randn(n, hidden, generator=gen).bfloat16().cuda()
        odds = torch.rand(n, num, generator=gen) * torch.rand(num, generator=gen) ** 4  # popular experts
        idx = odds.topk(k, -1).indices.cuda()
        w = torch.rand(n, k, generator=gen).cuda()
        want = dense_moe(x, idx, w, ex)
        assert relative_error(sparse_moe(x, idx, w, ex, matmul=matmul), want) < TOLERANCE[torch.bfloat16], (n, seed)
        local = torch.where(idx < num // 2, idx, num // 2)  # the upper half another rank's
        half = Experts(ex.gate_up[: num // 2], ex.down[: num // 2])
        want = dense_moe(x, local, w, half)
        got = sparse_moe(x, local, w, half, matmul=matmul)
        assert relative_error(got, want) < TOLERANCE[torch.bfloat16], (n, seed)


def test_the_default_grouped_matmul_on_this_gpu():
    want = "linear_rows" if torch.cuda.get_device_capability() == (9, 0) else "grouped_mm"
    assert grouped_matmul(torch.device("cuda"), torch.bfloat16) == want
    assert grouped_matmul(torch.device("cuda"), torch.float32) == "grouped_mm"


def test_cuda_sparse_step_makes_no_host_sync_and_its_graph_counts_the_same(tiny_checkpoint):
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "bfloat16")
    assert model.moe_path == "sparse"
    cfg = DecodeConfig(budget=32, block_size=8, max_new_tokens=24, device="cuda", dtype="bfloat16")
    prompt = tiny_checkpoint.prompt.tolist()
    dec = make_decoder(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=0.4), model=model)
    dec.step()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dec.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    eager = decode(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=0.4), model=model)
    graphed = make_decoder(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=0.4), model=model,
                           cuda_graph=True)
    run = graphed.run()
    assert graphed.graph_captured and run.tokens == eager.tokens
    assert [s.experts.touched for s in run.steps] == [s.experts.touched for s in eager.steps]


def test_cuda_model_load_holds_the_model_once():
    """Stacking as the experts arrive: device memory peaks near the model, not at the model plus its experts."""
    cfg = moe_config(random.Random(3), hidden_size=64, moe_intermediate_size=64, n_routed_experts=32, n_group=1,
                     topk_group=1, num_experts_per_tok=4, num_hidden_layers=2)
    ckpt = Checkpoint(cfg, random_weights(cfg, 0), "random")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    model = TargetModel.from_checkpoint(ckpt, "cuda", "bfloat16")
    held = torch.cuda.memory_allocated() - start
    one_layer = 3 * 32 * 64 * 64 * 2  # the old stacking held every layer's experts twice
    assert model.embed.is_cuda and torch.cuda.max_memory_allocated() - start - held < one_layer / 4


def test_cuda_batch_invariant_decode_with_the_sparse_moe_is_ar_bit_for_bit(tiny_checkpoint):
    """The whole batch-invariant mode on the GPU (verify_attn included), with the grouped GEMM's padded layout."""
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "bfloat16")
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=24, device="cuda", dtype="bfloat16",
                       batch_invariant=True)
    prompt = tiny_checkpoint.prompt.tolist()
    ar = decode(tiny_checkpoint, prompt, cfg, "ar", model=model)
    for noise in (0.0, 0.5):
        dd = decode(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=noise), model=model)
        assert dd.tokens == ar.tokens and np.array_equal(dd.logits, ar.logits)
