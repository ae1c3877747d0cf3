"""The budget policy's CUDA ops where only a GPU can check them: captured in a CUDA graph and replayed on new inputs,
no host sync, and what they do with the values the CPU ops refuse (kernels/ops.py's contract). The comparisons with
the reference and the engine on both devices are in test_budget_ops.py."""
from __future__ import annotations

import random

import pytest
import torch
from budget_cases import TOL, case_of, choose_args, first_best, learn_args
from host_sync import assert_no_host_sync

from kernels import ops
from kernels.graph_capture import capture

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = "cuda"
INPUTS = ("scores", "parents", "depths", "ranks", "realised", "predicted", "buckets", "seconds", "path")


def _on_cuda(case: dict) -> dict:
    return {k: t.to(CUDA) for k, t in case.items()}


def _fresh_like(static: dict, seed: int) -> dict:
    """A new tree (same N) whose depths fit the static tables, with new tables, seconds and path of static's shapes."""
    while True:
        seed += 1
        fresh = case_of(seed, static["scores"].numel() - 1, static["realised"].shape[1])
        if int(fresh["depths"].max()) < static["realised"].shape[0]:
            break
    path_size = static["path"].numel()
    fresh["path"] = torch.nn.functional.pad(fresh["path"], (0, path_size), value=-1)[:path_size]
    fresh["buckets"] = static["buckets"].cpu()
    fresh["seconds"] = torch.rand(static["seconds"].shape) + 0.01
    fresh["realised"] = torch.rand(static["realised"].shape) + 0.1
    fresh["predicted"] = torch.rand(static["predicted"].shape) + 0.1
    return fresh


def test_both_ops_replay_in_a_cuda_graph_on_new_inputs():
    seed = random.randrange(2**31)
    static = _on_cuda(case_of(seed, 256, 2))
    def warm_up():
        ops.budget_choose(*choose_args(static))
        ops.confidence_learn(*learn_args(static, static["realised"].clone(), static["predicted"].clone()))

    def body():
        choice = ops.budget_choose(*choose_args(static))
        ops.confidence_learn(*learn_args(static, static["realised"], static["predicted"]))
        return choice

    graph, choice = capture(warm_up, body)
    for replay in range(3):
        fresh = _fresh_like(static, seed + 100 * replay)
        for name in INPUTS:
            static[name].copy_(fresh[name])
        want = ops.budget_choose(*choose_args(fresh))  # the CPU op, before the tables learn
        ops.confidence_learn(*learn_args(fresh, fresh["realised"], fresh["predicted"]))
        graph.replay()
        torch.testing.assert_close(choice.expected.cpu(), want.expected, **TOL)
        torch.testing.assert_close(choice.value.cpu(), want.value, **TOL)
        assert int(choice.chosen) == first_best(choice.value.cpu()), f"seed {seed}, replay {replay}"
        assert torch.equal(static["realised"].cpu(), fresh["realised"]), f"seed {seed}, replay {replay}"
        torch.testing.assert_close(static["predicted"].cpu(), fresh["predicted"], **TOL)


@pytest.mark.parametrize("name", ["budget_choose", "confidence_learn"])
def test_op_makes_no_host_sync(name):
    case = _on_cuda(case_of(random.randrange(2**31), 64, 2))
    args = choose_args(case) if name == "budget_choose" else learn_args(case, case["realised"], case["predicted"])
    assert_no_host_sync(getattr(torch.ops.ddtree, name), args)


def test_cuda_skips_or_clamps_what_the_cpu_refuses():
    seed = random.randrange(2**31)
    case = case_of(seed, 64, 2)
    num_nodes, num_depths = case["scores"].numel(), case["realised"].shape[0]
    bad, want = _on_cuda(case), dict(case)
    bad["path"] = torch.cat([case["path"], torch.tensor([num_nodes, num_nodes + 7, -2, -100])]).to(CUDA)
    bad["buckets"] = torch.tensor([-5, 0, num_nodes + 3], device=CUDA)  # clamped into [0, N - 1]
    want["buckets"] = torch.tensor([0, 0, num_nodes - 1])
    bad["seconds"] = torch.tensor([1.0, float("nan"), 1e-3], device=CUDA)  # value NaN: never chosen
    want["seconds"] = torch.tensor([1.0, 1.0, 1e-3])  # value[1] ties value[0]: never chosen either
    if num_nodes > 3:  # a parent after its node counts as -1, a depth beyond the tables as 0, a rank < 0 as 0
        for name, index, bad_value, want_value in (("parents", 1, num_nodes + 2, -1), ("depths", 2, num_depths, 0),
                                                   ("ranks", 3, -4, 0)):
            bad[name][index], want[name] = bad_value, want[name].clone()
            want[name][index] = want_value
    got = ops.budget_choose(*choose_args(bad))
    expected = ops.budget_choose(*choose_args(want))
    assert got.value[1].isnan() and int(got.chosen) == int(expected.chosen) != 1, f"seed {seed}"
    torch.testing.assert_close(got.expected.cpu(), expected.expected, **TOL)
    got_tables = bad["realised"].clone(), bad["predicted"].clone()
    ops.confidence_learn(*learn_args(bad, *got_tables))
    want_tables = want["realised"].clone(), want["predicted"].clone()
    ops.confidence_learn(*learn_args(want, *want_tables))
    for g, w in zip(got_tables, want_tables, strict=True):
        torch.testing.assert_close(g.cpu(), w, **TOL)


def test_cuda_limits_and_devices_raise_clear_errors():
    case = _on_cuda(case_of(3, 1024, 2))
    tree = ("scores", "parents", "depths", "ranks")
    too_big = case | {name: torch.cat([case[name], case[name][-1:]]) for name in tree}
    with pytest.raises(RuntimeError, match=r"budget_choose \(CUDA\): N = 1026 nodes is above the kernel's limit"):
        ops.budget_choose(*choose_args(too_big))
    with pytest.raises(RuntimeError, match=r"confidence_learn \(CUDA\): N = 1026 nodes is above"):
        ops.confidence_learn(*learn_args(too_big, too_big["realised"], too_big["predicted"]))
    with pytest.raises(RuntimeError, match="seconds is on cpu but scores is on cuda"):
        ops.budget_choose(*choose_args(case | {"seconds": case["seconds"].cpu()}))
    with pytest.raises(RuntimeError, match="path is on cpu but scores is on cuda"):
        ops.confidence_learn(*learn_args(case | {"path": case["path"].cpu()}, case["realised"], case["predicted"]))
