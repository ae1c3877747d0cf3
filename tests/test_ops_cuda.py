"""The CUDA ops against the CPU ops, kernels/reference.py and a float64 reference, on fresh random inputs.

Needs a CUDA GPU (skipped with that reason elsewhere). Outputs are checked in memory poisoned with 0xff
bytes (NaN for floats, -1 for int64) so an element a kernel never writes fails the comparison. Each test
draws a fresh seed and names it in its failure message.
"""
from __future__ import annotations

import random

import pytest
import torch
from host_sync import assert_no_host_sync
from masks import ancestor_mask, block_mask

from kernels import reference
from kernels.graph_capture import capture

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CUDA = "cuda"


@pytest.fixture(scope="module")
def ops():
    from kernels import ops

    return ops


def _seed() -> int:
    return random.randrange(2**31)


def _poison_allocator() -> None:
    """Fill the caching allocator's free memory with 0xff: the op's outputs and workspaces are carved from it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    small = [torch.full((1 << 20,), 0xFF, dtype=torch.uint8, device=CUDA) for _ in range(8)]  # small-block pool
    large = torch.full((512 << 20,), 0xFF, dtype=torch.uint8, device=CUDA)  # large-block pool
    del small, large


def _assert_same(got, want, seed: int) -> None:
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"output {i}, seed {seed}"
        assert torch.equal(g.cpu(), w.cpu()), f"output {i} differs, seed {seed}:\n{g}\n!=\n{w}"


# ---------------------------------------------------------------- tree_build


def _draft(seed: int, num_depths: int, vocab: int, kind: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if kind == "ties":  # integer log-probs: many equal values and scores
        return torch.randint(-8, 1, (num_depths, vocab), generator=gen).float()
    return torch.log_softmax(torch.randn(num_depths, vocab, generator=gen) * 3, dim=-1)


def _build_both(ops, draft: torch.Tensor, budget: int, seed: int):
    root = seed % 1000
    _poison_allocator()
    got = ops.tree_build(draft.to(CUDA), torch.tensor(root, device=CUDA), budget)
    want = ops.tree_build(draft, torch.tensor(root), budget)
    _assert_same(got, want, seed)
    return got, root


@pytest.mark.parametrize("budget", [0, 1, 7, 64, 256, 1024])
@pytest.mark.parametrize("num_depths", [1, 7, 15])
@pytest.mark.parametrize("vocab", [7, 512, 163840])
def test_tree_build_equals_cpu_op_with_ties(ops, vocab, num_depths, budget):
    seed = _seed()
    draft = _draft(seed, num_depths, vocab, "ties")
    got, root = _build_both(ops, draft, budget, seed)
    if vocab <= 512:
        _assert_same(got, reference.tree_build(draft, torch.tensor(root), budget), seed)


@pytest.mark.parametrize("budget", [1, 64, 256, 1024])
def test_tree_build_equals_cpu_op_on_log_softmax(ops, budget):
    seed = _seed()
    _build_both(ops, _draft(seed, 15, 163840, "smooth"), budget, seed)


@pytest.mark.parametrize("kind", ["smooth", "ties"])
@pytest.mark.parametrize("budget", [64, 256, 1024])
def test_tree_build_budget_limit_equals_cpu_op(ops, budget, kind):
    """A budget_limit read on the device: every limit gives the CPU op's tree (heap below 64 pops, the threshold
    build above, with the full budget's K candidates), out-of-range limits clamped into [0, B]."""
    seed = _seed()
    draft = _draft(seed, 7, 163840 if kind == "smooth" else 512, kind)
    root = seed % 1000
    for limit in (0, 1, 16, 63, 64, budget // 2, budget):
        got = ops.tree_build(draft.to(CUDA), torch.tensor(root, device=CUDA), budget,
                             torch.tensor(limit, device=CUDA))
        _assert_same(got, ops.tree_build(draft, torch.tensor(root), budget, torch.tensor(limit)), seed)
    for limit, clamped in ((-5, 0), (budget + 9, budget)):
        got = ops.tree_build(draft.to(CUDA), torch.tensor(root, device=CUDA), budget, torch.tensor(limit, device=CUDA))
        _assert_same(got, ops.tree_build(draft, torch.tensor(root), budget, torch.tensor(clamped)), seed)


def test_tree_build_equals_reference_at_full_vocab(ops):
    seed = _seed()
    draft = _draft(seed, 15, 163840, "ties")
    got, root = _build_both(ops, draft, 256, seed)
    _assert_same(got, reference.tree_build(draft, torch.tensor(root), 256), seed)


def test_tree_build_special_values(ops):
    """-inf and -0.0 / +0.0 (equal floats: ties broken by token) behave as on the CPU."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randint(-2, 1, (6, 300), generator=gen).float()
    draft[torch.rand(draft.shape, generator=gen) < 0.3] = float("-inf")
    zeros = draft == 0
    draft[zeros & (torch.rand(draft.shape, generator=gen) < 0.5)] = -0.0
    for budget in (5, 100, 1024):
        _build_both(ops, draft, budget, seed)


@pytest.mark.parametrize("budget", [16, 256, 1024])
@pytest.mark.parametrize("sharpness", [1.0, 4.0, 16.0, 64.0])
def test_threshold_build_applies_to_log_probs(ops, monkeypatch, sharpness, budget):
    """Log-probs, flat (a one-level tree) to peaked (15 levels, thresholds raised several times): the threshold
    build alone gives the CPU op's tree. DDTREE_TREE_BUILD=threshold leaves the tree empty where it gives up,
    so a silent fallback to the heap would fail here."""
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    draft = torch.log_softmax(sharpness * torch.randn(15, 32768, generator=gen), dim=-1)
    monkeypatch.setenv("DDTREE_TREE_BUILD", "threshold")
    _build_both(ops, draft, budget, seed)


@pytest.mark.parametrize("noise", [0.0, 0.3])
@pytest.mark.parametrize("budget", [64, 256])
def test_threshold_build_orders_tied_scores_like_the_heap(ops, monkeypatch, noise, budget):
    """The oracle drafter's rows share their values, so many nodes tie in (score, depth, rank) and differ only
    in the parent: the threshold build orders them by the parent's position, as the heap does."""
    from engine.drafters.oracle import OracleDrafter

    seed = _seed()
    rng = random.Random(seed)
    drafter = OracleDrafter([rng.randrange(5000) for _ in range(14)], 5000, 14, noise=noise, seed=seed)
    monkeypatch.setenv("DDTREE_TREE_BUILD", "threshold")
    _build_both(ops, drafter.table, budget, seed)


@pytest.mark.parametrize("budget", [64, 256])
def test_auto_on_a_half_tied_draft_gives_the_cpu_ops_tree(ops, monkeypatch, budget):
    """The oracle's rows hold thousands of tokens at one floor logprob, so each depth's top-k is half tied and
    `auto` pops the heap there (kernels/csrc/cuda/tree_build.cu half_tied): the CPU op's tree, ties included."""
    from engine.drafters.oracle import OracleDrafter

    seed = _seed()
    rng = random.Random(seed)
    drafter = OracleDrafter([rng.randrange(20000) for _ in range(15)], 20000, 15, noise=0.3, seed=seed)
    monkeypatch.setenv("DDTREE_TREE_BUILD", "auto")
    _build_both(ops, drafter.table[:15].contiguous(), budget, seed)


@pytest.mark.parametrize("method", ["auto", "heap", "threshold"])
def test_tree_build_methods_on_positive_logprobs(ops, monkeypatch, method):
    """A positive logprob breaks the threshold build's premise (children never outscore their parent): auto
    and heap give the CPU op's tree, threshold an empty one (every node after the root is padding)."""
    seed = _seed()
    draft = torch.randn(6, 1000, generator=torch.Generator().manual_seed(seed))
    monkeypatch.setenv("DDTREE_TREE_BUILD", method)
    if method != "threshold":
        _build_both(ops, draft, 100, seed)
        return
    root = torch.tensor(5, device=CUDA)
    tokens, parents, depths, ranks, scores, visibility = ops.tree_build(draft.to(CUDA), root, 100)
    assert tokens.eq(5).all() and parents[1:].eq(-1).all() and depths.eq(0).all() and ranks.eq(0).all()
    assert scores[0] == 0 and scores[1:].eq(float("-inf")).all()
    assert torch.equal(visibility.cpu(), torch.eye(101, dtype=torch.bool))


def test_tree_build_method_choice_error(ops, monkeypatch):
    monkeypatch.setenv("DDTREE_TREE_BUILD", "beam")
    with pytest.raises(RuntimeError, match="DDTREE_TREE_BUILD=beam is not one of auto, heap, threshold"):
        ops.tree_build(torch.zeros(2, 10, device=CUDA), torch.tensor(0, device=CUDA), 4)


def test_tree_build_orders_nan_like_minus_inf(ops):
    """The CPU op raises on NaN; the CUDA op cannot without a host sync and orders NaN like -inf."""
    seed = _seed()
    draft = _draft(seed, 4, 1000, "ties")
    draft[torch.rand(draft.shape, generator=torch.Generator().manual_seed(seed)) < 0.2] = float("nan")
    got = ops.tree_build(draft.to(CUDA), torch.tensor(3, device=CUDA), 200)
    _assert_same(got, ops.tree_build(draft.masked_fill(draft.isnan(), float("-inf")), torch.tensor(3), 200), seed)


# ---------------------------------------------------------------- verify_attn




def _attention_f64(q_lat, q_pe, ckv, kpe, prefix: int, mask, scale: float):
    """Dense float64 attention on the inputs' device (kernels.reference.verify_attn builds its mask on the CPU)."""
    num_nodes, cache_rows = q_lat.shape[0], ckv.shape[0]
    visible = torch.zeros(num_nodes, cache_rows, dtype=torch.bool, device=ckv.device)
    visible[:, :prefix] = True
    visible[:, prefix : prefix + num_nodes] = mask
    scores = torch.einsum("nhr,sr->nhs", q_lat.double(), ckv.double())
    scores += torch.einsum("nhp,sp->nhs", q_pe.double(), kpe.double())
    scores = (scores * scale).masked_fill_(~visible[:, None, :], float("-inf"))  # [N, H, S]
    lse = torch.logsumexp(scores, dim=-1)
    o_lat = torch.einsum("nhs,sr->nhr", torch.exp(scores - lse[..., None]).nan_to_num_(0.0), ckv.double())
    return o_lat, lse


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.double().to(want.device), want.double()
    assert torch.equal(torch.isfinite(got), torch.isfinite(want)), "non-finite elements differ (unwritten?)"
    finite = torch.isfinite(want)
    return float((got - want)[finite].abs().max() / want[finite].abs().max().clamp_min(1e-30))


# (N, H, R, P, S, prefix_len, mask); the last rows are the big Kimi-K2 shapes, kept few.
ATTN_CASES = {
    "tiny-causal": (3, 4, 32, 8, 3, 0, "causal"),
    "tiny-tree-prefix": (5, 4, 32, 8, 16, 9, "tree"),
    "odd-dims": (6, 3, 36, 6, 50, 20, "tree"),  # unvectorised loads, partial chunks, a partial head tile
    "small-tree-no-prefix": (33, 8, 128, 32, 40, 0, "tree"),
    "prefill": (64, 16, 512, 64, 64, 0, "causal"),
    "causal-after-prefix": (16, 8, 512, 64, 100, 84, "causal"),
    "empty-splits": (2, 8, 512, 64, 8192, 100, "tree"),  # most splits of the capacity see nothing
    "ar-split-kv": (1, 64, 512, 64, 4096, 3000, "single"),
    "tree-verify": (257, 64, 512, 64, 2048, 1500, "tree"),
    "ar-full-cache": (1, 64, 512, 64, 32768, 32767, "single"),
    "tree-verify-full-cache": (257, 64, 512, 64, 32768, 32768 - 257, "tree"),
    "long-prefill": (384, 64, 512, 64, 512, 0, "causal"),  # row i sees rows 0..i: tiles past it are skipped
}
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _attn_inputs(case: str, dtype: torch.dtype, seed: int):
    num_nodes, num_heads, lat_dim, rope_dim, cache_rows, prefix, kind = ATTN_CASES[case]
    gen = torch.Generator().manual_seed(seed)
    q_lat = torch.randn(num_nodes, num_heads, lat_dim, generator=gen).to(dtype)
    q_pe = torch.randn(num_nodes, num_heads, rope_dim, generator=gen).to(dtype)
    ckv = torch.randn(cache_rows, lat_dim, generator=gen).to(dtype)
    kpe = torch.randn(cache_rows, rope_dim, generator=gen).to(dtype)
    mask = block_mask(kind, num_nodes, random.Random(seed))
    return q_lat, q_pe, ckv, kpe, prefix, mask, 1.5 * (lat_dim + rope_dim) ** -0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", ATTN_CASES)
def test_verify_attn_matches_float64(ops, case, dtype):
    seed = _seed()
    q_lat, q_pe, ckv, kpe, prefix, mask, scale = _attn_inputs(case, dtype, seed)
    cuda_args = (q_lat.to(CUDA), q_pe.to(CUDA), ckv.to(CUDA), kpe.to(CUDA), torch.tensor(prefix, device=CUDA))
    _poison_allocator()
    got = ops.verify_attn(*cuda_args, mask.to(CUDA), scale)
    assert got.o_lat.dtype == dtype and got.o_lat.shape == q_lat.shape and got.lse.shape == q_lat.shape[:2]
    want_o, want_lse = _attention_f64(*cuda_args[:4], prefix, mask.to(CUDA), scale)
    tol = TOLERANCE[dtype]
    assert _rel_err(got.o_lat, want_o) < tol, f"o_lat, seed {seed}"
    assert _rel_err(got.lse, want_lse) < tol, f"lse, seed {seed}"
    num_nodes, num_heads, _, _, cache_rows, _, _ = ATTN_CASES[case]
    if num_nodes * num_heads * cache_rows <= 4e7:  # the CPU op and the CPU reference are slow beyond that
        cpu_args = (q_lat, q_pe, ckv, kpe, torch.tensor(prefix), mask, scale)
        for name, (o, lse) in (("cpu op", ops.verify_attn(*cpu_args)), ("reference", reference.verify_attn(*cpu_args))):
            assert _rel_err(got.o_lat.cpu(), o) < tol, f"o_lat vs {name}, seed {seed}"
            assert _rel_err(got.lse.cpu(), lse) < tol, f"lse vs {name}, seed {seed}"


def _kernel_runs_here(kernel: str) -> bool:
    capability = torch.cuda.get_device_capability()
    return {"wgmma": capability == (9, 0), "mma": capability >= (8, 0), "cuda-core": True}[kernel]


KIMI_CASES = [case for case, (_, _, lat, rope, *_) in ATTN_CASES.items() if (lat, rope) == (512, 64)]


@pytest.mark.parametrize("kernel", ["wgmma", "mma", "cuda-core"])
@pytest.mark.parametrize("case", KIMI_CASES)
def test_each_verify_attn_kernel_matches_float64(ops, monkeypatch, case, kernel):
    """Every kernel that handles bfloat16 at R = 512, P = 64 (the auto choice is one of them)."""
    if not _kernel_runs_here(kernel):
        pytest.skip(f"the {kernel} kernel needs another GPU (this one is {torch.cuda.get_device_name()})")
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_KERNEL", kernel)
    seed = _seed()
    q_lat, q_pe, ckv, kpe, prefix, mask, scale = _attn_inputs(case, torch.bfloat16, seed)
    args = (q_lat.to(CUDA), q_pe.to(CUDA), ckv.to(CUDA), kpe.to(CUDA), torch.tensor(prefix, device=CUDA))
    _poison_allocator()
    got = ops.verify_attn(*args, mask.to(CUDA), scale)
    want_o, want_lse = _attention_f64(*args[:4], prefix, mask.to(CUDA), scale)
    assert _rel_err(got.o_lat, want_o) < 1e-2, f"o_lat, {kernel}, seed {seed}"
    assert _rel_err(got.lse, want_lse) < 1e-2, f"lse, {kernel}, seed {seed}"


SPLIT_CASES = ["ar-split-kv", "empty-splits", "odd-dims", "tree-verify", "ar-full-cache"]


@pytest.mark.parametrize("splits", [1, 2, 7, 64, 256])
@pytest.mark.parametrize("case", SPLIT_CASES)
def test_verify_attn_forced_splits_match_float64(ops, monkeypatch, case, splits):
    """Any split count (DDTREE_VERIFY_ATTN_SPLITS) gives the attention: one split writes o_lat itself, several go
    through the combine step, whose blocks take a chunk of the columns when the rows are few (N = 1), and splits
    past the visible rows see nothing. Two runs give the same bits (a fixed order)."""
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_SPLITS", str(splits))
    seed = _seed()
    dtype = torch.bfloat16 if ATTN_CASES[case][2:4] == (512, 64) else torch.float32
    q_lat, q_pe, ckv, kpe, prefix, mask, scale = _attn_inputs(case, dtype, seed)
    args = (q_lat.to(CUDA), q_pe.to(CUDA), ckv.to(CUDA), kpe.to(CUDA), torch.tensor(prefix, device=CUDA), mask.to(CUDA))
    _poison_allocator()
    got = ops.verify_attn(*args, scale)
    want_o, want_lse = _attention_f64(*args[:4], prefix, args[5], scale)
    assert _rel_err(got.o_lat, want_o) < TOLERANCE[dtype], f"o_lat, {splits} splits, seed {seed}"
    assert _rel_err(got.lse, want_lse) < TOLERANCE[dtype], f"lse, {splits} splits, seed {seed}"
    again = ops.verify_attn(*args, scale)
    assert torch.equal(got.o_lat, again.o_lat) and torch.equal(got.lse, again.lse), f"seed {seed}"


@pytest.mark.parametrize("value", ["0", "257", "-3", "8x", ""])
def test_verify_attn_split_setting_errors(ops, monkeypatch, value):
    q_lat, q_pe = torch.randn(1, 4, 32, device=CUDA), torch.randn(1, 4, 8, device=CUDA)
    ckv, kpe = torch.randn(30, 32, device=CUDA), torch.randn(30, 8, device=CUDA)
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(29, device=CUDA), torch.ones(1, 1, dtype=torch.bool, device=CUDA), 0.1)
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_SPLITS", value)
    with pytest.raises(RuntimeError, match=f"DDTREE_VERIFY_ATTN_SPLITS={value} is not a count from 1 to 256 or auto"):
        ops.verify_attn(*args)
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_SPLITS", "auto")
    want_o, _ = _attention_f64(*args[:4], 29, args[5], 0.1)
    assert _rel_err(ops.verify_attn(*args).o_lat, want_o) < 1e-5


def test_verify_attn_kernel_choice_errors(ops, monkeypatch):
    q_lat, q_pe = torch.randn(2, 4, 512, device=CUDA), torch.randn(2, 4, 64, device=CUDA)
    ckv, kpe = torch.randn(8, 512, device=CUDA), torch.randn(8, 64, device=CUDA)
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(2, device=CUDA), torch.ones(2, 2, dtype=torch.bool, device=CUDA), 0.1)
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_KERNEL", "flash")
    with pytest.raises(RuntimeError, match="DDTREE_VERIFY_ATTN_KERNEL=flash is not one of auto, wgmma, mma, cuda-core"):
        ops.verify_attn(*args)
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_KERNEL", "mma")  # float32: only the CUDA-core kernel
    with pytest.raises(RuntimeError, match=r"DDTREE_VERIFY_ATTN_KERNEL=mma cannot run these inputs \(Float, R = 512"):
        ops.verify_attn(*args)
    monkeypatch.setenv("DDTREE_VERIFY_ATTN_KERNEL", "cuda-core")
    want = ops.verify_attn(*args)
    monkeypatch.delenv("DDTREE_VERIFY_ATTN_KERNEL")
    got = ops.verify_attn(*args)
    assert _rel_err(got.o_lat, want.o_lat.double()) < 1e-5


@pytest.mark.parametrize(("dtype", "lat_dim", "rope_dim", "num_heads"),
                         [(torch.float32, 32, 8, 3), (torch.bfloat16, 512, 64, 64), (torch.bfloat16, 512, 64, 16)],
                         ids=["cuda-core", "tensor-core", "tensor-core-4-nodes-a-tile"])
def test_verify_attn_node_that_sees_nothing(ops, dtype, lat_dim, rope_dim, num_heads):
    """Without a prefix, node 1 sees no row at all (the tensor-core kernel trims a tile's rows past the last one its
    nodes see, yet still writes such a row: o_lat 0, lse -inf); node 2 sees rows 0 and 2 only."""
    def randn(*shape):
        return torch.randn(*shape, device=CUDA).to(dtype)

    q_lat, q_pe = randn(3, num_heads, lat_dim), randn(3, num_heads, rope_dim)
    ckv, kpe = randn(5, lat_dim), randn(5, rope_dim)
    mask = torch.tensor([[True, False, False], [False, False, False], [True, False, True]], device=CUDA)
    _poison_allocator()
    got = ops.verify_attn(q_lat, q_pe, ckv, kpe, torch.tensor(0, device=CUDA), mask, 0.3)
    assert torch.all(got.o_lat[1] == 0) and torch.all(got.lse[1] == float("-inf"))
    want_o, want_lse = _attention_f64(q_lat, q_pe, ckv, kpe, 0, mask, 0.3)
    for node in (0, 2):
        assert _rel_err(got.o_lat[node], want_o[node]) < TOLERANCE[dtype], f"node {node}"
        assert _rel_err(got.lse[node], want_lse[node]) < TOLERANCE[dtype], f"node {node}"


# ---------------------------------------------------------------- tree_accept, kv_compact


def _random_tree(rng: random.Random, num_nodes: int, vocab: int) -> tuple[list[int], list[int]]:
    """Parents in pop order (siblings may repeat a token: the first match must win) and padding after."""
    parents = [-1] + [rng.randrange(c) for c in range(1, num_nodes)]
    tokens = [rng.randrange(vocab) for _ in range(num_nodes)]
    num_padding = rng.randint(0, 3)
    return parents + [-1] * num_padding, tokens + [tokens[0]] * num_padding


@pytest.mark.parametrize("num_nodes", [1, 2, 17, 257, 1025])
def test_tree_accept_equals_cpu_op(ops, num_nodes):
    seed = _seed()
    rng = random.Random(seed)
    for _ in range(10):
        parents, tokens = _random_tree(rng, num_nodes, rng.choice([2, 3, 50]))
        target = [rng.randrange(3) for _ in parents]
        args = (torch.tensor(tokens), torch.tensor(parents), torch.tensor(target), len(parents))
        _poison_allocator()
        got = ops.tree_accept(*(a.to(CUDA) for a in args[:3]), args[3])
        _assert_same(got, ops.tree_accept(*args), seed)
        _assert_same(got, reference.tree_accept(*args), seed)


def test_tree_accept_on_built_trees(ops):
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    for budget in (1, 16, 256, 1024):
        draft = _draft(seed + budget, 15, 3, "smooth").to(CUDA)  # V = 3: long accepted paths are likely
        tree = ops.tree_build(draft, torch.tensor(0, device=CUDA), budget)
        target = torch.randint(0, 3, (budget + 1,), generator=gen).to(CUDA)
        got = ops.tree_accept(tree.tokens, tree.parents, target, 15)
        want = ops.tree_accept(tree.tokens.cpu(), tree.parents.cpu(), target.cpu(), 15)
        _assert_same(got, want, seed)


def _random_path(rng: random.Random, num_nodes: int, max_depth: int) -> list[int]:
    steps = sorted(rng.sample(range(1, num_nodes), min(max_depth, num_nodes - 1, rng.randint(0, max_depth))))
    return [0, *steps] + [-1] * (max_depth - len(steps))


# (num_layers, S, R, P, dtype): 16-byte units, 4-byte units (72 + 12 bytes), 2-byte units, Kimi-K2 size
COMPACT_CASES = [
    (3, 64, 16, 4, torch.float32),
    (2, 50, 36, 6, torch.bfloat16),
    (1, 30, 3, 1, torch.bfloat16),
    (61, 4096, 512, 64, torch.bfloat16),
]


@pytest.mark.parametrize("num_layers, cache_rows, lat_dim, rope_dim, dtype", COMPACT_CASES)
def test_kv_compact_equals_cpu_op(ops, num_layers, cache_rows, lat_dim, rope_dim, dtype):
    seed = _seed()
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    ckv = torch.randn(num_layers, cache_rows, lat_dim, generator=gen).to(dtype)
    kpe = torch.randn(num_layers, cache_rows, rope_dim, generator=gen).to(dtype)
    for _ in range(5):
        num_nodes = rng.randint(1, min(cache_rows, 257))
        prefix = rng.randint(0, cache_rows - num_nodes)
        path = torch.tensor(_random_path(rng, num_nodes, 15))
        got_ckv, got_kpe = ckv.to(CUDA), kpe.to(CUDA)
        ops.kv_compact(got_ckv, got_kpe, torch.tensor(prefix, device=CUDA), path.to(CUDA))
        want_ckv, want_kpe = ckv.clone(), kpe.clone()
        ops.kv_compact(want_ckv, want_kpe, torch.tensor(prefix), path)
        _assert_same((got_ckv, got_kpe), (want_ckv, want_kpe), seed)
        reference.kv_compact(ckv, kpe, torch.tensor(prefix), path)
        _assert_same((got_ckv, got_kpe), (ckv, kpe), seed)


# ---------------------------------------------------------------- opcheck, host syncs, graphs, errors


def _small_cases(seed: int) -> dict[str, tuple]:
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(5, 2, 32, generator=gen), torch.randn(5, 2, 8, generator=gen))
    cache = (torch.randn(12, 32, generator=gen), torch.randn(12, 8, generator=gen))
    cases = {
        "tree_build": (_draft(seed, 3, 100, "ties"), torch.tensor(2), 7),
        "verify_attn": (*q, *cache, torch.tensor(4), ancestor_mask([-1, 0, 0, 1, 2]), 0.25),
        "tree_accept": (torch.tensor([9, 1, 2, 3]), torch.tensor([-1, 0, 0, 1]), torch.tensor([1, 3, 0, 4]), 3),
        "kv_compact": (torch.randn(2, 9, 32), torch.randn(2, 9, 8), torch.tensor(2), torch.tensor([0, 2, 5, -1])),
    }
    return {name: tuple(a.to(CUDA) if isinstance(a, torch.Tensor) else a for a in args) for name, args in cases.items()}


@pytest.mark.parametrize("name", ["tree_build", "verify_attn", "tree_accept", "kv_compact"])
def test_opcheck_on_cuda(ops, name):
    torch.library.opcheck(getattr(torch.ops.ddtree, name).default, _small_cases(_seed())[name])


@pytest.mark.parametrize("name", ["tree_build", "verify_attn", "tree_accept", "kv_compact"])
def test_op_makes_no_host_sync(ops, name):
    args = _small_cases(_seed())[name]
    assert_no_host_sync(getattr(torch.ops.ddtree, name), args)


def test_graph_replay_reads_prefix_len_and_draft_on_the_device(ops):
    seed = _seed()
    q_lat, q_pe, ckv, kpe, _, mask, scale = (
        a.to(CUDA) if isinstance(a, torch.Tensor) else a for a in _attn_inputs("ar-split-kv", torch.float32, seed)
    )
    prefix = torch.tensor(10, device=CUDA)
    draft = _draft(seed, 15, 5000, "smooth").to(CUDA)
    root = torch.tensor(1, device=CUDA)
    def both():
        return ops.verify_attn(q_lat, q_pe, ckv, kpe, prefix, mask, scale), ops.tree_build(draft, root, 256)

    graph, (attn, tree) = capture(both, both)
    for new_prefix in (0, 2000, 4095):
        prefix.fill_(new_prefix)
        draft.copy_(_draft(seed + new_prefix, 15, 5000, "ties"))
        graph.replay()
        want_o, want_lse = _attention_f64(q_lat, q_pe, ckv, kpe, new_prefix, mask, scale)
        assert _rel_err(attn.o_lat, want_o) < 1e-5 and _rel_err(attn.lse, want_lse) < 1e-5, f"seed {seed}"
        _assert_same(tree, ops.tree_build(draft.cpu(), root.cpu(), 256), seed)


def test_cuda_limits_and_devices_raise_clear_errors(ops):
    draft = torch.randn(40, 100, device=CUDA)
    with pytest.raises(RuntimeError, match=r"tree_build \(CUDA\).*reaches depth 40; the kernel handles at most 32"):
        ops.tree_build(draft, torch.tensor(0, device=CUDA), 64)
    with pytest.raises(RuntimeError, match="root_token is on cpu but draft_logprobs is on cuda"):
        ops.tree_build(draft[:4], torch.tensor(0), 64)
    q_lat, q_pe = torch.randn(2, 1, 1024, device=CUDA), torch.randn(2, 1, 8, device=CUDA)
    ckv, kpe = torch.randn(4, 1024, device=CUDA), torch.randn(4, 8, device=CUDA)
    mask = torch.ones(2, 2, dtype=torch.bool, device=CUDA)
    with pytest.raises(RuntimeError, match=r"verify_attn \(CUDA\): R = q_lat.size\(2\) = 1024 must be in \[1, 512\]"):
        ops.verify_attn(q_lat, q_pe, ckv, kpe, torch.tensor(0, device=CUDA), mask, 0.1)
    q_lat, ckv = torch.randn(2, 1, 512, device=CUDA), torch.randn(4, 512, device=CUDA)
    with pytest.raises(RuntimeError, match="prefix_len is on cpu but q_lat is on cuda"):
        ops.verify_attn(q_lat, q_pe, ckv, kpe, torch.tensor(0), mask, 0.1)
