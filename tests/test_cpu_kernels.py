"""The blocked CPU kernels on every instruction set this machine has: verify_attn across key blocks and head
groups (and its batch invariance: a node's result does not depend on N, the other heads, the cache rows past
the block or the thread count), tree_build's threshold scan on long rows with ties, -0.0, -inf and NaN."""

from __future__ import annotations

import random

import pytest
import torch
from masks import ancestor_mask, block_mask

from kernels import ops, reference

KEY_BLOCK = 64  # kKeyBlock in kernels/csrc/cpu/verify_attn_tile.h


def _attn_inputs(seed: int, num_nodes: int, num_heads: int, lat_dim: int, rope_dim: int, cache_rows: int,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(num_nodes, num_heads, lat_dim), (num_nodes, num_heads, rope_dim), (cache_rows, lat_dim),
              (cache_rows, rope_dim)]
    return tuple(torch.randn(*shape, generator=gen).to(dtype) for shape in shapes)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    diff = (got.double() - want.double())[finite].abs().max()
    return float(diff / want.double()[finite].abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(
    "num_nodes, num_heads, lat_dim, rope_dim, prefix",
    [
        (1, 64, 512, 64, 255),  # Kimi-K2 widths, S = 256: four whole key blocks
        (8, 64, 512, 64, 2 * KEY_BLOCK - 3),  # the block rows straddle a key block boundary
        (1, 128, 512, 64, KEY_BLOCK),  # DeepSeek-V3's 128 heads, the node's row alone in the second block
        (5, 17, 40, 8, 3 * KEY_BLOCK + 1),  # heads and R that no vector width divides
        (3, 33, 512, 64, 0),  # no prefix: the block rows alone
        (70, 4, 32, 16, 10),  # more block rows than a key block (the tiny fixture's 4 heads)
    ],
)
def test_verify_attn_blocking_matches_reference(isa, dtype, tol, num_nodes, num_heads, lat_dim, rope_dim, prefix):
    seed = random.randrange(2**31)
    extra_rows = seed % 70  # rows past the block, never attended
    cache_rows = prefix + num_nodes + extra_rows
    q_lat, q_pe, ckv, kpe = _attn_inputs(seed, num_nodes, num_heads, lat_dim, rope_dim, cache_rows, dtype)
    mask = block_mask("tree", num_nodes, random.Random(seed))
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(prefix), mask, (lat_dim + rope_dim) ** -0.5)
    got = ops.verify_attn(*args)
    want_o, want_lse = reference.verify_attn(*args)
    assert got.o_lat.dtype == dtype
    assert _rel_err(got.o_lat, want_o) < tol, f"seed {seed}"
    assert _rel_err(got.lse, want_lse) < tol, f"seed {seed}"


@pytest.mark.parametrize("prefix", [0, 100])
def test_verify_attn_nodes_that_see_only_themselves_or_nothing(isa, prefix):
    """Each node sees the prefix and its own row only; with no prefix, one node sees nothing at all."""
    num_nodes = 6
    q_lat, q_pe, ckv, kpe = _attn_inputs(random.randrange(2**31), num_nodes, 64, 512, 64, prefix + num_nodes)
    mask = torch.eye(num_nodes, dtype=torch.bool)
    mask[3, 3] = prefix > 0  # node 3: with no prefix, not even itself
    args = (q_lat, q_pe, ckv, kpe, torch.tensor(prefix), mask, 0.1)
    got = ops.verify_attn(*args)
    want_o, want_lse = reference.verify_attn(*args)
    assert _rel_err(got.o_lat, want_o) < 1e-5 and _rel_err(got.lse, want_lse) < 1e-5
    if prefix == 0:
        assert torch.all(got.o_lat[3] == 0) and torch.all(got.lse[3] == float("-inf"))
        assert torch.allclose(got.o_lat[0], ckv[0].expand(64, -1), rtol=0, atol=1e-6)  # one row: weight 1


def test_verify_attn_is_batch_invariant(isa, threads):
    """A node's outputs are the same bits whatever else the call holds: fewer nodes after it, other heads
    beside it, more cache rows past the block, another thread count."""
    seed = random.randrange(2**31)
    num_nodes, num_heads, prefix = 9, 40, 150
    q_lat, q_pe, ckv, kpe = _attn_inputs(seed, num_nodes, num_heads, 512, 64, prefix + num_nodes + 30)
    rng = random.Random(seed)
    mask = ancestor_mask([-1] + [rng.randrange(i) for i in range(1, num_nodes)])

    def attend(n: int, heads: slice = slice(None), rows: int = prefix + num_nodes) -> ops.Attention:
        return ops.verify_attn(q_lat[:n, heads].contiguous(), q_pe[:n, heads].contiguous(), ckv[:rows], kpe[:rows],
                               torch.tensor(prefix), mask[:n, :n].contiguous(), 0.05)

    torch.set_num_threads(2)
    full = attend(num_nodes)
    for n in (1, 4):  # nodes before n see no node at or after n (parents precede children)
        assert torch.equal(attend(n).o_lat, full.o_lat[:n]) and torch.equal(attend(n).lse, full.lse[:n])
    for heads in (slice(0, 1), slice(5, 22), slice(16, 40)):
        part = attend(num_nodes, heads)
        assert torch.equal(part.o_lat, full.o_lat[:, heads]) and torch.equal(part.lse, full.lse[:, heads])
    longer = attend(num_nodes, rows=ckv.shape[0])
    assert torch.equal(longer.o_lat, full.o_lat) and torch.equal(longer.lse, full.lse)
    torch.set_num_threads(1)
    single = attend(num_nodes)
    assert torch.equal(single.o_lat, full.o_lat) and torch.equal(single.lse, full.lse)


def test_cpu_isa_must_be_known(monkeypatch):
    monkeypatch.setenv("DDTREE_CPU_ISA", "sse9")
    with pytest.raises(RuntimeError, match="DDTREE_CPU_ISA must be auto, avx512, avx2 or generic, got 'sse9'"):
        ops.tree_build(torch.zeros(2, 5), torch.tensor(0), 3)


def _assert_same_tree(got, want) -> None:
    for name, g, w in zip(ops.BuiltTree._fields, got, want, strict=True):
        assert torch.equal(g, w), f"{name}:\n{g}\n!=\n{w}"


def _long_rows(kind: str, num_depths: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """[L, V] drafts that stress the scan: many ties, both zeros, -inf, rows sorted either way."""
    if kind == "ties":
        draft = torch.randint(-6, 1, (num_depths, vocab), generator=gen).float()
        draft[draft == 0] = torch.where(torch.rand(int((draft == 0).sum()), generator=gen) < 0.5, 0.0, -0.0)
        draft[torch.rand(num_depths, vocab, generator=gen) < 0.2] = float("-inf")
        return draft
    draft = torch.log_softmax(3 * torch.randn(num_depths, vocab, generator=gen), dim=-1)
    if kind == "ascending":
        return draft.sort(dim=-1).values.contiguous()  # every token raises the threshold: the slowest scan
    if kind == "descending":
        return draft.sort(dim=-1, descending=True).values.contiguous()
    return draft


@pytest.mark.parametrize("kind", ["random", "ties", "ascending", "descending"])
@pytest.mark.parametrize("budget", [1, 7, 64, 700])
def test_tree_build_scan_matches_reference(isa, kind, budget):
    seed = random.randrange(2**31)
    vocab = 3001 + seed % 16  # a partial last chunk; 4 K < V except at B = 700 (every token keyed)
    draft = _long_rows(kind, 3, vocab, torch.Generator().manual_seed(seed))
    root = torch.tensor(seed % vocab)
    _assert_same_tree(ops.tree_build(draft, root, budget), reference.tree_build(draft, root, budget))


def test_tree_build_does_not_depend_on_threads(isa, threads):
    draft = _long_rows("ties", 15, 20000, torch.Generator().manual_seed(random.randrange(2**31)))
    torch.set_num_threads(2)
    two = ops.tree_build(draft, torch.tensor(1), 256)
    torch.set_num_threads(1)
    _assert_same_tree(ops.tree_build(draft, torch.tensor(1), 256), two)


@pytest.mark.parametrize("budget", [0, 5, 64])
@pytest.mark.parametrize("column", [2, 40, 2999, 3004])  # among the first K, in a chunk, the last chunks
def test_tree_build_names_the_first_nan(isa, budget, column):
    draft = torch.log_softmax(torch.randn(4, 3005), dim=-1)
    draft[2, column] = float("nan")
    draft[3, 0] = float("nan")  # a later row's NaN is not the first
    with pytest.raises(RuntimeError, match=rf"draft_logprobs has NaN at \[2, {column}\]"):
        ops.tree_build(draft, torch.tensor(0), budget)
