"""The sparse MoE against the dense reference, a per-token loop and the golden routing; the per-row exact layout;
expert stacking that frees each expert as it arrives; the touched-expert counter and what the records, reports and
metrics make of it."""
from __future__ import annotations

import csv
import io
import json
import random
import weakref

import jsonschema
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from greedy import assert_greedy_equal
from moe_cases import TOLERANCE, moe_config, random_experts, relative_error

from engine.config import DecodeConfig, ModelConfig
from engine.decoding.decoder import ARDecoder
from engine.decoding.session import decode, decode_runs, make_decoder
from engine.drafters import DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.model import reference
from engine.model.batch_rows import ROW_BLOCK
from engine.model.fixtures import random_weights
from engine.model.moe import (
    CPU_SPARSE_MIN_BYTES,
    ExpertLoad,
    Experts,
    default_path,
    dense_moe,
    grouped_matmul,
    local_routing,
    route,
    sparse_moe,
    stack_experts,
)
from engine.model.target import TargetModel
from engine.model.weights import weight_shapes
from kernels import ops
from profiling import metrics, report
from profiling.measurement import Measurement
from profiling.schema import REPORT_SCHEMA


def per_token_loop(x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor, ex: Experts) -> torch.Tensor:
    """Independent reference in float64: token by token, each chosen expert's SwiGLU times its weight."""
    x, gate_up, down = x.double(), ex.gate_up.double(), ex.down.double()
    out = torch.zeros_like(x)
    inter = down.shape[2]
    for n in range(x.shape[0]):
        for j, e in enumerate(idx[n].tolist()):
            h = gate_up[e] @ x[n]
            out[n] += w[n, j].double() * (down[e] @ (F.silu(h[:inter]) * h[inter:]))
    return out


def test_route_matches_the_golden_route():
    for _ in range(20):
        rng = random.Random(random.randrange(2**31))
        cfg = moe_config(rng)
        x = np.random.default_rng(rng.randrange(99)).normal(size=(rng.randint(1, 40), cfg.hidden_size))
        gate = np.random.default_rng(rng.randrange(99)).normal(size=(cfg.n_routed_experts, cfg.hidden_size))
        bias = 0.1 * np.random.default_rng(rng.randrange(99)).normal(size=cfg.n_routed_experts)
        want_idx, want_w = reference.route(cfg, x, gate, bias)
        idx, w = route(cfg, torch.from_numpy(x @ gate.T).float(), torch.from_numpy(bias).float())
        order = idx.argsort(-1)  # the same experts, in any order within a token
        assert np.array_equal(np.sort(idx.numpy(), -1), np.sort(want_idx, -1)), cfg
        np.testing.assert_allclose(w.gather(1, order).numpy(), np.take_along_axis(
            want_w, np.argsort(want_idx, -1), -1), rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_equals_dense_and_a_per_token_loop(dtype):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    for _ in range(8):
        num = int(torch.randint(2, 40, (), generator=gen))
        k = int(torch.randint(1, min(num, 8) + 1, (), generator=gen))
        hidden, inter = (8 * int(torch.randint(1, hi, (), generator=gen)) for hi in (7, 4))  # 16-byte rows
        n = int(torch.randint(1, 40, (), generator=gen))
        ex = random_experts(num, hidden, inter, dtype, gen)
        x = torch.randn(n, hidden, generator=gen).to(dtype)
        idx = torch.rand(n, num, generator=gen).topk(k, -1).indices  # k distinct experts per token
        w = torch.rand(n, k, generator=gen)
        want = per_token_loop(x, idx, w, ex)
        for got in (sparse_moe(x, idx, w, ex), sparse_moe(x, idx, w, ex, exact=True), dense_moe(x, idx, w, ex)):
            assert got.shape == x.shape and got.dtype == dtype
            assert relative_error(got, want) < TOLERANCE[dtype], (num, k, hidden, inter, n)


def test_the_grouped_matmul_choice_and_bad_ones():
    assert grouped_matmul(torch.device("cpu"), torch.float32) == "grouped_mm"
    assert grouped_matmul(torch.device("cpu"), torch.bfloat16) == "grouped_mm"
    ex = random_experts(4, 16, 8, torch.float32, torch.Generator().manual_seed(0))
    x, idx, w = torch.randn(3, 16), torch.tensor([[0, 1], [2, 3], [1, 2]]), torch.rand(3, 2)
    assert relative_error(sparse_moe(x, idx, w, ex, matmul="grouped_mm"), per_token_loop(x, idx, w, ex)) < 1e-5
    with pytest.raises(ValueError, match="matmul='cutlass': expected one of"):
        sparse_moe(x, idx, w, ex, matmul="cutlass")
    with pytest.raises(ValueError, match="on CUDA only"):
        sparse_moe(x, idx, w, ex, matmul="linear_rows")


@pytest.mark.parametrize("world", [2, 4])
def test_each_ranks_experts_sum_to_the_whole_layer(world):
    """Expert parallelism (engine/model/parallel.py): the ranks' outputs over their own experts (local_routing) add up
    to the whole layer's, in every path (a skipped assignment's row is never computed and adds nothing)."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    num, hidden, inter = world * int(torch.randint(1, 6, (), generator=gen)), 16, 8
    k = int(torch.randint(1, min(num, 4) + 1, (), generator=gen))
    n = int(torch.randint(1, 30, (), generator=gen))
    ex = random_experts(num, hidden, inter, torch.float32, gen)
    x = torch.randn(n, hidden, generator=gen)
    idx = torch.rand(n, num, generator=gen).topk(k, -1).indices
    w = torch.rand(n, k, generator=gen)
    want = per_token_loop(x, idx, w, ex)
    per_rank = num // world
    for path in ("sparse", "exact", "dense"):
        total = torch.zeros_like(x)
        for rank in range(world):
            held = slice(rank * per_rank, (rank + 1) * per_rank)
            local = Experts(ex.gate_up[held], ex.down[held])
            local_idx, local_w = local_routing(idx, w, held.start, per_rank)
            assert ((local_idx == per_rank) == ((idx < held.start) | (idx >= held.stop))).all()
            if path == "dense":
                total += dense_moe(x, local_idx, local_w, local)
            else:
                total += sparse_moe(x, local_idx, local_w, local, exact=path == "exact")
        assert torch.isfinite(total).all() and relative_error(total, want) < TOLERANCE[torch.float32], path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_exact_layout_makes_a_row_depend_on_that_row_alone(dtype):
    """A row gives the same bits in any block of ROW_BLOCK rows, at any place in it, beside any other rows."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    num, k, hidden, inter = 16, 4, 32, 16
    ex = random_experts(num, hidden, inter, dtype, gen)
    row = torch.randn(1, hidden, generator=gen).to(dtype)
    row_idx = torch.randperm(num, generator=gen)[:k][None]
    row_w = torch.rand(1, k, generator=gen)
    outs = []
    for fill in ("random", "zeros", "same experts"):
        x = torch.randn(ROW_BLOCK, hidden, generator=gen).to(dtype) if fill == "random" else \
            torch.zeros(ROW_BLOCK, hidden, dtype=dtype)
        idx = torch.rand(ROW_BLOCK, num, generator=gen).topk(k, -1).indices if fill != "same experts" else \
            row_idx.expand(ROW_BLOCK, k).clone()
        w = torch.rand(ROW_BLOCK, k, generator=gen)
        place = int(torch.randint(ROW_BLOCK, (), generator=gen))
        x[place], idx[place], w[place] = row[0], row_idx[0], row_w[0]
        outs.append(sparse_moe(x, idx, w, ex, exact=True)[place])
    assert all(torch.equal(o, outs[0]) for o in outs), "the row's output depends on the other rows of its block"


def expert_free_stream(cfg: ModelConfig, arrays: dict[str, np.ndarray], live: list):
    """(name, tensor) in a shuffled order; before each routed expert it yields, every expert yielded so far must
    already be freed (its weakref dead): the stacker keeps no per-expert tensor."""
    names = list(arrays)
    random.shuffle(names)
    for name in names:
        assert all(ref() is None for ref in live), "an expert tensor outlived its copy into the stack"
        tensor = torch.from_numpy(arrays[name].copy())
        if ".experts." in name:
            live.append(weakref.ref(tensor))
        yield name, tensor
        del tensor  # a source keeps nothing it has handed over (as engine.loaders.hf_weights does)


def test_stacking_copies_each_expert_into_place_and_frees_it_on_arrival():
    rng = random.Random(random.randrange(2**31))
    cfg = moe_config(rng, num_hidden_layers=3, first_k_dense_replace=1)
    arrays = random_weights(cfg, rng.randrange(99))
    live: list = []
    rest, stacks = stack_experts(cfg, expert_free_stream(cfg, arrays, live))
    assert len(live) == 3 * cfg.n_routed_experts * 2 and set(stacks) == {1, 2}
    assert set(rest) == {n for n in arrays if ".experts." not in n}
    for layer, ex in stacks.items():
        p = f"model.layers.{layer}.mlp.experts"
        for e in range(cfg.n_routed_experts):
            want_gate_up = np.concatenate([arrays[f"{p}.{e}.gate_proj.weight"], arrays[f"{p}.{e}.up_proj.weight"]])
            assert np.array_equal(ex.gate_up[e].numpy(), want_gate_up)
            assert np.array_equal(ex.down[e].numpy(), arrays[f"{p}.{e}.down_proj.weight"])


def test_a_rank_stacks_only_the_experts_it_holds_and_still_checks_the_rest():
    rng = random.Random(random.randrange(2**31))
    cfg = moe_config(rng, num_hidden_layers=2, first_k_dense_replace=1)
    arrays = {n: torch.from_numpy(a) for n, a in random_weights(cfg, rng.randrange(99)).items()}
    num = cfg.n_routed_experts
    held = slice(rng.randrange(1, num), num)  # expert 0 lives on another rank
    _, stacks = stack_experts(cfg, arrays.items(), held)
    assert stacks[1].down.shape[0] == num - held.start
    for e in range(held.start, num):
        assert torch.equal(stacks[1].down[e - held.start], arrays[f"model.layers.1.mlp.experts.{e}.down_proj.weight"])
    gone = "model.layers.1.mlp.experts.0.up_proj.weight"
    with pytest.raises(ValueError, match=f"{gone} is missing".replace(".", r"\.")):
        stack_experts(cfg, ((n, t) for n, t in arrays.items() if n != gone), held)


def test_stacking_names_a_missing_misshapen_or_unknown_expert():
    cfg = moe_config(random.Random(1), num_hidden_layers=2, first_k_dense_replace=1)
    arrays = {n: torch.zeros(s) for n, s in weight_shapes(cfg).items()}
    last = f"model.layers.1.mlp.experts.{cfg.n_routed_experts - 1}.down_proj.weight"
    with pytest.raises(ValueError, match=f"{last} is missing".replace(".", r"\.")):
        stack_experts(cfg, {n: t for n, t in arrays.items() if n != last}.items())
    with pytest.raises(ValueError, match=r"experts\.0\.up_proj\.weight has shape \(3, 3\)"):
        stack_experts(cfg, {**arrays, "model.layers.1.mlp.experts.0.up_proj.weight": torch.zeros(3, 3)}.items())
    for bad in (f"model.layers.1.mlp.experts.{cfg.n_routed_experts}.up_proj.weight",
                "model.layers.0.mlp.experts.0.up_proj.weight"):
        with pytest.raises(ValueError, match="no such routed expert"):
            stack_experts(cfg, [*arrays.items(), (bad, torch.zeros(cfg.moe_intermediate_size, cfg.hidden_size))])


def test_the_default_path_and_bad_choices():
    small = moe_config(random.Random(2))
    assert default_path(torch.device("cpu"), torch.float32, small) == "dense"  # below CPU_SPARSE_MIN_BYTES
    big = moe_config(random.Random(2), hidden_size=256, moe_intermediate_size=128, n_routed_experts=32, n_group=1,
                     topk_group=1, num_experts_per_tok=4)
    assert 3 * 32 * 256 * 128 * 4 >= CPU_SPARSE_MIN_BYTES
    assert default_path(torch.device("cpu"), torch.float32, big) == "sparse"
    assert default_path(torch.device("cuda"), torch.float32, big) == "dense"  # torch's fallback reads the host
    ckpt = Checkpoint(small, random_weights(small, 0), "random")
    with pytest.raises(ValueError, match="expected one of"):
        TargetModel.from_checkpoint(ckpt, moe="grouped")


def counter_model(seed: int, moe: str, dtype: str = "float32") -> tuple[Checkpoint, TargetModel]:
    rng = random.Random(seed)
    cfg = moe_config(rng, n_routed_experts=32, n_group=4, topk_group=2, num_experts_per_tok=4,
                     num_hidden_layers=rng.randint(2, 3), first_k_dense_replace=rng.randint(0, 1))
    ckpt = Checkpoint(cfg, random_weights(cfg, seed), "random")
    return ckpt, TargetModel.from_checkpoint(ckpt, "cpu", dtype, moe)


@pytest.mark.parametrize("moe", ["sparse", "dense"])
def test_the_counter_equals_the_golden_routings_distinct_experts(moe):
    """After a prefill the counter holds, per MoE layer, the distinct experts the golden model's routing chose for
    the prompt's tokens (float64, engine/model/reference.py), in the fast mode and in blocks padded with zero rows."""
    seed = random.randrange(2**31)
    ckpt, model = counter_model(seed, moe)
    cfg = ckpt.config
    rng = np.random.default_rng(seed)
    for batch_invariant in (False, True):
        prompt = rng.integers(cfg.vocab_size, size=int(rng.integers(1, 40))).tolist()
        ARDecoder(model, prompt, DecodeConfig(max_new_tokens=2, batch_invariant=batch_invariant))
        trace = reference.run_model(cfg, ckpt.numpy_weights(), prompt)
        want = [len(np.unique(trace.routed[i])) for i in range(cfg.num_hidden_layers) if cfg.is_moe_layer(i)]
        assert model.experts_touched().tolist() == want, (seed, batch_invariant)


def test_the_counter_follows_the_uniform_routing_formula():
    """k distinct experts per token drawn uniformly: n tokens touch E (1 - (1 - k/E)^n) experts on average."""
    num, k, trials = 48, 4, 400
    load = ExpertLoad(1, num, torch.device("cpu"))
    for n in (1, 5, 17, 65):
        touched = []
        for _ in range(trials):
            load.reset()
            idx, _ = ops.moe_route(torch.randn(n, num), torch.zeros(num), k, 1, 1, False, True, 1.0, load.counts[0],
                                   torch.ones(n, dtype=torch.bool))
            touched.append(int(load.touched()[0]))
            assert touched[-1] == len(set(idx.flatten().tolist()))
        expected = num * (1 - (1 - k / num) ** n)
        assert abs(np.mean(touched) - expected) < 5 * np.std(touched) / np.sqrt(trials) + 1e-9, (n, expected)


def test_step_records_count_the_experts_of_their_verify():
    """Each step's record holds, per MoE layer, the distinct experts its verify's nodes chose (the routing of the
    verify recomputed by the golden router), and the bytes that reads."""
    seed = random.randrange(2**31)
    ckpt, model = counter_model(seed, "sparse")
    cfg = ckpt.config
    routed: list[dict[int, np.ndarray]] = []
    run_moe = model._moe

    def spy(rows, layer, x, real, timer):
        if layer["moe_index"] == 0:
            routed.append({})
        w = ckpt.numpy_weights()
        p = f"model.layers.{layer['moe_index'] + cfg.first_k_dense_replace}.mlp.gate"
        chosen = reference.route(cfg, x.double().numpy(), w[f"{p}.weight"].astype(np.float64),
                                 w[f"{p}.e_score_correction_bias"].astype(np.float64))[0]
        routed[-1][layer["moe_index"]] = chosen if real is None else chosen[real.numpy()]  # None: no padding rows
        return run_moe(rows, layer, x, real, timer)

    model._moe = spy
    prompt = np.random.default_rng(seed).integers(cfg.vocab_size, size=6).tolist()
    for mode, budget in (("ar", 0), ("ddtree", random.choice([3, 12, 40]))):
        dcfg = DecodeConfig(budget=budget, block_size=4, max_new_tokens=10)
        dec = make_decoder(ckpt, prompt, dcfg, mode, DrafterSpec(noise=0.5), model=model)
        routed.clear()  # from here on, one forward per step: its verify
        run = dec.run()
        assert len(routed) == run.num_steps
        for step, chosen in zip(run.steps, routed, strict=True):
            assert step.experts.touched == [len(np.unique(chosen[j])) for j in range(model.num_moe_layers)]
            assert all(t <= min(cfg.n_routed_experts, step.tree.num_nodes * cfg.num_experts_per_tok)
                       for t in step.experts.touched)
            assert step.experts.bytes_read == sum(step.experts.touched) * 3 * cfg.hidden_size * \
                cfg.moe_intermediate_size * 4


def test_sparse_decodes_the_fixture_like_the_golden_model(tiny_checkpoint):
    ckpt = tiny_checkpoint
    model = TargetModel.from_checkpoint(ckpt, moe="sparse")
    prompt, golden = ckpt.prompt.tolist(), ckpt.golden_tokens.tolist()
    cfg = DecodeConfig(budget=random.choice([5, 30]), block_size=8, max_new_tokens=24)
    ar = decode(ckpt, prompt, cfg, "ar", model=model)
    assert ar.tokens == golden and np.abs(ar.logits - ckpt.golden_logits).max() < 1e-4
    for noise in (0.0, 0.6):
        assert_greedy_equal(ar.tokens, ar.logits, decode(ckpt, prompt, cfg, "ddtree", DrafterSpec(noise=noise),
                                                         model=model).tokens)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sparse_batch_invariant_decodes_are_ar_bit_for_bit(dtype):
    seed = random.randrange(2**31)
    ckpt, model = counter_model(seed, "sparse", dtype)
    rng = random.Random(seed)
    prompt = [rng.randrange(ckpt.config.vocab_size) for _ in range(rng.randint(1, 9))]
    cfg = DecodeConfig(budget=rng.choice([3, 17]), block_size=rng.randint(2, 6), max_new_tokens=8, dtype=dtype,
                       batch_invariant=True)
    ar = decode(ckpt, prompt, cfg, "ar", model=model)
    for mode in ("ddtree", "chain"):
        run = decode(ckpt, prompt, cfg, mode, DrafterSpec(noise=rng.random(), seed=rng.randrange(99)), model=model)
        assert run.tokens == ar.tokens and np.array_equal(run.logits, ar.logits), (mode, seed)


def test_reports_and_metrics_carry_the_expert_traffic():
    seed = random.randrange(2**31)
    ckpt, model = counter_model(seed, "sparse")
    prompt = np.random.default_rng(seed).integers(ckpt.config.vocab_size, size=5).tolist()
    cfg = DecodeConfig(budget=24, block_size=4, max_new_tokens=9)
    runs = decode_runs(ckpt, prompt, cfg, DrafterSpec(noise=0.3), ("ddtree",), model=model)
    doc = json.loads(report.render(Measurement.of(runs), "report.json"))
    jsonschema.validate(doc, REPORT_SCHEMA)
    records = [s for run in runs.values() for s in run.steps]
    for step, rec in zip(doc["steps"], records, strict=True):
        assert step["experts"] == {"touched": rec.experts.touched, "bytes_per_expert": model.bytes_per_expert,
                                   "bytes_read": sum(rec.experts.touched) * model.bytes_per_expert}
    rows = list(csv.DictReader(io.StringIO(report.render(Measurement.of(runs), "steps.csv").decode())))
    for row, rec in zip(rows, records, strict=True):
        assert [int(t) for t in row["experts_touched"].split()] == rec.experts.touched
        assert int(row["expert_bytes"]) == rec.experts.bytes_read
    for mode, run in runs.items():
        traffic = metrics.expert_traffic(run)
        touched = np.array([s.experts.touched for s in run.steps], dtype=float)
        assert traffic["touched"] == pytest.approx(touched.mean(0).tolist())
        assert traffic["touched_total"] == pytest.approx(touched.sum(1).mean())
        assert traffic["bytes_read"] == pytest.approx(touched.sum(1).mean() * model.bytes_per_expert)
        assert traffic["bytes_per_token"] == pytest.approx(
            touched.sum() * model.bytes_per_expert / sum(s.num_committed for s in run.steps))
        if mode == "ar":
            assert max(traffic["touched"]) <= ckpt.config.num_experts_per_tok
    summary = doc["summaries"]["ddtree"]
    expected = metrics.expert_traffic(runs["ddtree"])
    assert summary["expert_traffic"].keys() == expected.keys()
    for key, value in expected.items():  # approx takes no list inside a dict (pytest >= 9.2): one field at a time
        assert summary["expert_traffic"][key] == pytest.approx(value), key
    assert summary["ar_expert_traffic"]["touched_total"] <= summary["expert_traffic"]["touched_total"]
