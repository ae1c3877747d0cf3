"""ops.moe_route (csrc/cpu/moe_route.cpp, csrc/cuda/moe_route.cu) against kernels/reference.py, the engine's torch
routing (moe.route) and the numpy golden router on fresh random logits, on the CPU and, where there is one, on the
GPU: the chosen experts in their order, the weights, the count of each expert's rows; ties, NaN, a row's bits alone
and among others; the GPU against the CPU kernel at real models' shapes and replayed in a CUDA graph; opcheck and the
errors."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest
import torch
from moe_cases import moe_config

from engine.model import reference as golden
from engine.model.moe import route, route_and_count
from kernels import ops, reference
from kernels.graph_capture import capture

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
RTOL = {"cpu": 2e-6, "cuda": 1e-5}  # the weights' relative tolerance: CUDA sums a softmax row in another order


def _case(rng: random.Random) -> dict:
    """A random routing shape: E experts in G groups, top_groups of them kept, top_k of what they hold."""
    num_groups = rng.choice([1, 1, 2, 4, 8])
    per_group = rng.choice([1, 2, 3, 8, 32])
    top_groups = rng.randint(1, num_groups)
    return {"top_k": rng.randint(1, min(top_groups * per_group, 9)), "num_groups": num_groups,
            "top_groups": top_groups, "softmax": rng.random() < 0.3, "normalize": rng.random() < 0.7,
            "scaling": rng.choice([1.0, 2.5, 0.37]), "num_experts": num_groups * per_group}


def _logits(gen: torch.Generator, num_rows: int, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    return 3 * torch.randn(num_rows, num_experts, generator=gen), 0.5 * torch.randn(num_experts, generator=gen)


@pytest.mark.parametrize("device", DEVICES)
def test_matches_the_reference_on_random_routings(device):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for trial in range(60):
        case = _case(rng)
        num_experts = case.pop("num_experts")
        num_rows = rng.choice([0, 1, 2, 17, 65])
        logits, bias = _logits(gen, num_rows, num_experts)
        real = torch.rand(num_rows, generator=gen) < 0.8
        counts = torch.randint(0, 5, (num_experts,), generator=gen, dtype=torch.int32)
        want_counts, counts = counts.clone(), counts.to(device)
        idx, weights = ops.moe_route(logits.to(device), bias.to(device), **case, counts=counts, real=real.to(device))
        want_idx, want_weights = reference.moe_route(logits, bias, **case, counts=want_counts, real=real)
        where = (trial, num_rows, num_experts, case, seed)
        assert idx.dtype == torch.int64 and weights.dtype == torch.float32, where
        assert idx.shape == weights.shape == (num_rows, case["top_k"]), where
        assert torch.equal(idx.cpu(), want_idx), where
        torch.testing.assert_close(weights.cpu(), want_weights, rtol=RTOL[device], atol=1e-7, msg=str(where))
        assert torch.equal(counts.cpu(), want_counts), where  # the counts the op was given, added to in place


@pytest.mark.parametrize("device", DEVICES)
def test_matches_the_engines_torch_routing_and_the_golden_router(device):
    """The same experts in the same order as moe.route (torch's topk, the trainer's routing), and the same weights as
    the numpy float64 router, on model configs drawn as the MoE tests draw them."""
    for _ in range(20):
        rng = random.Random(random.randrange(2**31))
        cfg = moe_config(rng)
        np_rng = np.random.default_rng(rng.randrange(2**31))
        x = np_rng.normal(size=(rng.randint(1, 40), cfg.hidden_size))
        gate = np_rng.normal(size=(cfg.n_routed_experts, cfg.hidden_size))
        bias = torch.from_numpy(0.1 * np_rng.normal(size=cfg.n_routed_experts)).float()
        logits = torch.from_numpy(x @ gate.T).float()
        idx, weights = ops.moe_route(logits.to(device), bias.to(device), cfg.num_experts_per_tok, cfg.n_group,
                                     cfg.topk_group, cfg.scoring_func == "softmax", cfg.norm_topk_prob,
                                     cfg.routed_scaling_factor)
        torch_idx, torch_weights = route(cfg, logits, bias)
        assert torch.equal(idx.cpu(), torch_idx), cfg
        torch.testing.assert_close(weights.cpu(), torch_weights, rtol=RTOL[device], atol=1e-7)
        want_idx, want_weights = golden.route(cfg, x, gate, bias.double().numpy())
        assert np.array_equal(np.sort(idx.cpu().numpy(), -1), np.sort(want_idx, -1)), cfg
        np.testing.assert_allclose(np.take_along_axis(weights.cpu().numpy(), np.argsort(idx.cpu().numpy(), -1), -1),
                                   np.take_along_axis(want_weights, np.argsort(want_idx, -1), -1), rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_a_rows_result_is_its_own_whatever_the_other_rows(device):
    """Bit for bit alone and at any place among other rows: the batch-invariant mode routes through it."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for _ in range(10):
        case = _case(rng)
        logits, bias = _logits(gen, 40, case.pop("num_experts"))
        logits, bias = logits.to(device), bias.to(device)
        idx, weights = ops.moe_route(logits, bias, **case)
        for n in rng.sample(range(40), 5):
            alone_idx, alone_weights = ops.moe_route(logits[n:n + 1], bias, **case)
            assert torch.equal(alone_idx[0], idx[n]) and torch.equal(alone_weights[0], weights[n]), (n, case, seed)


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_lower_id_and_nan_comes_first(device):
    num_experts = 12
    logits = torch.zeros(3, num_experts)
    logits[1, 7] = logits[1, 9] = 1.0  # a tie above the rest
    logits[2, 5] = float("nan")
    idx, weights = ops.moe_route(logits.to(device), torch.zeros(num_experts, device=device), 4, 1, 1, False, True, 1.0)
    assert idx.cpu().tolist() == [[0, 1, 2, 3], [7, 9, 0, 1], [5, 0, 1, 2]]
    assert torch.allclose(weights[0].cpu(), torch.full((4,), 0.25))
    assert torch.isnan(weights[2]).all()  # a NaN score's weight poisons its row's normaliser: the output shows it
    # groups: [0..3] [4..7] [8..11]; group 1 holds the best pair, so with one group kept only its experts are chosen
    grouped = torch.arange(num_experts, dtype=torch.float32)[None].flip(-1).clone()
    grouped[0, 4:8] += 20
    idx, _ = ops.moe_route(grouped.to(device), torch.zeros(num_experts, device=device), 3, 3, 1, False, True, 1.0)
    assert idx.cpu().tolist() == [[4, 5, 6]]


@pytest.mark.parametrize("device", DEVICES)
def test_the_bias_steers_the_choice_not_the_weights(device):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    logits = torch.randn(6, 16, generator=gen).to(device)
    bias = torch.zeros(16, device=device)
    bias[3] = 100.0  # expert 3 always chosen first
    idx, weights = ops.moe_route(logits, bias, 2, 1, 1, False, False, 1.0)
    assert (idx[:, 0] == 3).all()
    assert torch.allclose(weights[:, 0], logits[:, 3].sigmoid(), rtol=1e-6)


# name: (E, routing); DeepSeek-V2 (softmax) has no correction bias
REAL_SHAPES = {
    "kimi-k2": (384, {"top_k": 8, "num_groups": 1, "top_groups": 1, "softmax": False, "normalize": True,
                      "scaling": 2.827}),
    "deepseek-v3": (256, {"top_k": 8, "num_groups": 8, "top_groups": 4, "softmax": False, "normalize": True,
                          "scaling": 2.5}),
    "deepseek-v2": (160, {"top_k": 6, "num_groups": 8, "top_groups": 3, "softmax": True, "normalize": False,
                          "scaling": 16.0}),
    "8191-groups-of-one": (8191, {"top_k": 8, "num_groups": 8191, "top_groups": 16, "softmax": False,
                                  "normalize": True, "scaling": 1.0}),
    "k-is-e": (64, {"top_k": 64, "num_groups": 1, "top_groups": 1, "softmax": False, "normalize": True,
                    "scaling": 1.0}),
}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", list(REAL_SHAPES))
def test_cuda_matches_the_cpu_kernel_at_real_shapes(name):
    """The CPU kernel's experts and counts exactly, its weights closely; a row's bits alone as among 1000 rows."""
    num_experts, case = REAL_SHAPES[name]
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for num_rows in (1, 17, 65, 1000):
        logits, bias = _logits(gen, num_rows, num_experts)
        if case["softmax"]:
            bias = torch.zeros(num_experts)
        real = torch.rand(num_rows, generator=gen) < 0.8
        want_counts = torch.randint(0, 5, (num_experts,), generator=gen, dtype=torch.int32)
        counts = want_counts.cuda()
        idx, weights = ops.moe_route(logits.cuda(), bias.cuda(), **case, counts=counts, real=real.cuda())
        want_idx, want_weights = ops.moe_route(logits, bias, **case, counts=want_counts, real=real)
        where = (name, num_rows, seed)
        assert torch.equal(idx.cpu(), want_idx), where
        torch.testing.assert_close(weights.cpu(), want_weights, rtol=RTOL["cuda"], atol=1e-7, msg=str(where))
        assert torch.equal(counts.cpu(), want_counts), where
    for n in rng.sample(range(num_rows), 5):
        alone_idx, alone_weights = ops.moe_route(logits[n:n + 1].cuda(), bias.cuda(), **case)
        assert torch.equal(alone_idx[0], idx[n]), (name, n, seed)
        assert torch.equal(alone_weights[0].view(torch.int32), weights[n].view(torch.int32)), (name, n, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_routing_replays_in_a_graph():
    """Captured once with counts, replayed on new logits written in place: the CPU kernel's routing and counts."""
    seed = random.randrange(2**31)
    gen = torch.Generator().manual_seed(seed)
    num_experts, case = REAL_SHAPES["deepseek-v3"]
    logits, bias = (t.cuda() for t in _logits(gen, 17, num_experts))
    real = (torch.rand(17, generator=gen) < 0.8).cuda()
    counts = torch.zeros(num_experts, dtype=torch.int32, device="cuda")
    graph, (idx, weights) = capture(lambda: (ops.moe_route(logits, bias, **case, counts=counts, real=real),
                                             counts.zero_()),
                                    lambda: ops.moe_route(logits, bias, **case, counts=counts, real=real))
    want_counts = torch.zeros(num_experts, dtype=torch.int32)
    for replay in range(3):
        logits.copy_(_logits(gen, 17, num_experts)[0])
        graph.replay()
        want_idx, want_weights = ops.moe_route(logits.cpu(), bias.cpu(), **case, counts=want_counts, real=real.cpu())
        where = (replay, seed)
        assert torch.equal(idx.cpu(), want_idx), where
        torch.testing.assert_close(weights.cpu(), want_weights, rtol=RTOL["cuda"], atol=1e-7, msg=str(where))
        assert torch.equal(counts.cpu(), want_counts), where

def test_the_engine_counts_only_real_rows():
    """route_and_count adds each real row's chosen ids to its layer's counts; padding rows add nothing."""
    cfg = moe_config(random.Random(random.randrange(2**31)))
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    logits, bias = _logits(gen, 9, cfg.n_routed_experts)
    real = torch.tensor([True] * 6 + [False] * 3)
    counts = torch.zeros(cfg.n_routed_experts, dtype=torch.int32)
    idx, _ = route_and_count(cfg, logits, bias, counts, real)
    assert torch.equal(counts, torch.bincount(idx[:6].reshape(-1), minlength=cfg.n_routed_experts).int())


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    logits, bias = (t.to(device) for t in _logits(gen, 5, 16))
    torch.library.opcheck(torch.ops.ddtree.moe_route.default, (logits, bias, 3, 4, 2, False, True, 2.5))
    counts = torch.zeros(16, dtype=torch.int32, device=device)
    real = torch.tensor([True, False, True, True, False], device=device)
    torch.library.opcheck(torch.ops.ddtree.moe_route.default, (logits, bias, 3, 4, 2, True, False, 1.0, counts, real))


@pytest.mark.parametrize("change, message", [
    (lambda a: {**a, "logits": a["logits"].double()}, "logits must be float32"),
    (lambda a: {**a, "logits": a["logits"][0]}, "logits must be 2-dim"),
    (lambda a: {**a, "logits": a["logits"].t()}, "logits must be contiguous"),
    (lambda a: {**a, "logits": torch.zeros(2, 0)}, "logits must hold E in"),
    (lambda a: {**a, "logits": torch.zeros(2, 8192), "bias": torch.zeros(8192)}, "logits must hold E in"),
    (lambda a: {**a, "bias": a["bias"][:5]}, "bias must hold E = logits.size(1) = 16"),
    (lambda a: {**a, "bias": a["bias"].half()}, "bias must be float32"),
    (lambda a: {**a, "num_groups": 3}, "num_groups must divide E = 16"),
    (lambda a: {**a, "num_groups": 0}, "num_groups must divide"),
    (lambda a: {**a, "top_groups": 5}, "top_groups must be in [1, num_groups = 4]"),
    (lambda a: {**a, "top_groups": 0}, "top_groups must be in"),
    (lambda a: {**a, "top_k": 9}, "top_k must be in [1, 8]"),
    (lambda a: {**a, "top_k": 0}, "top_k must be in"),
    (lambda a: {**a, "counts": torch.zeros(16)}, "counts must be int32"),
    (lambda a: {**a, "counts": torch.zeros(15, dtype=torch.int32)}, "counts must hold E = 16"),
    (lambda a: {**a, "real": torch.ones(3, dtype=torch.bool)}, "pass counts with it"),
    (lambda a: {**a, "counts": torch.zeros(16, dtype=torch.int32), "real": torch.ones(2, dtype=torch.bool)},
     "real must hold N = 3"),
    (lambda a: {**a, "counts": torch.zeros(16, dtype=torch.int32), "real": torch.ones(3)}, "real must be bool"),
])
def test_bad_arguments_raise_clear_errors(change, message):
    args = {"logits": torch.randn(3, 16), "bias": torch.zeros(16), "top_k": 3, "num_groups": 4, "top_groups": 2,
            "softmax": False, "normalize": True, "scaling": 1.0}
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ops.moe_route(**change(args))
