"""`--budget auto`: the policy's arithmetic against brute force, and the decoder it drives against AR (lossless
whatever it chooses: greedy, sampled under a seed, and bit for bit in the batch-invariant mode)."""
from __future__ import annotations

import argparse
import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import TINY_FIXTURE
from dflash_dirs import small_layout
from greedy import assert_greedy_equal, assert_sampled_equal
from test_decode import check_step_invariants

from cli import options as opts
from cli.__main__ import main
from engine.config import DecodeConfig, buckets_up_to
from engine.decoding.auto_budget import LIMIT_WINDOW, MAX_IN_FLIGHT, AutoBudgetDecoder, truncate
from engine.decoding.budget import CostTable, choose, confidence_prior, learn_confidence, log_confidence
from engine.decoding.decoder import ARDecoder, DecodeError
from engine.decoding.session import continuation_of
from engine.drafters import DrafterSpec, DraftTarget, build_drafter
from engine.model.cache import LatentCache
from engine.model.dflash_fixtures import make_dflash_dir
from engine.model.target import TargetModel
from kernels import ops


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def random_tree(seed: int, budget: int, depth: int = 7, vocab: int = 50):
    gen = torch.Generator().manual_seed(seed)
    draft = torch.log_softmax(3 * torch.randn(depth, vocab, generator=gen), -1)
    return ops.tree_build(draft, torch.tensor(0), budget)


def brute_force_path_probability(tree, i: int, log_factors: torch.Tensor) -> float:
    """exp(score_i) times the correction of every node on i's path (root excluded), capped at 1."""
    correction, node = 0.0, i
    while node > 0:
        correction += float(log_factors[tree.depths[node], min(int(tree.ranks[node]), 1)])
        node = int(tree.parents[node])
    return min(1.0, math.exp(float(tree.scores[i]) + correction))


def brute_force_choice(tree, buckets, log_factors, seconds):
    """(expected accepted at each bucket, values, the best index) the slow way."""
    probabilities = [0.0] + [brute_force_path_probability(tree, i, log_factors) for i in range(1, len(tree.tokens))]
    expected = [sum(probabilities[1:b + 1]) for b in buckets]
    values = [(1 + e) / s for e, s in zip(expected, seconds, strict=True)]
    return expected, values, int(np.argmax(values))


@pytest.mark.parametrize("seed", range(5))
def test_the_choice_is_the_prefix_sum_of_corrected_path_probabilities_per_second(seed):
    """choose's expected accepted tokens at b is the sum of the corrected path probabilities of nodes 1..b, its
    value (1 + expected) / seconds, its index the best value's, against a walk up every node's path."""
    tree = random_tree(seed, 64)
    gen = torch.Generator().manual_seed(seed)
    log_factors = torch.randn(8, 2, generator=gen) * 0.7
    log_factors[0] = 0
    buckets = (0, 1, 7, 33, 64)
    seconds = torch.rand(len(buckets), generator=gen) + 0.5
    got = choose(tree, log_factors.exp(), torch.ones(8, 2), torch.tensor(buckets), seconds)
    expected, values, best = brute_force_choice(tree, buckets, log_factors, seconds.tolist())
    np.testing.assert_allclose(got.expected.numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.value.numpy(), values, rtol=1e-5)
    assert int(got.chosen) == best and got.chosen.dtype == torch.int64 and got.chosen.dim() == 0


def test_equal_tokens_per_second_go_to_the_smaller_budget():
    tree = random_tree(3, 64)
    buckets = torch.tensor(buckets_up_to(64))
    flat = choose(tree, torch.ones(8, 2), torch.ones(8, 2), buckets, torch.ones(len(buckets)))
    seconds = 1 + flat.expected  # every bucket's value exactly 1
    assert int(choose(tree, torch.ones(8, 2), torch.ones(8, 2), buckets, seconds).chosen) == 0


@pytest.mark.parametrize("seed", range(5))
def test_every_truncation_is_a_valid_tree_with_its_own_mask(seed):
    tree = random_tree(seed, 64)
    for b in (0, 1, 16, 64):
        tokens, parents, depths, _, scores, visibility = truncate(tree, b)
        assert tokens.shape == (b + 1,) and visibility.shape == (b + 1, b + 1)
        assert all(parents[i] < i for i in range(1, b + 1)), "a parent precedes its children"
        small = ops.tree_build(torch.log_softmax(3 * torch.randn(7, 50, generator=torch.Generator().manual_seed(
            seed)), -1), torch.tensor(0), b)
        assert torch.equal(small.tokens, tokens) and torch.equal(small.visibility, visibility), \
            "the truncation at b is the tree tree_build builds at budget b"


def test_cost_table_refuses_bad_times_and_follows_measurements():
    with pytest.raises(ValueError, match="one positive time per bucket"):
        CostTable((0, 8), [1.0])
    with pytest.raises(ValueError, match="one positive time per bucket"):
        CostTable((0, 8), [1.0, float("nan")])
    table = CostTable((0, 8), [1.0, 1.0])
    for _ in range(60):
        table.observe(8, 3.0)
    table.observe(8, float("nan"))  # a broken timing is ignored
    assert table.predicted() == pytest.approx([1.0, 3.0], rel=1e-3), "the AR step's kind has seen no step"
    steady = CostTable((0, 8), [1.0, 1.0])
    for _ in range(30):
        steady.observe(8, 1.5)
    steady.observe(8, 100.0)  # one stall (a graph's upload, the host away) moves the prediction by a bounded step
    assert 1.5 < steady.predicted()[1] < 2.0


def test_buckets_not_chosen_rise_with_the_run_not_stay_at_the_calibration():
    """A decode step costs more than the calibration's part of it. A bucket the run keeps choosing must not come to
    look dearer than the others merely because they were not run: every drafted bucket moves with its kind's
    excess, the calibration's differences kept; the AR step's kind moves apart."""
    rng = np.random.default_rng(rng_seed := int(np.random.SeedSequence().entropy % 2**32))
    buckets = buckets_up_to(256)
    calibrated = [float(s) for s in 1e-3 + np.cumsum(rng.uniform(2e-4, 4e-4, len(buckets)))]
    table = CostTable(buckets, list(calibrated))
    chosen, extra = int(rng.integers(1, len(buckets))), float(rng.uniform(2e-4, 1e-3))
    for _ in range(80):
        table.observe(buckets[chosen], calibrated[chosen] + extra)
    got = table.predicted()
    assert got[0] == pytest.approx(calibrated[0]), rng_seed
    for i in range(1, len(buckets)):
        assert got[i] == pytest.approx(calibrated[i] + extra, rel=1e-6), (rng_seed, i)
    dearer = rng.uniform(5e-5, 1e-4)  # a second bucket turns out dearer than its calibration said
    other = 1 + (chosen % (len(buckets) - 1))
    for _ in range(200):
        for i in (chosen, other):
            table.observe(buckets[i], calibrated[i] + extra + dearer * (i == other))
    got = table.predicted()  # the calibration's gaps are wider than `dearer`: the monotone fit leaves them
    assert got[other] - got[chosen] > calibrated[other] - calibrated[chosen] + 0.6 * dearer, rng_seed
    assert all(a <= b for a, b in zip(got, got[1:], strict=False))


def test_the_policy_reads_the_closest_monotone_costs():
    """A smaller tree's verify is part of a larger one's work: the policy reads the isotonic regression of the
    table, checked against its min-max formula (entry i = max over j <= i of min over k >= i of mean(y[j..k]))."""
    rng = np.random.default_rng(rng_seed := int(np.random.SeedSequence().entropy % 2**32))
    buckets = buckets_up_to(256)
    seconds = [float(s) for s in rng.uniform(1e-3, 1e-2, len(buckets))]
    got = CostTable(buckets, list(seconds)).predicted()
    n = len(seconds)
    want = [max(min(float(np.mean(seconds[j:k + 1])) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]
    np.testing.assert_allclose(got, want, rtol=1e-9, err_msg=f"seed {rng_seed}")
    assert CostTable(buckets, sorted(seconds)).predicted() == sorted(seconds), "a monotone table is read as it is"


def chain_with_siblings(depth: int, top: float, sibling: float):
    """A verified tree: the root, then per depth a top child (rank 0, conditional `top`) and a sibling (rank 1,
    conditional `sibling`) under the previous top child. Returns (parents, depths, ranks, scores, top nodes)."""
    parents, depths, ranks, scores = [-1], [0], [0], [0.0]
    tops = [0]
    for d in range(1, depth + 1):
        v = tops[-1]
        for rank, p in ((0, top), (1, sibling)):
            parents.append(v)
            depths.append(d)
            ranks.append(rank)
            scores.append(scores[v] + math.log(p))
        tops.append(len(parents) - 2)
    tensors = (torch.tensor(parents), torch.tensor(depths), torch.tensor(ranks), torch.tensor(scores))
    return *tensors, tops


@pytest.mark.parametrize("truth", [0.3, 1.0, 2.0])
def test_calibration_learns_a_drafters_over_and_under_confidence(truth):
    """A chain whose top token the drafter rates 0.4 at every depth but which is accepted with probability
    0.4 * truth: the rank-0 factors converge to truth; a sibling never accepted drives its factor towards 0."""
    rng = np.random.default_rng(1)
    realised, predicted = confidence_prior(4, torch.device("cpu"))
    parents, depths, ranks, scores, tops = chain_with_siblings(4, 0.4, 0.1)
    for _ in range(6000):
        length = 1
        while length < 5 and rng.random() < 0.4 * truth:
            length += 1
        path = torch.tensor(tops[:length] + [-1] * (5 - length))
        learn_confidence(realised, predicted, parents, depths, ranks, scores, path)
    got = log_confidence(realised, predicted).exp()
    assert got[0].tolist() == [1.0, 1.0]
    for d in range(1, 5):
        trials = 6000 * min(1.0, 0.4 * truth) ** (d - 1)  # steps whose path reached depth d - 1
        if trials >= 2000:  # enough evidence for the ratio to sit within 10% of the truth
            assert got[d, 0].item() == pytest.approx(truth, rel=0.1), (d, got)
            assert got[d, 1].item() < 0.05, "a sibling that is never accepted"


def test_calibration_counts_each_trial_as_a_brute_force_walk_does():
    """One tree, one path: the evidence added at each (depth, rank class) equals a walk down the path."""
    tree = random_tree(5, 48)
    for length in (1, 2, 4):
        path = [0]
        while len(path) < length:
            kids = [c for c in range(1, 49) if int(tree.parents[c]) == path[-1]]
            if not kids:
                break
            path.append(kids[len(path) % len(kids)])
        realised, predicted = torch.zeros(8, 2), torch.zeros(8, 2)
        padded = torch.tensor(path + [-1] * (8 - len(path)))
        learn_confidence(realised, predicted, tree.parents, tree.depths, tree.ranks, tree.scores, padded)
        want_r, want_p = torch.zeros(8, 2), torch.zeros(8, 2)
        for d in range(1, len(path) + 1):
            v = path[d - 1]
            for c in range(1, 49):
                if int(tree.parents[c]) == v:
                    cls = min(int(tree.ranks[c]), 1)
                    want_p[d, cls] += math.exp(float(tree.scores[c] - tree.scores[v]))
                    want_r[d, cls] += 1.0 if d < len(path) and path[d] == c else 0.0
        assert torch.allclose(predicted, want_p, atol=1e-6) and torch.equal(realised, want_r)


def auto_decoder(ckpt, model, cfg, spec, known=None):
    prompt = ckpt.prompt.tolist()
    target = DraftTarget(model, prompt, cfg, continuation_of(ckpt, prompt, cfg, model, known))
    return AutoBudgetDecoder(model, prompt, cfg, build_drafter(spec, target))


@pytest.mark.parametrize("noise", [0.0, 0.3, 0.8])
@pytest.mark.parametrize("maximum", [16, 64])
def test_auto_emits_ar_tokens_greedy(tiny, noise, maximum):
    ckpt, model = tiny
    cfg = DecodeConfig(budget=maximum, max_new_tokens=24)
    ar = ARDecoder(model, ckpt.prompt.tolist(), cfg).run()
    decoder = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=noise, seed=7), ar.tokens)
    run = decoder.run()
    assert_greedy_equal(ar.tokens, ar.logits, run.tokens)
    choices: list[int] = []  # the drafted steps' so far
    for step in run.steps:
        check_step_invariants(step, cfg.num_draft_positions)
        choice = step.budget
        if choice.drafted:  # built at the smallest bucket >= twice the recent choices (MAX before any)
            recent = choices[-LIMIT_WINDOW:]
            wanted = max(2 * max(recent), decoder.buckets[1]) if recent else maximum
            assert choice.built == min([b for b in decoder.buckets if b >= wanted] or [maximum]), (choices, choice)
            assert choice.chosen <= choice.built
            beyond = [e for b, e in zip(choice.buckets, choice.expected, strict=True) if b >= choice.built]
            assert max(beyond) - min(beyond) < 1e-6, "the buckets past the build limit add no node"
            choices.append(choice.chosen)
        assert choice is not None and choice.chosen in decoder.buckets
        smallest = decoder.buckets[1]  # a drafted step that chooses 0 still verifies the smallest tree
        assert step.tree.num_nodes == (choice.chosen or (smallest if choice.drafted else 0)) + 1, \
            "the verified tree is the chosen truncation"
        assert len(choice.expected) == len(choice.cost_s) == len(choice.value) == len(decoder.buckets)
        assert all(v == pytest.approx((1 + e) / c) for e, c, v in zip(choice.expected, choice.cost_s,
                                                                        choice.value, strict=True))
        if choice.drafted:
            assert choice.chosen == choice.buckets[int(np.argmax(choice.value))]


def test_a_drafter_that_never_hits_backs_off_to_draft_free_ar_steps(tiny, monkeypatch):
    """Every draft wrong (an oracle whose true token is always dropped): once the confidence correction has seen
    it, b = 0 wins and steps stop drafting, for longer each time, and the tokens are still AR's. The costs are
    fixed (drafting doubles a step) so that this machine's timing noise cannot move the choice."""
    ckpt, model = tiny
    cfg = DecodeConfig(budget=16, max_new_tokens=64)
    ar = ARDecoder(model, ckpt.prompt.tolist(), cfg).run()
    decoder = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=1.0, seed=3), ar.tokens)
    decoder.costs = CostTable(decoder.buckets, [1.0] + [2.0] * (len(decoder.buckets) - 1))
    monkeypatch.setattr(decoder.costs, "observe", lambda budget, seconds: None)
    run = decoder.run()
    assert_greedy_equal(ar.tokens, ar.logits, run.tokens)
    undrafted = [s for s in run.steps if not s.budget.drafted]
    assert len(undrafted) > len(run.steps) // 2, [s.budget.chosen for s in run.steps]
    assert all(s.tree.num_nodes == 1 and s.budget.chosen == 0 for s in undrafted)
    drafted_at = [s.index for s in run.steps if s.budget.drafted]
    gaps = np.diff(drafted_at[-3:])
    assert (gaps > 1).all() and (np.diff(gaps) >= 0).all(), f"probes further apart each time: {drafted_at}"


def forced_backoff(decoder: AutoBudgetDecoder, monkeypatch) -> None:
    """Costs under which no draft pays (an AR step 1 s, any drafted step 100 s), whatever this machine's timing."""
    decoder.costs = CostTable(decoder.buckets, [1.0] + [100.0] * (len(decoder.buckets) - 1))
    monkeypatch.setattr(decoder.costs, "observe", lambda budget, seconds: None)


def context_rows_of(model: TargetModel, drafter, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The DFlash context K/V a drafter holds after a decode that cached `tokens`, written in one go from a
    prefill of them: what step-by-step commits must have built."""
    from engine.drafters.dflash import DFlashDrafter
    fresh = DFlashDrafter(drafter.cfg, drafter.model.w, model, drafter.model.num_draft_positions,
                          drafter.model.capacity, drafter.source)
    n = len(tokens)
    cache = LatentCache(model.cfg.num_hidden_layers, n + 1, model.cfg.kv_lora_rank, model.cfg.qk_rope_head_dim,
                        model.device, model.dtype, model.rope(n + 1))
    _, hidden = model.forward(torch.tensor(tokens), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(),
                              cache, hidden_layers=drafter.hidden_layers)
    fresh.begin(torch.tensor(tokens), hidden)
    return fresh.model.keys[:, :n], fresh.model.values[:, :n]


def test_the_backoffs_ar_steps_reach_the_drafter_in_one_commit(tiny, tmp_path, monkeypatch):
    """While backing off, AR steps leave the DFlash drafter alone (plain AR's cost); the next drafted step tells it
    of all their tokens in one commit, and its context is then the one a prefill of every cached token writes."""
    ckpt, model = tiny
    cfg = DecodeConfig(budget=16, max_new_tokens=28)
    prompt = ckpt.prompt.tolist()
    ar = ARDecoder(model, prompt, cfg).run()
    spec = DrafterSpec("dflash", model=str(make_dflash_dir(tmp_path / "d", small_layout(ckpt.config))))
    decoder = AutoBudgetDecoder(model, prompt, cfg, build_drafter(spec, DraftTarget(model, prompt, cfg, None)))
    forced_backoff(decoder, monkeypatch)
    commits = []
    drafter = decoder.drafter
    real_commit = drafter.commit
    monkeypatch.setattr(drafter, "commit", lambda path, n, hidden: (commits.append(int(n)), real_commit(path, n,
                                                                                                       hidden)))
    run = decoder.run()
    assert_greedy_equal(ar.tokens, ar.logits, run.tokens)
    undrafted = sum(not s.budget.drafted for s in run.steps)
    drafted = len(run.steps) - undrafted
    assert undrafted > len(run.steps) // 2 and len(commits) <= 2 * drafted, commits  # a step's own, a back-off's
    assert any(n > 2 for n in commits), f"a commit of a whole back-off: {commits}"
    if decoder.num_pending:  # the last back-off, not yet told
        decoder._catch_up_part(decoder.num_pending)
    cached = int(decoder.cache.prefix_len)
    assert int(drafter.model.length) == cached, "the drafter's context holds every cached token"
    keys, values = context_rows_of(model, drafter, (prompt + run.tokens)[:cached])
    torch.testing.assert_close(drafter.model.keys[:, :cached], keys, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(drafter.model.values[:, :cached], values, rtol=1e-4, atol=1e-5)
    assert decoder.budget_counts[0] == undrafted and sum(decoder.budget_counts.values()) == len(run.steps)


def test_the_backoff_carries_over_to_the_next_decode_of_the_drafter(tiny, monkeypatch):
    """A drafter that never hits: the next decode on the same model starts at the back-off the last one reached
    (its first step still drafts, to check), so it does not pay the short back-offs again."""
    ckpt, model = tiny
    cfg = DecodeConfig(budget=16, max_new_tokens=32)
    known = ARDecoder(model, ckpt.prompt.tolist(), cfg).run().tokens
    first = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=1.0, seed=11), known)
    forced_backoff(first, monkeypatch)
    first.run()
    reached = first.track.backoff
    assert reached >= 8
    second = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=1.0, seed=11), known)
    forced_backoff(second, monkeypatch)
    steps = [second.step() for _ in range(4)]
    assert steps[0].budget.drafted and not any(s.budget.drafted for s in steps[1:])
    assert second.track is first.track and second.ar_steps_left == reached - 3


def test_auto_emits_ar_tokens_when_sampling(tiny):
    ckpt, model = tiny
    cfg = DecodeConfig(budget=32, max_new_tokens=24, temperature=0.8, top_p=0.95, seed=5)
    ar = ARDecoder(model, ckpt.prompt.tolist(), cfg).run()
    run = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=0.2), ar.tokens).run()
    assert_sampled_equal(ar, run.tokens, cfg)


def test_auto_is_bitwise_ar_in_the_batch_invariant_mode(tiny):
    ckpt, model = tiny
    cfg = DecodeConfig(budget=64, max_new_tokens=24, batch_invariant=True)
    ar = ARDecoder(model, ckpt.prompt.tolist(), cfg).run()
    run = auto_decoder(ckpt, model, cfg, DrafterSpec(noise=0.3), ar.tokens).run()
    assert run.tokens == ar.tokens
    assert np.array_equal(run.logits, ar.logits), "every committed token's logits bit for bit"


def test_startup_costs_are_measured_once_per_model_and_setting(tiny, monkeypatch):
    ckpt, model = tiny
    cfg = DecodeConfig(budget=16, max_new_tokens=4)
    first = auto_decoder(ckpt, model, cfg, DrafterSpec())
    assert all(s > 0 for s in first.costs.calibrated) and len(first.costs.calibrated) == len(first.buckets)
    first.run()
    learned = first.costs.predicted()
    assert sum(first.costs.weights) > 0, "the decode's steps reached the table"
    monkeypatch.setattr(AutoBudgetDecoder, "_calibration_step", lambda self, b: pytest.fail("measured again"))
    again = auto_decoder(ckpt, model, dataclasses.replace(cfg, max_new_tokens=6), DrafterSpec())
    assert again.costs is first.costs and again.costs.predicted() == learned, "the table carries over, as learned"


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")


@cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("noise", [0.0, 0.4])
def test_auto_with_cuda_graphs_emits_ar_tokens(tiny_checkpoint, dtype, noise, monkeypatch):
    """A drafted step is one captured graph whose verify is a switch over every bucket, replayed: with a cost table
    drawn afresh for every step, so that the choices spread over the buckets, each step verifies the tree it chose
    and the tokens are AR's (bit for bit in the batch-invariant mode, in bfloat16 too)."""
    ckpt = tiny_checkpoint
    model = TargetModel.from_checkpoint(ckpt, "cuda", dtype)
    cfg = DecodeConfig(budget=64, max_new_tokens=64, device="cuda", dtype=dtype, batch_invariant=True)
    ar = ARDecoder(model, ckpt.prompt.tolist(), cfg).run()
    prompt = ckpt.prompt.tolist()
    target = DraftTarget(model, prompt, cfg, continuation_of(ckpt, prompt, cfg, model, ar.tokens))
    decoder = AutoBudgetDecoder(model, prompt, cfg, build_drafter(DrafterSpec(noise=noise, seed=2), target),
                                cuda_graph=True)
    rng = np.random.default_rng(int(noise * 10))
    decoder.costs = CostTable(decoder.buckets, [1.0] * len(decoder.buckets))
    redraw = lambda budget, seconds: decoder.costs.calibrated.__setitem__(  # noqa: E731
        slice(None), sorted(rng.uniform(1e-3, 1e-2, len(decoder.buckets))))
    monkeypatch.setattr(decoder.costs, "observe", redraw)
    run = decoder.run()
    assert run.tokens == ar.tokens
    assert decoder.graph_captured and set(decoder._graphs) >= {"draft", "ar"}
    assert len(decoder._graph_out["draft"].outputs) == len(decoder.buckets), "one branch per bucket"
    drafted = [s for s in run.steps[1:] if s.budget.drafted]  # the first step ran eagerly
    for step in drafted:
        assert step.tree.num_nodes == max(step.budget.chosen, decoder.buckets[1]) + 1
    assert len({s.budget.chosen for s in drafted}) >= 3, "the choices spread over the buckets"


@cuda
def test_the_host_reads_the_choices_behind_the_device_without_waiting(tiny_checkpoint):
    """advance() alone, as a timed loop calls it: the host never runs more than MAX_IN_FLIGHT steps ahead of the
    reports it has read, and once settled every step is counted under the budget it verified and the committed
    count it read is the device's."""
    ckpt = tiny_checkpoint
    model = TargetModel.from_checkpoint(ckpt, "cuda", "float32")
    cfg = DecodeConfig(budget=32, max_new_tokens=200, device="cuda", dtype="float32")
    prompt = ckpt.prompt.tolist()
    target = DraftTarget(model, prompt, cfg, continuation_of(ckpt, prompt, cfg, model, None))
    decoder = AutoBudgetDecoder(model, prompt, cfg, build_drafter(DrafterSpec(noise=0.3, seed=4), target),
                                cuda_graph=True)
    for _ in range(30):
        decoder.advance()
        assert len(decoder._in_flight) <= MAX_IN_FLIGHT
    decoder.settle_timing()
    assert not decoder._in_flight and sum(decoder.budget_counts.values()) == 30
    assert decoder.num_seen_generated == int(decoder.num_generated)


@cuda
def test_backoff_and_catch_up_replay_as_graphs_and_emit_ar_tokens(tiny_checkpoint, tmp_path, monkeypatch):
    """Under CUDA graphs the back-off's AR steps and each catch-up commit are captured graphs too; the tokens are
    AR's and the drafter's context holds every cached token."""
    ckpt = tiny_checkpoint
    model = TargetModel.from_checkpoint(ckpt, "cuda", "float32")
    cfg = DecodeConfig(budget=16, max_new_tokens=40, device="cuda", dtype="float32", batch_invariant=True)
    prompt = ckpt.prompt.tolist()
    ar = ARDecoder(model, prompt, cfg).run()
    spec = DrafterSpec("dflash", model=str(make_dflash_dir(tmp_path / "d", small_layout(ckpt.config))))
    decoder = AutoBudgetDecoder(model, prompt, cfg, build_drafter(spec, DraftTarget(model, prompt, cfg, None)),
                                cuda_graph=True)
    forced_backoff(decoder, monkeypatch)
    run = decoder.run()
    assert run.tokens == ar.tokens
    assert "ar" in decoder._graphs and any(isinstance(k, tuple) and k[0] == "catch_up" for k in decoder._graphs)
    if decoder.num_pending:
        decoder._catch_up_part(decoder.num_pending)
    assert int(decoder.drafter.model.length) == int(decoder.cache.prefix_len)


@pytest.mark.parametrize(("flag", "budget", "auto"), [("64", 64, False), ("auto", 256, True), ("auto:32", 32, True)])
def test_the_budget_flag_takes_a_number_or_auto(tiny_checkpoint, flag, budget, auto):
    parser = argparse.ArgumentParser()
    opts.add_decode_args(parser)
    args = parser.parse_args(["--budget", flag])
    cfg = opts.decode_config(args, tiny_checkpoint, tiny_checkpoint.prompt.tolist())
    assert (cfg.budget, cfg.auto_budget) == (budget, auto)
    assert cfg.budget_label == (f"auto:{budget}" if auto else str(budget))


@pytest.mark.parametrize(("flag", "message"), [("auto:x", "expected auto or auto:MAX"), ("many", "a whole number"),
                                               ("auto:0", "needs a budget of at least 1"),
                                               ("auto:2000", "budget=2000 is out of range")])
def test_a_bad_budget_flag_is_a_clear_error(flag, message, capsys):
    try:
        code = main(["run", "--model", str(TINY_FIXTURE), "--budget", flag, "--max-new", "2"])
    except SystemExit as exc:  # argparse refuses the flag's text itself
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_an_auto_decoder_needs_a_tree_to_choose_from(tiny):
    ckpt, model = tiny
    with pytest.raises(DecodeError, match="at least 1 node"):
        auto_decoder(ckpt, model, DecodeConfig(budget=0), DrafterSpec())
