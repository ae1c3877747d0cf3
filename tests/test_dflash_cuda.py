"""The dflash drafter on CUDA: its drafts against the numpy golden model, the whole step with no host
synchronisation, CUDA-graph replay giving the eager step's tokens, bfloat16 decodes equal to bfloat16 AR, and
bfloat16 drafts through the fused kernels against float32's."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from dflash_dirs import small_layout

from engine.config import DecodeConfig
from engine.decoding.session import decode, make_decoder
from engine.drafters import DrafterSpec
from engine.model import dflash_reference as dflash_reference
from engine.model import reference
from engine.model.dflash import DFlashModel, DFlashWeights
from engine.model.dflash_fixtures import make_dflash_dir, random_tensors
from engine.model.target import TargetModel

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
SEED = 7


@pytest.fixture(scope="module")
def drafter_dir(tiny_checkpoint, tmp_path_factory):
    cfg = small_layout(tiny_checkpoint.config, "yarn-factor", target_layer_ids=(2, 0))
    root = make_dflash_dir(tmp_path_factory.mktemp("dflash") / "dflash", cfg, seed=SEED)
    return cfg, DrafterSpec("dflash", model=str(root))


@pytest.fixture(scope="module")
def cuda_model(tiny_checkpoint):
    return TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "float32")


def test_cuda_float32_first_draft_equals_the_reference(tiny_checkpoint, cuda_model, drafter_dir):
    cfg, spec = drafter_dir
    ckpt = tiny_checkpoint
    prompt = ckpt.prompt.tolist()
    dec = make_decoder(ckpt, prompt, DecodeConfig(block_size=8, device="cuda"), "ddtree", spec, model=cuda_model)
    draft = dec.drafter.propose(dec.root, dec.num_generated).cpu().numpy()
    target = ckpt.numpy_weights()
    trace = reference.run_model(ckpt.config, target, prompt)
    features = np.concatenate([trace.hidden[i] for i in cfg.target_layer_ids], axis=-1)
    weights = {n: t.numpy() for n, t in random_tensors(cfg, SEED).items()}
    want = dflash_reference.draft_logprobs(cfg, weights, target["model.embed_tokens.weight"],
                                           target["lm_head.weight"], features, dec.first_token)
    assert np.abs(draft - want).max() < 1e-4


@pytest.mark.parametrize("mode", ["chain", "ddtree"])
def test_a_dflash_step_makes_no_host_sync(tiny_checkpoint, cuda_model, drafter_dir, mode):
    _, spec = drafter_dir
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=24, device="cuda")
    dec = make_decoder(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, mode, spec, model=cuda_model)
    dec.step()  # warm-up: first-use allocations and library handles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dec.advance()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("mode,budget", [("chain", 0), ("ddtree", 16), ("ddtree", 256)])
def test_cuda_graph_replay_with_dflash_matches_eager(tiny_checkpoint, cuda_model, drafter_dir, mode, budget):
    _, spec = drafter_dir
    cfg = DecodeConfig(budget=budget, block_size=8, max_new_tokens=24, device="cuda")
    prompt = tiny_checkpoint.prompt.tolist()
    eager = make_decoder(tiny_checkpoint, prompt, cfg, mode, spec, model=cuda_model).run()
    graphed = make_decoder(tiny_checkpoint, prompt, cfg, mode, spec, model=cuda_model, cuda_graph=True)
    run = graphed.run()
    assert graphed.graph_captured, "later steps replayed a captured graph"
    assert run.tokens == eager.tokens == tiny_checkpoint.golden_tokens.tolist()
    assert [s.path for s in run.steps] == [s.path for s in eager.steps]


def test_bf16_dflash_decodes_equal_bf16_ar(tiny_checkpoint, drafter_dir):
    _, spec = drafter_dir
    model = TargetModel.from_checkpoint(tiny_checkpoint, "cuda", "bfloat16")
    cfg = DecodeConfig(budget=32, block_size=8, max_new_tokens=24, device="cuda", dtype="bfloat16")
    prompt = tiny_checkpoint.prompt.tolist()
    ar = decode(tiny_checkpoint, prompt, cfg, "ar", model=model)
    for mode in ("chain", "ddtree"):
        run = decode(tiny_checkpoint, prompt, cfg, mode, spec, model=model)
        assert run.tokens == ar.tokens and run.drafter["name"] == "dflash"


def test_bfloat16_drafts_through_the_fused_kernels_match_float32(tiny_checkpoint):
    """head_dim 64: ops.cache_attn's tensor-core kernel and ops.head_norm_rope's warp kernel, in bfloat16 on the GPU,
    draft what the float32 forward on the CPU drafts, within bfloat16's rounding, over 300 context rows."""
    cfg = small_layout(tiny_checkpoint.config, num_attention_heads=8, num_key_value_heads=2, head_dim=64)
    tensors = random_tensors(cfg, SEED)
    hidden = torch.randn(300, cfg.num_context_features, generator=torch.Generator().manual_seed(SEED))
    probs = []
    for device, dtype in (("cpu", torch.float32), ("cuda", torch.bfloat16)):
        target = TargetModel.from_checkpoint(tiny_checkpoint, device, str(dtype).removeprefix("torch."))
        weights = DFlashWeights.from_tensors(cfg, {n: t.to(device, dtype) for n, t in tensors.items()})
        model = DFlashModel(cfg, weights, target.embed, target.lm_head, 7, capacity=400)
        model.write_context(hidden.to(device, dtype), 0)
        model.length.fill_(300)
        probs.append(model.block_logprobs(torch.tensor(5, device=device)).exp().cpu())
    assert (probs[0] - probs[1]).abs().max() < 0.05
