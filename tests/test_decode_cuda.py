"""The DDTree step on CUDA: no host synchronisation, CUDA-graph replay, float32 and bfloat16 decodes."""
from __future__ import annotations

import pytest
import torch

from engine.config import DecodeConfig
from engine.decoding.session import decode, make_decoder
from engine.drafters import DrafterSpec
from engine.model.target import TargetModel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")


@pytest.fixture(scope="module")
def cuda_model(tiny_checkpoint):
    return TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "float32")


def test_fp32_cuda_decodes_equal_golden(tiny_checkpoint, cuda_model):
    ckpt = tiny_checkpoint
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=24, device="cuda")
    golden = ckpt.golden_tokens.tolist()
    assert decode(ckpt, ckpt.prompt.tolist(), cfg, "ar", model=cuda_model).tokens == golden
    dd = decode(ckpt, ckpt.prompt.tolist(), cfg, "ddtree", model=cuda_model)
    assert dd.tokens == golden and [s.num_committed for s in dd.steps] == [8, 8, 8]
    for noise in (0.3, 1.0):
        run = decode(ckpt, ckpt.prompt.tolist(), cfg, "ddtree", DrafterSpec(noise=noise), model=cuda_model)
        assert run.tokens == golden


@pytest.mark.parametrize("mode", ["ar", "chain", "ddtree"])
def test_step_makes_no_host_sync(tiny_checkpoint, cuda_model, mode):
    cfg = DecodeConfig(budget=16, block_size=8, max_new_tokens=24, device="cuda")
    dec = make_decoder(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, mode, DrafterSpec(noise=0.4),
                       model=cuda_model)
    dec.step()  # warm-up: first-use allocations and library handles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dec.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("mode,noise", [("ar", 0.0), ("chain", 0.3), ("ddtree", 0.0), ("ddtree", 0.5)])
def test_cuda_graph_replay_matches_eager(tiny_checkpoint, cuda_model, mode, noise):
    cfg = DecodeConfig(budget=16, block_size=8, max_new_tokens=24, device="cuda")
    prompt = tiny_checkpoint.prompt.tolist()
    eager = make_decoder(tiny_checkpoint, prompt, cfg, mode, DrafterSpec(noise=noise), model=cuda_model).run()
    graphed = make_decoder(tiny_checkpoint, prompt, cfg, mode, DrafterSpec(noise=noise), model=cuda_model,
                           cuda_graph=True)
    run = graphed.run()
    assert graphed.graph_captured, "later steps replayed a captured graph"
    assert run.tokens == eager.tokens
    assert [s.path for s in run.steps] == [s.path for s in eager.steps]


def test_bf16_cuda_ddtree_equals_bf16_ar(tiny_checkpoint):
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "bfloat16")
    cfg = DecodeConfig(budget=32, block_size=8, max_new_tokens=24, device="cuda", dtype="bfloat16")
    prompt = tiny_checkpoint.prompt.tolist()
    ar = decode(tiny_checkpoint, prompt, cfg, "ar", model=model)
    for noise in (0.0, 0.5):
        assert decode(tiny_checkpoint, prompt, cfg, "ddtree", DrafterSpec(noise=noise), model=model).tokens == ar.tokens
