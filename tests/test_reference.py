"""Invariants of the numpy golden model (engine/model/reference.py) and the committed tiny fixture."""
from __future__ import annotations

import ast
import dataclasses
import pathlib

import numpy as np
import pytest

from engine.loaders.kdtr import encode_kdtr
from engine.model import reference
from engine.model.fixtures import make_fixture, random_weights, tiny_config
from engine.model.reference import forward_logits, greedy_generate, route, run_model
from engine.model.weights import weight_shapes

TINY_FIXTURE = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
        "mscale_all_dim": 0.7, "beta_fast": 32, "beta_slow": 1}


def _model(seed: int, **overrides):
    cfg = dataclasses.replace(tiny_config(), **overrides)
    return cfg, random_weights(cfg, seed)


def _tokens(cfg, rng: np.random.Generator, length: int) -> list[int]:
    return rng.integers(0, cfg.vocab_size, size=length).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_causality_later_tokens_do_not_change_earlier_logits(seed):
    cfg, w = _model(seed)
    rng = np.random.default_rng(100 + seed)
    tokens = _tokens(cfg, rng, 12)
    t = int(rng.integers(0, 11))
    changed = tokens[:t + 1] + _tokens(cfg, rng, 11 - t)
    a, b = forward_logits(cfg, w, tokens), forward_logits(cfg, w, changed)
    np.testing.assert_allclose(a[:t + 1], b[:t + 1], rtol=0, atol=1e-12)
    assert np.abs(a[t + 1:] - b[t + 1:]).max() > 1e-3  # the later positions do see the change
    np.testing.assert_allclose(forward_logits(cfg, w, tokens[:t + 1]), a[:t + 1], rtol=0, atol=1e-12)


def _interleave_to_half_weights(cfg, weights):
    """Weights under which rope_interleave=False computes what rope_interleave=True computes with `weights`.

    Interleaved RoPE reads the rope dims in the order evens-then-odds before rotating halves, so permuting the
    output rows that produce q_pe (per head) and k_pe by that order bakes the permutation into the weights."""
    perm = np.concatenate([np.arange(0, cfg.qk_rope_head_dim, 2), np.arange(1, cfg.qk_rope_head_dim, 2)])
    out = dict(weights)
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}.self_attn"
        q_name = f"{p}.q_proj.weight" if cfg.q_lora_rank is None else f"{p}.q_b_proj.weight"
        q = weights[q_name].reshape(cfg.num_attention_heads, cfg.qk_head_dim, -1).copy()
        q[:, cfg.qk_nope_head_dim:] = q[:, cfg.qk_nope_head_dim:][:, perm]
        out[q_name] = q.reshape(weights[q_name].shape)
        kv = weights[f"{p}.kv_a_proj_with_mqa.weight"].copy()
        kv[cfg.kv_lora_rank:] = kv[cfg.kv_lora_rank:][perm]
        out[f"{p}.kv_a_proj_with_mqa.weight"] = kv
    return out


@pytest.mark.parametrize("overrides", [{}, {"q_lora_rank": None}, {"rope_scaling": YARN}])
def test_rope_layouts_differ_and_are_a_weight_permutation_apart(overrides):
    cfg, w = _model(3, **overrides)
    tokens = _tokens(cfg, np.random.default_rng(4), 10)
    interleaved = forward_logits(cfg, w, tokens)
    half_cfg = dataclasses.replace(cfg, rope_interleave=False)
    assert np.abs(forward_logits(half_cfg, w, tokens) - interleaved).max() > 1e-3
    permuted = forward_logits(half_cfg, _interleave_to_half_weights(cfg, w), tokens)
    np.testing.assert_allclose(permuted, interleaved, rtol=0, atol=1e-10)


def test_yarn_changes_logits_only_through_rope_and_scale(monkeypatch):
    cfg, w = _model(5)
    yarn_cfg = dataclasses.replace(cfg, rope_scaling=YARN)
    tokens = _tokens(cfg, np.random.default_rng(6), 20)
    plain, yarn = forward_logits(cfg, w, tokens), forward_logits(yarn_cfg, w, tokens)
    assert np.abs(plain - yarn).max() > 1e-3
    # Swap YaRN's RoPE tables and softmax scale into the plain model: everything else must already agree.
    yarn_tables, yarn_scale = reference.rope_tables, reference.softmax_scale(yarn_cfg)
    monkeypatch.setattr(reference, "rope_tables", lambda _cfg, n: yarn_tables(yarn_cfg, n))
    monkeypatch.setattr(reference, "softmax_scale", lambda _cfg: yarn_scale)
    np.testing.assert_allclose(forward_logits(cfg, w, tokens), yarn, rtol=0, atol=1e-12)


def test_yarn_with_factor_one_is_plain_rope():
    cfg, w = _model(7)
    tokens = _tokens(cfg, np.random.default_rng(8), 16)
    unit = dataclasses.replace(cfg, rope_scaling={**YARN, "factor": 1.0})
    np.testing.assert_allclose(forward_logits(unit, w, tokens), forward_logits(cfg, w, tokens), rtol=0, atol=1e-12)


def test_yarn_without_rope_queries_changes_only_the_softmax_scale():
    cfg, w = _model(9)
    w = dict(w)
    for layer in range(cfg.num_hidden_layers):  # zero the rows producing q_pe: RoPE can no longer matter
        name = f"model.layers.{layer}.self_attn.q_b_proj.weight"
        q = w[name].reshape(cfg.num_attention_heads, cfg.qk_head_dim, -1).copy()
        q[:, cfg.qk_nope_head_dim:] = 0
        w[name] = q.reshape(w[name].shape)
    tokens = _tokens(cfg, np.random.default_rng(10), 12)
    plain = forward_logits(cfg, w, tokens)
    no_mscale = {k: v for k, v in YARN.items() if k != "mscale_all_dim"}
    same = forward_logits(dataclasses.replace(cfg, rope_scaling=no_mscale), w, tokens)
    np.testing.assert_allclose(same, plain, rtol=0, atol=1e-12)
    assert np.abs(forward_logits(dataclasses.replace(cfg, rope_scaling=YARN), w, tokens) - plain).max() > 1e-3


def test_yarn_keeps_high_frequencies_and_interpolates_low_ones():
    cfg = dataclasses.replace(tiny_config(), qk_rope_head_dim=64, rope_scaling={
        "type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096})
    base_inv_freq, _ = reference.rope_frequencies(dataclasses.replace(cfg, rope_scaling=None))
    inv_freq, attention_factor = reference.rope_frequencies(cfg)
    assert inv_freq[0] == base_inv_freq[0]
    assert inv_freq[-1] == pytest.approx(base_inv_freq[-1] / 40.0, rel=1e-12)
    ratio = inv_freq / base_inv_freq
    assert np.all(np.diff(ratio) <= 1e-12) and ratio.min() == pytest.approx(1 / 40.0)
    assert attention_factor == pytest.approx(0.1 * np.log(40.0) + 1.0)


M1, M07 = 0.1 * np.log(4) + 1, 0.07 * np.log(4) + 1  # YaRN's mscale(factor=4) with mscale 1 and 0.7


@pytest.mark.parametrize(("scaling", "want_attention_factor", "want_scale_factor"), [
    ({"mscale": 1.0, "mscale_all_dim": 0.7}, M1 / M07, M07**2),
    ({"mscale": 1.0, "mscale_all_dim": 1.0}, 1.0, M1**2),  # DeepSeek-V3's own setting
    ({"mscale_all_dim": 1.0}, M1, M1**2),
    ({}, M1, 1.0),
    ({"attention_factor": 0.9}, 0.9, 1.0),
])
def test_yarn_attention_factor_and_softmax_scale(scaling, want_attention_factor, want_scale_factor):
    cfg = dataclasses.replace(tiny_config(), rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, **scaling})
    cos, sin = reference.rope_tables(cfg, 50)
    np.testing.assert_allclose(cos**2 + sin**2, want_attention_factor**2, rtol=1e-12)
    assert reference.softmax_scale(cfg) == pytest.approx(cfg.qk_head_dim ** -0.5 * want_scale_factor, rel=1e-12)


def _brute_force_route(cfg, x, gate, bias):
    """One token at a time, with Python sorting: the experts and weights the routing rule defines."""
    per_group = cfg.n_routed_experts // cfg.n_group
    experts, weights = [], []
    for logits in x @ gate.T:
        if cfg.scoring_func == "softmax":
            scores = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        else:
            scores = 1 / (1 + np.exp(-logits))
        biased = scores + bias
        group_score = [sum(sorted(biased[g * per_group:(g + 1) * per_group])[-2:]) for g in range(cfg.n_group)]
        kept = sorted(range(cfg.n_group), key=lambda g: (-group_score[g], g))[:cfg.topk_group]
        allowed = [e for e in range(cfg.n_routed_experts) if e // per_group in kept]
        chosen = sorted(allowed, key=lambda e: (-biased[e], e))[:cfg.num_experts_per_tok]
        wts = scores[chosen] / (scores[chosen].sum() + 1e-20) if cfg.norm_topk_prob else scores[chosen]
        experts.append(chosen)
        weights.append(wts * cfg.routed_scaling_factor)
    return np.array(experts), np.array(weights)


@pytest.mark.parametrize("shape", [(8, 2, 1, 2), (16, 4, 2, 3), (12, 3, 3, 4), (6, 6, 2, 2)])
@pytest.mark.parametrize("scoring_func", ["sigmoid", "softmax"])
@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_routing_matches_the_group_limited_rule(shape, scoring_func, norm_topk_prob):
    num_experts, n_group, topk_group, k = shape
    cfg = dataclasses.replace(tiny_config(), n_routed_experts=num_experts, n_group=n_group, topk_group=topk_group,
                              num_experts_per_tok=k, scoring_func=scoring_func, norm_topk_prob=norm_topk_prob)
    rng = np.random.default_rng(num_experts * 7 + k)
    x, gate = rng.standard_normal((40, 64)), rng.standard_normal((num_experts, 64)) / 8
    bias = 0.3 * rng.standard_normal(num_experts)  # large enough to change the selection
    experts, weights = route(cfg, x, gate, bias)
    want_experts, want_weights = _brute_force_route(cfg, x, gate, bias)
    np.testing.assert_array_equal(experts, want_experts)
    np.testing.assert_allclose(weights, want_weights, rtol=1e-12)
    groups = experts // (num_experts // n_group)
    assert all(len(set(row)) <= topk_group for row in groups.tolist())
    unbiased, _ = route(cfg, x, gate, np.zeros(num_experts))
    assert (unbiased != experts).any()  # the bias steers the selection


def test_routing_ties_break_toward_lower_index():
    cfg = dataclasses.replace(tiny_config(), n_routed_experts=12, n_group=4, topk_group=2, num_experts_per_tok=3)
    experts, weights = route(cfg, np.ones((3, 64)), np.zeros((12, 64)), np.zeros(12))  # every score is 0.5
    np.testing.assert_array_equal(experts, [[0, 1, 2]] * 3)
    np.testing.assert_allclose(weights, cfg.routed_scaling_factor / 3)


def test_norm_topk_prob_normalises_the_weights():
    rng = np.random.default_rng(11)
    x, gate, bias = rng.standard_normal((30, 64)), rng.standard_normal((8, 64)) / 8, 0.05 * rng.standard_normal(8)
    cfg = tiny_config()
    normed_experts, normed = route(cfg, x, gate, bias)
    raw_experts, raw = route(dataclasses.replace(cfg, norm_topk_prob=False), x, gate, bias)
    np.testing.assert_array_equal(normed_experts, raw_experts)
    np.testing.assert_allclose(normed.sum(axis=1), cfg.routed_scaling_factor, rtol=1e-12)
    np.testing.assert_allclose(normed, raw / raw.sum(axis=1, keepdims=True) * cfg.routed_scaling_factor, rtol=1e-12)
    assert np.abs(raw.sum(axis=1) - cfg.routed_scaling_factor).max() > 0.1


def _perturbed(weights, name, seed):
    out = dict(weights)
    out[name] = weights[name] + np.random.default_rng(seed).standard_normal(weights[name].shape).astype(np.float32)
    return out


def test_dense_layers_use_the_mlp_and_moe_layers_only_their_chosen_experts():
    cfg, w = _model(12)
    tokens = _tokens(cfg, np.random.default_rng(13), 2)  # 2 tokens x 2 experts: most experts unused
    trace = run_model(cfg, w, tokens)
    assert sorted(trace.routed) == list(range(cfg.first_k_dense_replace, cfg.num_hidden_layers))
    dense = forward_logits(cfg, _perturbed(w, "model.layers.0.mlp.up_proj.weight", 1), tokens)
    assert np.abs(dense - trace.logits).max() > 1e-3
    layer = cfg.num_hidden_layers - 1  # the last layer: its routing cannot be changed by its own experts
    used = set(trace.routed[layer].ravel().tolist())
    unused = sorted(set(range(cfg.n_routed_experts)) - used)
    assert unused, "two tokens cannot use all eight experts"
    for e, should_change in ((unused[0], False), (min(used), True)):
        logits = forward_logits(cfg, _perturbed(w, f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight", e), tokens)
        assert (np.abs(logits - trace.logits).max() > 1e-3) == should_change
    shared = forward_logits(cfg, _perturbed(w, f"model.layers.{layer}.mlp.shared_experts.up_proj.weight", 2), tokens)
    assert np.abs(shared - trace.logits).max() > 1e-3


def test_all_dense_model_has_no_experts_and_runs():
    cfg, w = _model(14, first_k_dense_replace=3)
    assert not any(".experts." in name for name in w)
    trace = run_model(cfg, w, _tokens(cfg, np.random.default_rng(15), 5))
    assert trace.routed == {} and np.isfinite(trace.logits).all()


def test_greedy_generate_is_the_argmax_of_the_full_forward():
    cfg, w = _model(16)
    prompt = _tokens(cfg, np.random.default_rng(17), 5)
    tokens, logits = greedy_generate(cfg, w, prompt, 10)
    assert tokens.dtype == np.int64 and tokens.shape == (10,) and logits.shape == (10, cfg.vocab_size)
    full = forward_logits(cfg, w, prompt + tokens.tolist())
    np.testing.assert_allclose(logits, full[len(prompt) - 1:-1], rtol=0, atol=1e-12)
    np.testing.assert_array_equal(tokens, full[len(prompt) - 1:-1].argmax(axis=1))


def test_bad_inputs_raise_clear_errors():
    cfg, w = _model(18)
    with pytest.raises(ValueError, match="out of range"):
        forward_logits(cfg, w, [0, cfg.vocab_size])
    with pytest.raises(ValueError, match="non-empty"):
        forward_logits(cfg, w, [])
    with pytest.raises(ValueError, match="max_position_embeddings"):
        forward_logits(cfg, w, [1] * (cfg.max_position_embeddings + 1))
    missing = {k: v for k, v in w.items() if k != "model.norm.weight"}
    with pytest.raises(ValueError, match="model.norm.weight"):
        forward_logits(cfg, missing, [1, 2])
    with pytest.raises(ValueError, match="num_new"):
        greedy_generate(cfg, w, [1, 2], 0)


def test_fixture_regenerates_byte_identical():
    assert encode_kdtr(make_fixture(seed=0)) == TINY_FIXTURE.read_bytes()


def test_fixture_is_a_useful_test_model(tiny_checkpoint):
    ckpt = tiny_checkpoint
    assert set(ckpt.weights.names()) == set(weight_shapes(ckpt.config))
    logits = ckpt.golden_logits.astype(np.float64)
    top2 = np.sort(logits, axis=1)[:, -2:]
    assert logits.std(axis=1).min() > 1.0  # peaked, not flat
    assert (top2[:, 1] - top2[:, 0]).min() > 1e-3  # float32 models reproduce every golden argmax
    assert len(set(ckpt.golden_tokens.tolist())) > len(ckpt.golden_tokens) // 2  # no single repeated token


def test_reference_shares_no_code_with_the_torch_model():
    tree = ast.parse(pathlib.Path(reference.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert imported <= {"__future__", "math", "collections.abc", "dataclasses", "numpy", "engine.config",
                        "engine.model.weights"}
