"""Sampling at T > 0: the sampler draws softmax(logits / T) (with top-k / top-p) and the position-keyed noise
makes DDTree and the chain commit exactly AR's tokens for the same seed, whatever the drafter proposes."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from greedy import assert_sampled_equal
from test_drafters import ProbeDrafter

from cli.__main__ import main
from engine.config import ConfigError, DecodeConfig
from engine.decoding.decoder import Decoder
from engine.decoding.node_probs import node_probs
from engine.decoding.sampling import bits_to_uniforms, filtered_logits, pick, probabilities, uniforms
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.model.target import TargetModel


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def exact_distribution(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """softmax(logits / T) restricted to top-k, then to the smallest top-p nucleus: numpy, written apart."""
    z = logits.astype(np.float64) / temperature
    keep = np.ones_like(z, dtype=bool)
    if top_k:
        keep &= z >= np.sort(z)[-top_k]
    z = np.where(keep, z, -np.inf)
    p = np.exp(z - z.max())
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        nucleus = np.zeros_like(keep)
        nucleus[order[before < top_p]] = True
        p = np.where(nucleus, p, 0.0)
        p /= p.sum()
    return p


def chi_square_z(counts: np.ndarray, probs: np.ndarray) -> float:
    """Wilson-Hilferty z-score of Pearson's chi-square over the support's bins with expected counts >= 5 (the
    rest pooled); 0 for a single-token support (every draw in it is checked by the caller)."""
    counts, probs = counts[probs > 0], probs[probs > 0]
    if len(probs) < 3:
        return 0.0 if len(probs) == 1 else abs(counts[0] - probs[0] * counts.sum()) / math.sqrt(
            counts.sum() * probs[0] * probs[1])
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # too little pooled mass for its own bin: fold it into the smallest bin
        obs, exp = obs[:-1], exp[:-1]
        obs[np.argmin(exp)] += counts[~big].sum()
        exp[np.argmin(exp)] += expected[~big].sum()
    stat = float(((obs - exp) ** 2 / exp).sum())
    k = len(obs) - 1
    if k == 0:  # all the expected mass in one bin: these draws cannot tell samplers apart
        return 0.0
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def rejects(counts: np.ndarray, probs: np.ndarray) -> bool:
    """The test's verdict on a sampler's counts: a draw outside the support, or a chi-square z above 4
    (p ~ 3e-5 for the right sampler)."""
    return bool(counts[probs == 0].sum() > 0) or chi_square_z(counts, probs) > 4.0


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.5, 0, 1.0), (1.0, 12, 1.0),
                                                       (1.0, 0, 0.8), (0.5, 20, 0.95)])
def test_the_sampler_draws_the_exact_distribution(temperature, top_k, top_p):
    rng = np.random.default_rng()
    vocab = 40
    logits = rng.normal(size=vocab) * 2.0
    while temperature != 1.0 and np.abs(exact_distribution(logits, 1.0, top_k, top_p)
                                         - exact_distribution(logits, temperature, top_k, top_p)).sum() < 0.1:
        logits = rng.normal(size=vocab) * 2.0  # logits on which the temperature matters
    cfg = DecodeConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=int(rng.integers(2**40)))
    num_draws = 6000
    row = torch.tensor(logits, dtype=torch.float32).expand(num_draws, vocab)
    positions = torch.from_numpy(rng.choice(10**7, num_draws, replace=False))  # independent keys
    counts = np.bincount(pick(row, positions, cfg).numpy(), minlength=vocab)
    want = exact_distribution(logits, temperature, top_k, top_p)
    assert counts[want == 0].sum() == 0, "no draw outside top-k / top-p"
    assert not rejects(counts, want)
    assert np.allclose(probabilities(row[:1], cfg).numpy()[0], want, atol=1e-6)
    ignored = exact_distribution(logits, 1.0, top_k, top_p)  # a sampler that ignores T
    if temperature != 1.0:
        assert rejects(np.round(ignored * num_draws), want), "the test tells a wrong sampler apart"
    seeds = [pick(row[:1], positions[:1], DecodeConfig(temperature=temperature, seed=s)).item() for s in range(600)]
    assert chi_square_z(np.bincount(seeds, minlength=vocab), exact_distribution(logits, temperature, 0, 1.0)) < 4.0


def test_noise_is_keyed_by_seed_and_position_only():
    positions = torch.tensor([5, 9, 5])
    u = uniforms(7, positions, 64)
    assert torch.equal(u[0], u[2]) and not torch.equal(u[0], u[1])
    assert torch.equal(uniforms(7, positions[1:2], 64)[0], u[1]), "a row's noise does not depend on the others"
    assert not torch.equal(uniforms(8, positions, 64), u)
    assert 0 < float(u.min()) and float(u.max()) < 1
    assert torch.equal(uniforms(2**40 + 7, positions, 64), uniforms(2**40 + 7, positions, 64))


def test_the_extreme_hashes_stay_inside_the_open_interval_and_filtered_tokens_stay_out():
    extremes = bits_to_uniforms(torch.tensor([0, 1, 2**32 - 2, 2**32 - 1], dtype=torch.int64))
    assert 0 < float(extremes.min()) and float(extremes.max()) < 1
    gumbel = -torch.log(-torch.log(extremes))
    assert torch.isfinite(gumbel).all()
    logits = torch.tensor([[3.0, 0.0, -1.0, -2.0]])
    assert int((filtered_logits(logits, DecodeConfig(temperature=1.0, top_k=1)) + gumbel.flip(0)).argmax()) == 0


@pytest.mark.parametrize("temperature", [0.3, 0.7, 1.0, 1.5])
def test_ddtree_and_chain_commit_the_ar_samples(tiny, temperature):
    ckpt, model = tiny
    rng = random.Random()
    prompt = [rng.randrange(ckpt.config.vocab_size) for _ in range(rng.randint(1, 8))]
    for _ in range(2):
        cfg = DecodeConfig(budget=rng.choice([1, 5, 24, 80]), block_size=rng.randint(2, 9), max_new_tokens=20,
                           temperature=temperature, seed=rng.randrange(2**31),
                           top_k=rng.choice([0, 0, 50]), top_p=rng.choice([1.0, 1.0, 0.9]))
        ar = decode(ckpt, prompt, cfg, "ar", model=model)
        for mode, spec in (("ddtree", DrafterSpec(noise=rng.random(), seed=rng.randrange(99))),
                           ("chain", DrafterSpec(noise=rng.random()))):
            assert_sampled_equal(ar, decode(ckpt, prompt, cfg, mode, spec, model=model).tokens, cfg)
        probe = ProbeDrafter(ckpt.config.vocab_size, cfg.num_draft_positions, (), rng.randrange(99))
        assert_sampled_equal(ar, Decoder(model, prompt, cfg, "ddtree", probe).run().tokens, cfg)


def test_seeds_change_the_text_and_temperature_zero_is_greedy(tiny):
    ckpt, model = tiny
    prompt = ckpt.prompt.tolist()
    texts = {tuple(decode(ckpt, prompt, DecodeConfig(temperature=1.0, seed=s), "ar", model=model).tokens)
             for s in random.sample(range(10**6), 4)}
    assert len(texts) == 4
    assert decode(ckpt, prompt, DecodeConfig(seed=123), "ddtree", model=model).tokens == ckpt.golden_tokens.tolist()


def test_node_probabilities_match_an_independent_computation_and_the_walk():
    rng = np.random.default_rng()
    vocab, depth, budget = 6, 3, 10
    draft = torch.from_numpy(rng.normal(size=(depth, vocab)) * 2).float().log_softmax(-1)
    from kernels import ops

    tree = ops.tree_build(draft, torch.tensor(2), budget)
    tokens, parents = tree[0].tolist(), tree[1].tolist()
    logits = torch.from_numpy(rng.normal(size=(budget + 1, vocab)) * 2).float()
    cfg = DecodeConfig(temperature=1.3, seed=1)
    probs = node_probs(logits, tree, draft, cfg)
    dist = [exact_distribution(row, 1.3, 0, 1.0) for row in logits.numpy()]
    for i in range(1, budget + 1):
        assert probs.target[i] == pytest.approx(dist[parents[i]][tokens[i]], abs=1e-6)
        assert probs.draft[i] == pytest.approx(math.exp(draft[tree[2][i] - 1, tokens[i]]), rel=1e-5)
        kids = [c for c in range(1, budget + 1) if parents[c] == i]
        assert probs.move_on[i] == pytest.approx(sum(dist[i][tokens[c]] for c in kids), abs=1e-6)
    accepted = []
    positions = 17 + tree[2]  # a node draws the noise of its own position: its depth past the root's
    for seed in range(3000):  # walk the tree with the sampler itself: mean accepted -> expected_accepted
        picks = pick(logits, positions, DecodeConfig(temperature=1.3, seed=seed)).tolist()
        node, n = 0, 0
        while (child := next((c for c in range(1, budget + 1) if parents[c] == node and tokens[c] == picks[node]),
                             None)) is not None:
            node, n = child, n + 1
        accepted.append(n)
    assert np.mean(accepted) == pytest.approx(probs.expected_accepted, abs=4 * np.std(accepted) / math.sqrt(3000))
    assert probs.draft_expected == pytest.approx(np.exp(tree[4][1:].double().numpy()).sum(), rel=1e-6)


@pytest.mark.parametrize("kwargs, message", [({"temperature": -0.5}, "temperature=-0.5"),
                                             ({"temperature": float("nan")}, "temperature=nan"),
                                             ({"top_p": 0.0}, "top_p=0.0"), ({"top_p": 1.2}, "top_p=1.2"),
                                             ({"top_k": -1}, "top_k=-1"), ({"seed": -3}, "seed=-3")])
def test_bad_sampling_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(**kwargs)


def test_the_cli_takes_the_sampling_options_and_refuses_bad_ones(capsys):
    assert main(["verify", "--temperature", "0.9", "--top-k", "40", "--seed", "11", "--noise", "0.3"]) == 0
    assert "seed-matched exact (T=0.9, top-k 40, seed 11)" in capsys.readouterr().out
    for flag, value in (("--temperature", "-1"), ("--top-p", "0"), ("--top-k", "-2")):
        assert main(["run", flag, value]) == 2
        assert flag.removeprefix("--").replace("-", "_") in capsys.readouterr().err


def test_filtered_logits_keep_at_least_the_best_token():
    logits = torch.randn(3, 30)
    kept = torch.isfinite(filtered_logits(logits, DecodeConfig(temperature=0.5, top_p=1e-9)))
    assert kept.sum(-1).tolist() == [1, 1, 1] and kept[torch.arange(3), logits.argmax(-1)].all()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none)")
def test_cpu_and_cuda_draw_the_same_noise():
    positions = torch.randint(0, 10**6, (50,))
    assert torch.equal(uniforms(99, positions, 1000), uniforms(99, positions.cuda(), 1000).cpu())


def test_greedy_picks_need_no_positions_and_sampling_refuses_to_go_without():
    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(random.randrange(2**31)))
    assert torch.equal(pick(logits, None, DecodeConfig()), logits.argmax(-1))
    with pytest.raises(ValueError, match="needs the positions"):
        pick(logits, None, DecodeConfig(temperature=0.7))
