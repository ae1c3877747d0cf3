"""Random inputs of the budget policy's ops (a built tree, confidence tables, buckets, seconds, an accepted path)
and the contract's choice, shared by test_budget_ops.py and test_budget_ops_cuda.py."""
from __future__ import annotations

import random

import torch

from kernels import ops

TOL = {"rtol": 1e-5, "atol": 1e-5}


def seeds(num: int) -> list[int]:
    return [random.randrange(2**31) for _ in range(num)]


def case_of(seed: int, budget: int, num_classes: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """A built tree, random confidence tables, buckets, their seconds and tree_accept's path on a random target."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_depths, vocab = rng.randint(1, 6), rng.choice([1, 2, 3, 5, 40])
    draft = torch.log_softmax(torch.randn(num_depths, vocab, generator=gen) * 3, dim=-1)
    tree = ops.tree_build(draft, torch.tensor(0), budget)
    rows = num_depths + 1 + rng.randint(0, 2)  # one row per depth 0..L, maybe more
    num_buckets = rng.randint(1, min(6, budget + 1))
    target = torch.randint(vocab, tree.tokens.shape, generator=gen)
    case = {
        "scores": tree.scores, "parents": tree.parents, "depths": tree.depths, "ranks": tree.ranks,
        "realised": torch.rand(rows, num_classes, generator=gen) * 4 + 0.1,
        "predicted": torch.rand(rows, num_classes, generator=gen) * 4 + 0.1,
        "buckets": torch.tensor(sorted(rng.sample(range(budget + 1), num_buckets))),
        "seconds": (torch.rand(num_buckets, generator=gen) + 0.05).cumsum(0) * 1e-3,
        "path": ops.tree_accept(tree.tokens, tree.parents, target, num_depths).path,
        "visibility": tree.visibility,
    }
    return {name: t.to(device) for name, t in case.items()}


def choose_args(case: dict) -> tuple:
    return tuple(case[k] for k in ("scores", "parents", "depths", "ranks", "realised", "predicted", "buckets",
                                   "seconds"))


def learn_args(case: dict, realised: torch.Tensor, predicted: torch.Tensor) -> tuple:
    return (realised, predicted, *(case[k] for k in ("parents", "depths", "ranks", "scores", "path")))


def first_best(value: torch.Tensor) -> int:
    """The contract's choice from the values alone: the first largest, NaN never (0 if all are)."""
    values = value.tolist()
    numbers = [k for k, v in enumerate(values) if v == v]
    return min(numbers, key=lambda k: (-values[k], k)) if numbers else 0


def assert_chosen(got_chosen: torch.Tensor, got_value: torch.Tensor, want_value: torch.Tensor, seed: int) -> None:
    assert got_chosen.shape == () and got_chosen.dtype == torch.int64, seed
    assert int(got_chosen) == first_best(got_value.cpu()), f"seed {seed}: {got_chosen} is not the best of {got_value}"
    best, *rest = sorted(want_value.tolist(), reverse=True) + [float("-inf")]
    if best - rest[0] > 1e-4 * abs(best):  # no near tie: float rounding cannot change the choice
        assert int(got_chosen) == first_best(want_value), f"seed {seed}: {got_value} against {want_value}"
