"""The budget policy's ops (budget_choose, confidence_learn; engine/decoding/budget.py calls them) against
kernels/reference.py, on the CPU and, where torch sees one, a CUDA GPU: trees from tree_build on fresh random draft
log-probabilities (small vocabularies, so some trees are padded), opcheck, ties, NaN values, the CPU's errors and in-
place updates. Each test names its seed on failure. What only a GPU can check (graph capture, host syncs, what CUDA
does with the values the CPU refuses) is in test_budget_ops_cuda.py."""
from __future__ import annotations

import random

import pytest
import torch
from budget_cases import TOL, assert_chosen, case_of, choose_args, learn_args, seeds

from kernels import ops, reference

needs_cuda = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICES = ["cpu", pytest.param("cuda", marks=needs_cuda)]


# ---------------------------------------------------------------- against the reference and the engine


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_classes", [1, 2, 4])
@pytest.mark.parametrize("budget", [0, 1, 7, 64, 1024])
def test_budget_choose_matches_reference(device, num_classes, budget):
    for seed in seeds(6):
        case = case_of(seed, budget, num_classes, device)
        chosen, expected, value = ops.budget_choose(*choose_args(case))
        _, want_expected, want_value = reference.budget_choose(*(t.cpu() for t in choose_args(case)))
        assert expected.device == value.device == chosen.device == case["scores"].device
        torch.testing.assert_close(expected.cpu(), want_expected, **TOL, msg=lambda m, s=seed: f"seed {s}: {m}")
        torch.testing.assert_close(value.cpu(), want_value, **TOL, msg=lambda m, s=seed: f"seed {s}: {m}")
        assert_chosen(chosen, value, want_value, seed)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_classes", [1, 2, 4])
@pytest.mark.parametrize("budget", [0, 1, 7, 64, 1024])
def test_confidence_learn_matches_reference(device, num_classes, budget):
    for seed in seeds(6):
        case = case_of(seed, budget, num_classes, device)
        got = case["realised"].clone(), case["predicted"].clone()
        want = case["realised"].cpu(), case["predicted"].cpu()
        ops.confidence_learn(*learn_args(case, *got))
        reference.confidence_learn(*learn_args({k: t.cpu() for k, t in case.items()}, *want))
        assert torch.equal(got[0].cpu(), want[0]), f"seed {seed}"  # one +1 per depth at most: exact
        torch.testing.assert_close(got[1].cpu(), want[1], **TOL, msg=lambda m, s=seed: f"seed {s}: {m}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["budget_choose", "confidence_learn"])
def test_opcheck(device, name):
    case = case_of(random.randrange(2**31), 20, 2, device)
    args = choose_args(case) if name == "budget_choose" else learn_args(case, case["realised"], case["predicted"])
    torch.library.opcheck(getattr(torch.ops.ddtree, name).default, args)


# ---------------------------------------------------------------- ties, NaN, in place


def _small_tree(device: str, num_depths: int, vocab: int, budget: int, ones: bool = True) -> dict:
    draft = torch.log_softmax(torch.randn(num_depths, vocab), dim=-1)
    tree = ops.tree_build(draft, torch.tensor(0), budget)
    tables = torch.ones(num_depths + 1, 2) if ones else torch.rand(num_depths + 1, 2) + 0.5
    case = {"scores": tree.scores, "parents": tree.parents, "depths": tree.depths, "ranks": tree.ranks,
            "realised": tables, "predicted": tables.clone()}
    return {k: t.to(device) for k, t in case.items()}


def _choose(case: dict, buckets: list[int], seconds: list[float]) -> ops.BucketChoice:
    device = case["scores"].device
    case = case | {"buckets": torch.tensor(buckets, device=device), "seconds": torch.tensor(seconds, device=device)}
    return ops.budget_choose(*choose_args(case))


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_smaller_bucket(device):
    case = _small_tree(device, 1, 2, 8)  # the root and 2 nodes, then 6 padding nodes: p = 0 adds exactly 0
    got = _choose(case, [0, 2, 4, 8], [4.0, 1.0, 1.0, 1.0])
    assert got.value[1] == got.value[2] == got.value[3] > got.value[0]
    assert int(got.chosen) == 1
    assert int(_choose(case, [2, 2, 2], [1.0, 1.0, 1.0]).chosen) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_nan_values_are_never_chosen(device):
    case = _small_tree(device, 3, 3, 20, ones=False)
    case["realised"][2] = 0  # 0 / 0: factor NaN at depth 2, so every path through depth 2 and every sum after it
    case["predicted"][2] = 0
    first = int((case["depths"] == 2).nonzero()[0])  # its parent, at depth 1, comes before it
    got = _choose(case, [0, first - 1, first, 20], [1.0, 1e-3, 1e-6, 1e-9])
    assert got.value[2:].isnan().all() and not got.value[:2].isnan().any()
    assert int(got.chosen) == 1 and int(torch.argmax(got.value)) >= 2  # argmax alone would take a NaN
    all_nan = _choose(case, [first, 20], [1.0, 1.0])
    assert all_nan.value.isnan().all() and int(all_nan.chosen) == 0


@pytest.mark.parametrize("device", DEVICES)
def test_confidence_learn_adds_in_place(device):
    seed = random.randrange(2**31)
    case = case_of(seed, 64, 2, device)
    while int((case["path"] >= 0).sum()) < 2:  # a path that took at least one drafted node
        seed += 1
        case = case_of(seed, 64, 2, device)
    realised, predicted = case["realised"].clone(), case["predicted"].clone()
    pointers = realised.data_ptr(), predicted.data_ptr()
    inputs = {k: case[k].clone() for k in ("parents", "depths", "ranks", "scores", "path")}
    assert ops.confidence_learn(*learn_args(case, realised, predicted)) is None
    once = realised.clone(), predicted.clone()
    ops.confidence_learn(*learn_args(case, realised, predicted))
    assert (realised.data_ptr(), predicted.data_ptr()) == pointers
    for before, after_one, after_two in zip((case["realised"], case["predicted"]), once, (realised, predicted),
                                            strict=True):
        torch.testing.assert_close(after_two - after_one, after_one - before, **TOL)  # each call adds the same
        assert torch.equal(after_one[0], before[0]), f"seed {seed}: depth 0 learns nothing"
        assert (after_one >= before).all() and (after_one > before).any(), f"seed {seed}"
    num_taken = int((case["path"] >= 0).sum()) - 1  # the root is no depth's trial
    assert float((once[0] - case["realised"]).sum()) == pytest.approx(num_taken, abs=1e-4), f"seed {seed}"
    for name, t in inputs.items():
        assert torch.equal(case[name], t), f"{name} changed"


# ---------------------------------------------------------------- the CPU's errors


def _bad(op: str, **replace):
    def call():
        case = case_of(7, 7, 2) | replace
        if op == "choose":
            return ops.budget_choose(*choose_args(case))
        return ops.confidence_learn(*learn_args(case, case["realised"], case["predicted"]))

    return call


def _with(name: str, index: int, value) -> torch.Tensor:
    t = case_of(7, 7, 2)[name].clone()
    t[index] = value
    return t


BAD_INPUTS = {
    "NaN score": (_bad("choose", scores=_with("scores", 3, float("nan"))), "scores has NaN at node 3"),
    "zero seconds": (_bad("choose", seconds=_with("seconds", 0, 0.0)), r"seconds\[0\] = 0 must be a finite time > 0"),
    "negative seconds": (_bad("choose", seconds=_with("seconds", 0, -1.0)), r"seconds\[0\] = -1 must be a finite time"),
    "inf seconds": (_bad("choose", seconds=_with("seconds", 0, float("inf"))), r"seconds\[0\] = inf must be a finite"),
    "NaN seconds": (_bad("choose", seconds=_with("seconds", 0, float("nan"))), r"seconds\[0\] = nan must be a finite"),
    "seconds length": (_bad("choose", seconds=torch.ones(3)), r"seconds must be \[K\], one per bucket"),
    "bucket beyond": (_bad("choose", buckets=_with("buckets", 0, 8)), r"buckets\[0\] = 8 must be a budget in \[0, N"),
    "bucket negative": (_bad("choose", buckets=_with("buckets", 0, -1)), r"buckets\[0\] = -1 must be a budget"),
    "buckets dtype": (_bad("choose", buckets=case_of(7, 7, 2)["buckets"].int()), "buckets must be int64, got int32"),
    "no buckets": (_bad("choose", buckets=torch.tensor([], dtype=torch.int64), seconds=torch.ones(0)),
                   "buckets must list at least one budget"),
    "scores dim": (_bad("choose", scores=torch.zeros(8, 1)), r"scores must be 1-dim \[N\]"),
    "scores dtype": (_bad("learn", scores=torch.zeros(8, dtype=torch.float64)), "scores must be float32"),
    "parents length": (_bad("learn", parents=torch.full((9,), -1)), r"scores, parents, depths and ranks must all"),
    "tables shapes": (_bad("choose", predicted=torch.ones(3, 3)), "predicted must have realised's shape"),
    "tables dim": (_bad("learn", realised=torch.ones(7)), r"realised must be 2-dim \[L \+ 1, C\]"),
    "tables strides": (_bad("learn", realised=torch.ones(2, 8).t(), predicted=torch.ones(8, 2)),
                       "realised must be contiguous"),
    "parent order": (_bad("choose", parents=_with("parents", 2, 5)), r"parents\[2\] = 5 must be -1 or a node index"),
    "depth beyond": (_bad("learn", depths=_with("depths", 1, 30)), r"depths\[1\] = 30 has no row"),
    "negative rank": (_bad("choose", ranks=_with("ranks", 1, -1)), r"ranks\[1\] = -1 must be >= 0"),
    "path beyond": (_bad("learn", path=torch.tensor([0, 8])), r"path\[1\] = 8 is neither a node index in \[0, 8\)"),
    "path negative": (_bad("learn", path=torch.tensor([0, -2])), r"path\[1\] = -2 is neither a node index"),
    "path dtype": (_bad("learn", path=torch.tensor([0], dtype=torch.int32)), "path must be int64, got int32"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_cpu_refuses_bad_inputs_with_clear_errors(case):
    call, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message):
        call()
