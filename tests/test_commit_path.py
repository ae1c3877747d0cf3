"""ops.commit_path (csrc/cpu/commit_path.cpp, csrc/cuda/commit_path.cu) against kernels/reference.py on fresh random
steps, on the CPU and, where there is one, on the GPU: the generated tokens (slots past the end dropped), the counters
and the root, strided inputs; on the GPU the clamps the contract gives it, no host sync and a captured graph replayed
over a decode's steps; the CPU op's value and argument errors (nothing written), opcheck."""
from __future__ import annotations

import random
import re

import pytest
import torch
from host_sync import assert_no_host_sync

from kernels import ops, reference
from kernels.graph_capture import capture

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, needs_cuda])]
MUTATED = ("generated", "num_generated", "root", "prefix_len")
TOKENS = 2**40  # token ids drawn below this: a kernel that narrows them to 32 bits fails


def _step(rng: random.Random, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random step's arguments: N nodes, a path of P entries (L distinct nodes, then -1), G slots; half the time
    num_generated is near G, so some of the path's slots fall past the end."""
    num_nodes, path_size, num_slots = rng.randint(1, 60), rng.randint(1, 33), rng.randint(1, 40)
    length = rng.randint(1, min(path_size, num_nodes))
    start = rng.randint(max(0, num_slots - length), num_slots + 2) if rng.random() < 0.5 else rng.randint(0, num_slots)
    return {
        "target": torch.randint(0, TOKENS, (num_nodes,), generator=gen),
        "path": torch.tensor(rng.sample(range(num_nodes), length) + [-1] * (path_size - length)),
        "path_len": torch.tensor(length),
        "bonus": torch.randint(0, TOKENS, (), generator=gen),
        "generated": torch.randint(0, TOKENS, (num_slots,), generator=gen),
        "num_generated": torch.tensor(start),
        "root": torch.randint(0, TOKENS, (), generator=gen),
        "prefix_len": torch.tensor(rng.randint(0, 5000)),
    }


def _on(step: dict[str, torch.Tensor], device: str) -> dict[str, torch.Tensor]:
    return {name: t.clone().to(device) for name, t in step.items()}


def _assert_committed(got: dict[str, torch.Tensor], step: dict[str, torch.Tensor], where) -> None:
    """got's tensors are the reference's commit of step, and its inputs are as step holds them."""
    want = _on(step, "cpu")
    reference.commit_path(**want)
    for name, t in got.items():
        assert torch.equal(t.cpu(), want[name]), (name, *where)
    start, length = int(step["num_generated"]), int(step["path_len"])
    assert int(got["num_generated"]) == start + length, where
    assert int(got["prefix_len"]) == int(step["prefix_len"]) + length and int(got["root"]) == int(step["bonus"]), where


@pytest.mark.parametrize("device", DEVICES)
def test_matches_the_reference_on_random_steps(device):
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    num_dropped = num_written = 0
    for case in range(200):
        step = _step(rng, gen)
        got = _on(step, device)
        ops.commit_path(**got)
        _assert_committed(got, step, (case, seed))
        start, length, num_slots = int(step["num_generated"]), int(step["path_len"]), step["generated"].shape[0]
        num_written += max(0, min(start + length, num_slots) - start)
        num_dropped += length - max(0, min(start + length, num_slots) - start)
    assert num_written > 0 and num_dropped > 0, seed


@pytest.mark.parametrize("device", DEVICES)
def test_strided_target_and_path(device):
    """target a column of a wider tensor, path every other entry of a longer one: read at their strides."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(20):
        step = _step(rng, gen)
        got = _on(step, device)
        num_nodes, path_size = step["target"].shape[0], step["path"].shape[0]
        wide = torch.randint(0, TOKENS, (num_nodes, 3), generator=gen).to(device)
        wide[:, 1] = got["target"]
        longer = torch.full((2 * path_size,), -7, device=device)
        longer[::2] = got["path"]
        got["target"], got["path"] = wide[:, 1], longer[::2]
        assert got["target"].stride(0) == 3 and got["path"].stride(0) == 2
        ops.commit_path(**got)
        _assert_committed(got, step, (case, seed))


def _cuda_contract(step: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the CUDA op does with any values (ops.py): path_len clamped into [0, P], entries outside [0, N) and
    slots outside [0, G) skipped, the counters moved by the clamped length."""
    want = _on(step, "cpu")
    target, path, generated = want["target"].tolist(), want["path"].tolist(), want["generated"]
    start, length = int(want["num_generated"]), min(max(int(want["path_len"]), 0), len(path))
    for i in range(length):
        if 0 <= path[i] < len(target) and 0 <= start + i < generated.shape[0]:
            generated[start + i] = target[path[i]]
    want["num_generated"].fill_(start + length)
    want["prefix_len"] += length
    want["root"].copy_(want["bonus"])
    return want


@pytest.mark.cuda
@needs_cuda
def test_cuda_clamps_what_the_cpu_op_rejects():
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for case in range(100):
        step = _step(rng, gen)
        path_size, num_nodes = step["path"].shape[0], step["target"].shape[0]
        step["path_len"].fill_(rng.choice([0, -3, path_size + rng.randint(1, 5), rng.randint(1, path_size)]))
        for i in rng.sample(range(path_size), rng.randint(0, path_size)):
            step["path"][i] = rng.choice([-1, -2, num_nodes, num_nodes + 40, rng.randrange(num_nodes)])
        step["num_generated"].fill_(rng.randint(-40, step["generated"].shape[0] + 2))
        got = _on(step, "cuda")
        ops.commit_path(**got)
        want = _cuda_contract(step)
        for name, t in got.items():
            assert torch.equal(t.cpu(), want[name]), (name, case, seed)


@pytest.mark.cuda
@needs_cuda
def test_cuda_makes_no_host_sync():
    step = _on(_step(random.Random(random.randrange(2**31)), torch.Generator().manual_seed(0)), "cuda")
    assert_no_host_sync(ops.commit_path, tuple(step.values()))


@pytest.mark.cuda
@needs_cuda
def test_cuda_commits_a_decode_in_a_replayed_graph():
    """Captured once over fixed buffers; each replay commits a new step's path, written in place, after the last."""
    seed = random.randrange(2**31)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    num_nodes, path_size, num_slots = 40, 9, 32
    step = _step(rng, gen)
    step |= {"target": torch.zeros(num_nodes, dtype=torch.int64), "path": torch.full((path_size,), -1),
             "path_len": torch.tensor(1), "generated": torch.zeros(num_slots, dtype=torch.int64),
             "num_generated": torch.tensor(1), "prefix_len": torch.tensor(7)}
    step["path"][0] = 0
    got = _on(step, "cuda")
    graph, _ = capture(lambda: ops.commit_path(**_on(step, "cuda")), lambda: ops.commit_path(**got))
    want = _on(step, "cpu")
    for replay in range(12):  # 12 steps of 3 to 9 tokens overrun the 32 slots: the last ones are dropped
        length = rng.randint(3, path_size)
        path = torch.tensor([0, *sorted(rng.sample(range(1, num_nodes), length - 1))] + [-1] * (path_size - length))
        fresh = {"target": torch.randint(0, TOKENS, (num_nodes,), generator=gen), "path": path,
                 "path_len": torch.tensor(length), "bonus": torch.randint(0, TOKENS, (), generator=gen)}
        for name, t in fresh.items():
            got[name].copy_(t)
            want[name].copy_(t)
        graph.replay()
        reference.commit_path(**want)
        for name in MUTATED:
            assert torch.equal(got[name].cpu(), want[name]), (name, replay, seed)
    assert int(want["num_generated"]) > num_slots, seed


@pytest.mark.cuda
@needs_cuda
def test_cuda_arguments_on_two_devices_raise():
    step = _on(_step(random.Random(0), torch.Generator().manual_seed(0)), "cuda")
    with pytest.raises(RuntimeError, match="path_len is on cpu but target is on cuda"):
        ops.commit_path(**(step | {"path_len": step["path_len"].cpu()}))
    with pytest.raises(RuntimeError, match="generated is on cuda:0 but target is on cpu"):
        ops.commit_path(**(_on(step, "cpu") | {"generated": step["generated"]}))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    """A step whose every mutated argument changes: slots written, the counters moved, a new root."""
    step = {"target": torch.tensor([5, 8, 13, 21, 34]), "path": torch.tensor([0, 3, 4, -1]),
            "path_len": torch.tensor(3), "bonus": torch.tensor(55), "generated": torch.zeros(8, dtype=torch.int64),
            "num_generated": torch.tensor(2), "root": torch.tensor(1), "prefix_len": torch.tensor(6)}
    op = ops._ops().commit_path.default  # through the loader, so the op and its fake exist when this test runs alone
    torch.library.opcheck(op, tuple(_on(step, device).values()))


def _small_step() -> dict[str, torch.Tensor]:
    """N = 7 nodes, P = 5 path entries (3 accepted), G = 10 slots."""
    return {"target": torch.arange(100, 107), "path": torch.tensor([0, 2, 6, -1, -1]), "path_len": torch.tensor(3),
            "bonus": torch.tensor(9), "generated": torch.zeros(10, dtype=torch.int64),
            "num_generated": torch.tensor(4), "root": torch.tensor(3), "prefix_len": torch.tensor(20)}


def _with_path(entry: int, value: int):
    def change(step):
        path = step["path"].clone()
        path[entry] = value
        return step | {"path": path}
    return change


@pytest.mark.parametrize("change, message", [
    (lambda s: s | {"path_len": torch.tensor(0)}, "path_len must be in [1, P = path.size(0) = 5], got 0"),
    (lambda s: s | {"path_len": torch.tensor(6)}, "path_len must be in [1, P = path.size(0) = 5], got 6"),
    (_with_path(2, 7), "path[2] = 7 is not a node index in [0, N = 7)"),
    (_with_path(1, -1), "path[1] = -1 is not a node index in [0, N = 7)"),
    (lambda s: s | {"num_generated": torch.tensor(-1)}, "num_generated must be >= 0, got -1"),
    (lambda s: s | {"target": s["target"].float()}, "target must be int64, got float32"),
    (lambda s: s | {"target": s["target"][None]}, "target must be 1-dim [N]"),
    (lambda s: s | {"path": s["path"].int()}, "path must be int64, got int32"),
    (lambda s: s | {"path": s["path"][0]}, "path must be 1-dim [P]"),
    (lambda s: s | {"path": s["path"][:0]}, "path must hold at least the root's entry (P >= 1), got shape [0]"),
    (lambda s: s | {"generated": s["generated"].int()}, "generated must be int64, got int32"),
    (lambda s: s | {"generated": s["generated"].view(2, 5)}, "generated must be 1-dim [G]"),
    (lambda s: s | {"generated": s["generated"][::2]}, "generated must be contiguous"),
    (lambda s: s | {"path_len": s["path_len"][None]}, "path_len must be a 0-dim int64 tensor"),
    (lambda s: s | {"bonus": s["bonus"].int()}, "bonus must be a 0-dim int64 tensor (e.g. torch.tensor(5)), got int32"),
    (lambda s: s | {"num_generated": s["num_generated"].float()}, "num_generated must be a 0-dim int64 tensor"),
    (lambda s: s | {"root": s["root"][None]}, "root must be a 0-dim int64 tensor"),
    (lambda s: s | {"prefix_len": s["prefix_len"].int()}, "prefix_len must be a 0-dim int64 tensor"),
])
def test_cpu_errors_say_what_is_wrong_and_write_nothing(change, message):
    step = change(_small_step())
    before = {name: t.clone() for name, t in step.items()}
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ops.commit_path(**step)
    for name, t in step.items():
        assert torch.equal(t, before[name]), name
