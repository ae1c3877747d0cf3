"""The CPU kernels of the ddtree ops against kernels/reference.py, their invariants, opcheck and input errors."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from masks import ancestor_mask, block_mask

from kernels import ops, reference

SEEDS = st.integers(0, 2**31 - 1)


def _random_logprobs(gen: torch.Generator, num_depths: int, vocab: int) -> torch.Tensor:
    return torch.log_softmax(torch.randn(num_depths, vocab, generator=gen) * 3, dim=-1)  # [L, V]


def _assert_same_tree(got, want) -> None:
    for name, g, w in zip(ops.BuiltTree._fields, got, want, strict=True):
        assert g.dtype == w.dtype, name
        assert torch.equal(g, w), f"{name}:\n{g}\n!=\n{w}"


def _check_tree_invariants(tree: ops.BuiltTree, draft: torch.Tensor, root: int) -> None:
    """Properties every built tree has, computed from the outputs alone."""
    tokens, parents, depths, ranks = (t.tolist() for t in tree[:4])
    scores, visibility = tree.scores, tree.visibility
    num_nodes = len(tokens)
    assert (parents[0], depths[0], ranks[0], tokens[0], float(scores[0])) == (-1, 0, 0, root, 0.0)
    expected_vis = torch.eye(num_nodes, dtype=torch.bool)
    children: dict[int, list[int]] = {}
    for i in range(1, num_nodes):
        p = parents[i]
        if p == -1:  # padding
            assert (tokens[i], depths[i], ranks[i], float(scores[i])) == (root, 0, 0, float("-inf"))
            continue
        assert 0 <= p < i and depths[i] == depths[p] + 1
        assert scores[i] == scores[p] + draft[depths[i] - 1, tokens[i]]  # float32, parent + lp
        expected_vis[i] |= expected_vis[p]
        children.setdefault(p, []).append(i)
    assert torch.equal(visibility, expected_vis)  # ancestor closure
    for kids in children.values():
        assert len({tokens[c] for c in kids}) == len(kids)  # siblings carry distinct tokens
        assert [ranks[c] for c in kids] == sorted(ranks[c] for c in kids)  # siblings pop in rank order
    real = tree.scores[tree.parents != -1]
    assert torch.all(real[1:] <= real[:-1])  # best-first with log-probs <= 0


@pytest.mark.parametrize("budget", [0, 1, 7, 64])
@settings(max_examples=15, deadline=None)
@given(seed=SEEDS)
def test_tree_build_matches_reference(budget, seed):
    rng = random.Random(seed)
    draft = _random_logprobs(torch.Generator().manual_seed(seed), rng.randint(1, 6), rng.randint(1, 40))
    root = torch.tensor(seed % 1000)
    got = ops.tree_build(draft, root, budget)
    _assert_same_tree(got, reference.tree_build(draft, root, budget))
    _check_tree_invariants(got, draft, int(root))


@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_tree_build_pads_when_the_heap_empties(seed):
    draft = _random_logprobs(torch.Generator().manual_seed(seed), 2, 3)
    tree = ops.tree_build(draft, torch.tensor(5), 64)
    num_real = 1 + 3 + 9  # root, K = 3 at depth 1, 3 * 3 at depth 2
    assert int((tree.parents[1:] != -1).sum()) == num_real - 1
    assert torch.all(tree.parents[num_real:] == -1) and torch.all(tree.tokens[num_real:] == 5)
    assert torch.all(tree.scores[num_real:] == float("-inf"))
    _assert_same_tree(tree, reference.tree_build(draft, torch.tensor(5), 64))
    _check_tree_invariants(tree, draft, 5)


@pytest.mark.parametrize("budget", [7, 64, 300])
@settings(max_examples=15, deadline=None)
@given(seed=SEEDS)
def test_tree_build_ties_break_identically(budget, seed):
    gen = torch.Generator().manual_seed(seed)
    draft = torch.randint(-3, 1, (4, 6), generator=gen).float()  # integer log-probs: many equal scores
    draft[0, int(torch.randint(0, 6, (1,), generator=gen))] = float("-inf")
    got = ops.tree_build(draft, torch.tensor(1), budget)
    _assert_same_tree(got, reference.tree_build(draft, torch.tensor(1), budget))
    _check_tree_invariants(got, draft, 1)


@pytest.mark.parametrize("budget", [16, 64, 256])
@settings(max_examples=10, deadline=None)
@given(seed=SEEDS)
def test_tree_build_budget_limit_pops_a_prefix(budget, seed):
    """With a budget_limit the tree is tree_build's at that budget, padded to the full budget's shapes (the first n
    pops never reach rank n, so the full budget's K candidates per depth change none of them)."""
    rng = random.Random(seed)
    draft = _random_logprobs(torch.Generator().manual_seed(seed), rng.randint(1, 8), rng.randint(1, 300))
    root, limit = torch.tensor(seed % 1000), rng.randint(0, budget)
    got = ops.tree_build(draft, root, budget, torch.tensor(limit))
    _assert_same_tree(got, reference.tree_build(draft, root, budget, torch.tensor(limit)))
    alone = ops.tree_build(draft, root, limit)
    for full, small in zip(got[:5], alone[:5], strict=True):
        assert torch.equal(full[: limit + 1], small)
    assert torch.equal(got.visibility[: limit + 1, : limit + 1], alone.visibility)
    assert torch.all(got.parents[limit + 1:] == -1) and torch.all(got.scores[limit + 1:] == float("-inf"))
    _check_tree_invariants(got, draft, int(root))


@pytest.mark.parametrize("limit", [-1, 17])
def test_tree_build_refuses_a_budget_limit_out_of_range(limit):
    with pytest.raises(RuntimeError, match=r"budget_limit must be in \[0, budget = 16\], got " + str(limit)):
        ops.tree_build(_random_logprobs(torch.Generator().manual_seed(0), 3, 20), torch.tensor(0), 16,
                       torch.tensor(limit))
    with pytest.raises(RuntimeError, match="budget_limit must be a 0-dim int64"):
        ops.tree_build(_random_logprobs(torch.Generator().manual_seed(0), 3, 20), torch.tensor(0), 16,
                       torch.tensor([limit]))


def test_tree_build_full_budget():
    draft = _random_logprobs(torch.Generator().manual_seed(random.randrange(2**31)), 8, 500)
    got = ops.tree_build(draft, torch.tensor(3), 1024)
    _assert_same_tree(got, reference.tree_build(draft, torch.tensor(3), 1024))
    _check_tree_invariants(got, draft, 3)




def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the finite entries, relative to the largest |want| or to 1, whichever is larger: an lse
    near 0 (one key whose score is about 0) holds the rounding of its O(1) terms, not of its own size."""
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    diff = (got.double() - want.double())[finite].abs().max()
    return float(diff / want.double()[finite].abs().max().clamp_min(1.0))


@pytest.mark.parametrize(
    "dtype, tol", [pytest.param(torch.float32, 1e-5, id="float32"), pytest.param(torch.bfloat16, 1e-2, id="bfloat16")]
)
@pytest.mark.parametrize(
    "kind, cache_rows", [("causal", 1), ("causal", 64), ("tree", 7), ("tree", 300), ("single", 1), ("single", 300)]
)
@settings(max_examples=6, deadline=None)
@given(seed=SEEDS)
def test_verify_attn_matches_reference(dtype, tol, kind, cache_rows, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_nodes = 1 if kind == "single" else rng.randint(1, min(cache_rows, 40))
    prefix = 0 if kind == "causal" and rng.random() < 0.5 else rng.randint(0, cache_rows - num_nodes)
    num_heads, lat_dim, rope_dim = rng.choice([(1, 8, 4), (4, 64, 16), (2, 512, 64)])
    q_lat = torch.randn(num_nodes, num_heads, lat_dim, generator=gen).to(dtype)
    q_pe = torch.randn(num_nodes, num_heads, rope_dim, generator=gen).to(dtype)
    ckv = torch.randn(cache_rows, lat_dim, generator=gen).to(dtype)
    kpe = torch.randn(cache_rows, rope_dim, generator=gen).to(dtype)
    mask = block_mask(kind, num_nodes, rng)
    scale = (lat_dim + rope_dim) ** -0.5
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(prefix), mask, scale)
    got = ops.verify_attn(*args)
    want_o, want_lse = reference.verify_attn(*args)
    assert got.o_lat.dtype == dtype and got.o_lat.shape == q_lat.shape
    assert got.lse.dtype == torch.float32 and got.lse.shape == (num_nodes, num_heads)
    assert _rel_err(got.o_lat, want_o) < tol
    assert _rel_err(got.lse, want_lse) < tol


def test_verify_attn_node_that_sees_nothing():
    q_lat, q_pe, ckv, kpe = torch.randn(2, 3, 8), torch.randn(2, 3, 4), torch.randn(5, 8), torch.randn(5, 4)
    mask = torch.tensor([[True, False], [False, False]])
    got = ops.verify_attn(q_lat, q_pe, ckv, kpe, torch.tensor(0), mask, 0.3)
    want_o, want_lse = reference.verify_attn(q_lat, q_pe, ckv, kpe, torch.tensor(0), mask, 0.3)
    assert torch.all(got.o_lat[1] == 0) and torch.all(got.lse[1] == float("-inf"))
    assert _rel_err(got.o_lat, want_o) < 1e-5 and _rel_err(got.lse, want_lse) < 1e-5


def _random_tree(rng: random.Random, num_nodes: int, vocab: int, num_padding: int) -> tuple[list[int], list[int]]:
    """Parents in pop order and tokens distinct among siblings, then padding nodes (parent -1)."""
    parents, tokens, used = [-1], [rng.randrange(vocab)], {0: set()}
    for c in range(1, num_nodes):
        p = rng.choice([n for n in range(c) if len(used[n]) < vocab])
        tok = rng.choice([t for t in range(vocab) if t not in used[p]])
        used[p].add(tok)
        used[c] = set()
        parents.append(p)
        tokens.append(tok)
    return parents + [-1] * num_padding, tokens + [tokens[0]] * num_padding


def _depth(parents: list[int], node: int) -> int:
    return 0 if parents[node] == -1 else 1 + _depth(parents, parents[node])


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS)
def test_tree_accept_follows_a_planted_path(seed):
    rng = random.Random(seed)
    parents, tokens = _random_tree(rng, rng.randint(1, 60), 5, rng.randint(0, 4))
    real = [n for n in range(len(parents)) if n == 0 or parents[n] != -1]
    end = rng.choice(real)
    planted = [end]
    while parents[planted[-1]] != -1:
        planted.append(parents[planted[-1]])
    planted.reverse()
    target = [rng.randrange(5) for _ in parents]
    for node, nxt in zip(planted, planted[1:], strict=False):
        target[node] = tokens[nxt]
    child_tokens = {tokens[c] for c in real if parents[c] == end}
    target[end] = rng.choice([t for t in range(7) if t not in child_tokens])  # the walk stops at `end`
    max_depth = max(_depth(parents, n) for n in real) + rng.randint(0, 2)
    got = ops.tree_accept(torch.tensor(tokens), torch.tensor(parents), torch.tensor(target), max_depth)
    assert got.path.tolist() == planted + [-1] * (max_depth + 1 - len(planted))
    assert int(got.path_len) == len(planted) and int(got.bonus) == target[end]
    assert got.path_len.shape == () and got.bonus.shape == ()


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS)
def test_tree_accept_matches_reference(seed):
    rng = random.Random(seed)
    parents, tokens = _random_tree(rng, rng.randint(1, 80), 3, rng.randint(0, 3))
    target = torch.tensor([rng.randrange(3) for _ in parents])
    max_depth = max(_depth(parents, n) for n in range(len(parents)))
    args = (torch.tensor(tokens), torch.tensor(parents), target, max_depth)
    for g, w in zip(ops.tree_accept(*args), reference.tree_accept(*args), strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@settings(max_examples=25, deadline=None)
@given(seed=SEEDS)
def test_kv_compact_matches_reference(dtype, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    parents, _ = _random_tree(rng, rng.randint(1, 30), 4, 0)
    node = rng.randrange(len(parents))
    path = [node]
    while parents[path[-1]] != -1:
        path.append(parents[path[-1]])
    path.reverse()
    padded = torch.tensor(path + [-1] * rng.randint(0, 3))
    num_layers, cache_rows = rng.randint(1, 3), 100
    prefix = torch.tensor(rng.randint(0, cache_rows - len(parents)))
    ckv = torch.randn(num_layers, cache_rows, 16, generator=gen).to(dtype)
    kpe = torch.randn(num_layers, cache_rows, 4, generator=gen).to(dtype)
    original = ckv.clone()
    want_ckv, want_kpe = ckv.clone(), kpe.clone()
    reference.kv_compact(want_ckv, want_kpe, prefix, padded)
    ops.kv_compact(ckv, kpe, prefix, padded)
    assert torch.equal(ckv, want_ckv) and torch.equal(kpe, want_kpe)
    start, end = int(prefix), int(prefix) + len(path)
    assert torch.equal(ckv[:, start:end], original[:, [start + node for node in path]])
    assert torch.equal(ckv[:, :start], original[:, :start]) and torch.equal(ckv[:, end:], original[:, end:])


def _opcheck_cases():
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    draft = _random_logprobs(gen, 3, 10)
    yield pytest.param("tree_build", (draft, torch.tensor(2), 7), id="tree_build")
    yield pytest.param("tree_build", (draft, torch.tensor(2), 7, torch.tensor(4)), id="tree_build-budget-limit")
    q = (torch.randn(5, 2, 8, generator=gen), torch.randn(5, 2, 4, generator=gen))
    cache = (torch.randn(12, 8, generator=gen), torch.randn(12, 4, generator=gen))
    attn_args = (*q, *cache, torch.tensor(4), ancestor_mask([-1, 0, 0, 1, 2]), 0.25)
    yield pytest.param("verify_attn", attn_args, id="verify_attn")
    yield pytest.param("verify_attn", (*attn_args, True), id="verify_attn-batch-invariant")
    accept_args = (torch.tensor([9, 1, 2, 3]), torch.tensor([-1, 0, 0, 1]), torch.tensor([1, 3, 0, 4]), 3)
    yield pytest.param("tree_accept", accept_args, id="tree_accept")
    compact_args = (torch.randn(2, 9, 8), torch.randn(2, 9, 4), torch.tensor(2), torch.tensor([0, 2, 5, -1]))
    yield pytest.param("kv_compact", compact_args, id="kv_compact")


@pytest.mark.parametrize("name, args", list(_opcheck_cases()))
def test_opcheck(name, args):
    torch.library.opcheck(getattr(torch.ops.ddtree, name).default, args)


def _draft(nan_at: tuple[int, int] | None = None) -> torch.Tensor:
    draft = torch.log_softmax(torch.randn(3, 10), dim=-1)  # [L, V]
    if nan_at is not None:
        draft[nan_at] = float("nan")
    return draft


def _build(draft: torch.Tensor | None = None, root: torch.Tensor | None = None, budget: int = 4) -> ops.BuiltTree:
    return ops.tree_build(_draft() if draft is None else draft, torch.tensor(0) if root is None else root, budget)


def _attn(prefix: int = 2, **replace) -> ops.Attention:
    """verify_attn on N = 4 nodes, H = 2, R = 8, P = 4, S = 10, with some arguments replaced."""
    args = {
        "q_lat": torch.randn(4, 2, 8),
        "q_pe": torch.randn(4, 2, 4),
        "ckv": torch.randn(10, 8),
        "kpe": torch.randn(10, 4),
        "prefix_len": torch.tensor(prefix),
        "block_mask": torch.ones(4, 4, dtype=torch.bool),
        "scale": 0.3,
    }
    return ops.verify_attn(**(args | replace))


def _accept(tokens, parents, target, max_depth=1, dtype=torch.int64) -> ops.Acceptance:
    return ops.tree_accept(torch.tensor(tokens), torch.tensor(parents), torch.tensor(target, dtype=dtype), max_depth)


def _compact(path, prefix=0, kpe_layers=2) -> None:
    ops.kv_compact(torch.randn(2, 9, 8), torch.randn(kpe_layers, 9, 4), torch.tensor(prefix), torch.tensor(path))


BAD_INPUTS = {
    "draft dtype": (lambda: _build(_draft().double()), "draft_logprobs must be float32, got float64"),
    "draft dim": (lambda: _build(_draft()[0]), r"draft_logprobs must be 2-dim \[L, V\]"),
    "draft strides": (lambda: _build(_draft().t()), "draft_logprobs must be contiguous"),
    "draft NaN": (lambda: _build(_draft(nan_at=(1, 7))), r"draft_logprobs has NaN at \[1, 7\]"),
    "root shape": (lambda: _build(root=torch.tensor([0])), "root_token must be a 0-dim int64 tensor"),
    "root value": (lambda: _build(root=torch.tensor(-2)), "root_token must be a token id >= 0, got -2"),
    "budget low": (lambda: _build(budget=-1), r"budget must be in \[0, 1024\], got -1"),
    "budget high": (lambda: _build(budget=1025), r"budget must be in \[0, 1024\], got 1025"),
    "prefix + N > S": (lambda: _attn(prefix=7), r"prefix_len \+ N must be <= S.*prefix_len = 7, N = 4, S = 10"),
    "prefix < 0": (lambda: _attn(prefix=-1), "prefix_len must be >= 0, got -1"),
    "prefix dtype": (
        lambda: _attn(prefix_len=torch.tensor(2, dtype=torch.int32)),
        "prefix_len must be a 0-dim int64 tensor",
    ),
    "mixed dtypes": (
        lambda: _attn(ckv=torch.randn(10, 8).bfloat16()),
        r"ckv \(same dtype as q_lat\) must be float32, got bfloat16",
    ),
    "q dtype": (lambda: _attn(q_lat=torch.randn(4, 2, 8).double()), "q_lat must be float32 or bfloat16, got float64"),
    "H mismatch": (lambda: _attn(q_pe=torch.randn(4, 3, 4)), r"q_pe \[N, H, P\] must match q_lat \[N, H, R\] in N"),
    "R mismatch": (lambda: _attn(ckv=torch.randn(10, 9)), r"ckv \[S, R\] must have R = q_lat.size\(2\) = 8"),
    "S mismatch": (lambda: _attn(kpe=torch.randn(11, 4)), r"kpe \[S, P\] and ckv \[S, R\] must have the same S"),
    "mask shape": (
        lambda: _attn(block_mask=torch.ones(4, 3, dtype=torch.bool)),
        r"block_mask must be \[N, N\] with N = q_lat.size\(0\) = 4",
    ),
    "mask dtype": (lambda: _attn(block_mask=torch.ones(4, 4)), "block_mask must be bool, got float32"),
    "q strides": (lambda: _attn(q_lat=torch.randn(2, 4, 8).transpose(0, 1)), "q_lat must be contiguous"),
    "target dtype": (lambda: _accept([1, 2], [-1, 0], [2, 0], dtype=torch.int32), "target must be int64, got int32"),
    "accept lengths": (lambda: _accept([1, 2], [-1, 0, 0], [2, 0]), r"tokens, parents and target must all be \[N\]"),
    "parent order": (lambda: _accept([1, 2], [-1, 1], [2, 0]), r"parents\[1\] = 1 must be -1 or a node index below 1"),
    "path too long": (
        lambda: _accept([1, 2, 3], [-1, 0, 1], [2, 3, 0]),
        r"accepted path is longer than max_depth \+ 1 = 2",
    ),
    "layers mismatch": (lambda: _compact([0, -1], kpe_layers=3), "must agree in num_layers and S"),
    "path order": (lambda: _compact([0, 3, 2]), r"path must be increasing.*path\[1\] = 3 and path\[2\] = 2"),
    "path beyond S": (
        lambda: _compact([0, 4], prefix=5),
        r"path\[1\] = 4 points at cache row prefix_len \+ 4 = 9, beyond S = 9",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_clear_errors(case):
    call, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message):
        call()
