"""AR and DDTree decoding on the CPU: greedy-exact against the golden model and against each other."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from greedy import FLOAT32_NEAR_TIE, assert_greedy_equal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import DecodeConfig, ModelConfig
from engine.decoding.decoder import ARDecoder, DDTreeDecoder, DecodeError
from engine.decoding.session import decode, make_decoder, parse_prompt
from engine.drafters import DrafterSpec
from engine.drafters.oracle import OracleDrafter
from engine.loaders.checkpoint import Checkpoint
from engine.model import reference
from engine.model.cache import LatentCache
from engine.model.fixtures import random_weights
from engine.model.target import TargetModel
from engine.records import RunRecord, StepRecord


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def check_step_invariants(step: StepRecord, depth: int) -> None:
    tree = step.tree
    n = tree.num_nodes
    for i in range(1, n):
        p = tree.parents[i]
        assert p < i, "a parent precedes its children"
        if p >= 0:
            assert tree.depths[i] == tree.depths[p] + 1
            assert tree.scores[i] <= tree.scores[p] + 1e-6, "log-probs only fall along a path"
    closure = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            closure[i, j] = True
            j = tree.parents[j] if j > 0 else -1
    assert (tree.visibility == closure).all(), "visibility is the ancestor closure"
    assert step.path[0] == 0 and len(step.path) <= depth + 1
    for a, b in zip(step.path, step.path[1:], strict=False):
        assert tree.parents[b] == a, "the path follows parent links"
        assert tree.tokens[b] == step.target[a], "each accepted child is its parent's target"
    assert step.bonus == step.target[step.path[-1]]
    assert step.committed == [tree.tokens[b] for b in step.path[1:]] + [step.bonus]
    assert step.num_committed == step.num_accepted + 1


def check_run(run: RunRecord, decoder, depth: int) -> None:
    for step in run.steps:
        check_step_invariants(step, depth)
    produced = 1 + sum(s.num_committed for s in run.steps)
    assert int(decoder.cache.prefix_len) == len(run.prompt) + produced - 1, "cache holds all but the new root"


def test_ar_matches_golden_tokens_and_logits(tiny):
    ckpt, model = tiny
    cfg = DecodeConfig(max_new_tokens=len(ckpt.golden_tokens))
    dec = ARDecoder(model, ckpt.prompt.tolist(), cfg)
    run = dec.run()
    assert run.tokens == ckpt.golden_tokens.tolist()
    assert np.abs(run.logits - ckpt.golden_logits).max() < 1e-4
    assert all(s.num_committed == 1 for s in run.steps)
    check_run(run, dec, 0)


def test_ddtree_exact_oracle_commits_full_blocks(tiny):
    ckpt, model = tiny
    golden = ckpt.golden_tokens.tolist()
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=len(golden))
    dec = DDTreeDecoder(model, ckpt.prompt.tolist(), cfg, OracleDrafter(golden, ckpt.config.vocab_size, 7))
    run = dec.run()
    assert run.tokens == golden
    assert [s.num_committed for s in run.steps] == [8, 8, 8]
    assert run.num_committed == 25
    check_run(run, dec, 7)


def test_ddtree_with_noise_equals_ar_and_exercises_every_acceptance_kind(tiny):
    ckpt, model = tiny
    prompt = ckpt.prompt.tolist()
    ar = decode(ckpt, prompt, DecodeConfig(max_new_tokens=24), "ar", model=model).tokens
    kinds = {"partial": 0, "sibling": 0, "rejected": 0}
    for noise in (0.2, 0.5, 1.0):
        for budget in (1, 4, 16, 64):
            for seed in range(3):
                cfg = DecodeConfig(budget=budget, block_size=8, max_new_tokens=24, seed=seed)
                dec = make_decoder(ckpt, prompt, cfg, "ddtree", DrafterSpec(noise=noise, seed=seed), model=model)
                run = dec.run()
                assert run.tokens == ar, f"noise={noise} budget={budget} seed={seed}"
                check_run(run, dec, 7)
                for s in run.steps:
                    kinds["partial"] += 0 < s.num_accepted < 7
                    kinds["rejected"] += s.num_accepted == 0
                    kinds["sibling"] += any(s.tree.ranks[n] > 0 for n in s.path[1:])
    assert all(count > 0 for count in kinds.values()), kinds


small_configs = st.builds(
    dict,
    heads=st.integers(1, 3), kv_lora=st.sampled_from([8, 16]), rope=st.sampled_from([2, 4, 8]),
    q_lora=st.sampled_from([None, 12]), layers=st.integers(1, 3), dense=st.integers(0, 2),
    experts=st.sampled_from([(4, 1, 1, 1), (4, 2, 1, 2), (6, 3, 2, 2)]), interleave=st.booleans(),
    yarn=st.booleans(), norm_topk=st.booleans(),
)


def make_config(c: dict) -> ModelConfig:
    n_exp, n_group, topk_group, top_k = c["experts"]
    return ModelConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
        q_lora_rank=c["q_lora"], kv_lora_rank=c["kv_lora"], qk_nope_head_dim=8, qk_rope_head_dim=c["rope"],
        v_head_dim=8, intermediate_size=48, moe_intermediate_size=16, n_routed_experts=n_exp, n_shared_experts=1,
        num_experts_per_tok=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=2.0,
        norm_topk_prob=c["norm_topk"], first_k_dense_replace=min(c["dense"], c["layers"]),
        rope_interleave=c["interleave"], max_position_embeddings=128,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 1.0,
                      "mscale_all_dim": 1.0} if c["yarn"] else None,
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=small_configs, seed=st.integers(0, 2**16), budget=st.sampled_from([0, 1, 3, 9, 30]),
       block_size=st.integers(2, 6), noise=st.floats(0, 1))
def test_ddtree_equals_ar_on_random_models(c, seed, budget, block_size, noise):
    cfg = make_config(c)
    weights = random_weights(cfg, seed)
    prompt = np.random.default_rng(seed).integers(0, cfg.vocab_size, 5).tolist()
    ckpt = Checkpoint(cfg, weights, "random", np.array(prompt))
    model = TargetModel.from_checkpoint(ckpt)
    dcfg = DecodeConfig(budget=budget, block_size=block_size, max_new_tokens=10)
    ar = decode(ckpt, prompt, dcfg, "ar", model=model)
    golden, golden_logits = reference.greedy_generate(cfg, weights, prompt, 10)
    assert_greedy_equal(golden.tolist(), golden_logits, ar.tokens)
    dd = decode(ckpt, prompt, dcfg, "ddtree", DrafterSpec(noise=noise, seed=seed), model=model)
    assert_greedy_equal(ar.tokens, ar.logits, dd.tokens)


def test_prompt_errors(tiny):
    ckpt, model = tiny
    cfg = DecodeConfig()
    with pytest.raises(DecodeError, match=r"out of range.*\[0, 512\)"):
        ARDecoder(model, [1, 512], cfg)
    with pytest.raises(DecodeError, match="empty"):
        ARDecoder(model, [], cfg)
    with pytest.raises(DecodeError, match="max_position_embeddings"):
        ARDecoder(model, [1] * 250, cfg)
    with pytest.raises(DecodeError, match="not integers"):
        parse_prompt("1, two, 3", 512)
    assert parse_prompt(" 1,2  3 ", 512) == [1, 2, 3]


def test_step_after_done_says_so(tiny):
    ckpt, model = tiny
    dec = ARDecoder(model, ckpt.prompt.tolist(), DecodeConfig(max_new_tokens=2))
    dec.run()
    with pytest.raises(DecodeError, match="done"):
        dec.step()


def test_nan_weights_give_a_clear_error(tiny):
    ckpt, _ = tiny
    weights = dict(ckpt.numpy_weights())
    weights["model.norm.weight"] = np.full_like(weights["model.norm.weight"], np.nan)
    model = TargetModel.from_checkpoint(Checkpoint(ckpt.config, weights, "nan"))
    with pytest.raises(DecodeError, match="non-finite logits"):
        ARDecoder(model, ckpt.prompt.tolist(), DecodeConfig())


def test_nan_draft_gives_a_clear_error(tiny):
    ckpt, model = tiny
    drafter = OracleDrafter(ckpt.golden_tokens.tolist(), ckpt.config.vocab_size, 7)
    drafter.table[3, 5] = torch.nan
    dec = DDTreeDecoder(model, ckpt.prompt.tolist(), DecodeConfig(), drafter)
    with pytest.raises(DecodeError, match="step 0: the drafter returned NaN"):
        dec.run()


def test_greedy_equal_forgives_only_a_near_tie():
    rng = np.random.default_rng()
    logits = rng.normal(size=(6, 50))
    expected = logits.argmax(-1).tolist()
    at = int(rng.integers(6))
    runner_up = int(np.argsort(logits[at])[-2])
    actual = expected[:at] + [runner_up] + rng.integers(0, 50, 5 - at).tolist()
    for gap, forgiven in ((FLOAT32_NEAR_TIE / 10, True), (FLOAT32_NEAR_TIE * 10, False)):
        logits[at, runner_up] = logits[at].max() - gap
        if forgiven:
            assert_greedy_equal(expected, logits, actual)
        else:
            with pytest.raises(AssertionError, match=f"token {at}: {runner_up} where the reference chose"):
                assert_greedy_equal(expected, logits, actual)
    with pytest.raises(AssertionError, match="5 tokens, expected 6"):
        assert_greedy_equal(expected, logits, expected[:5])


def test_prompt_entries_must_be_integer_ids(tiny):
    _, model = tiny
    for bad in ([1.7, 5], ["5"], [True, 2], [np.float64(3.0)]):
        with pytest.raises(DecodeError, match="not integer token ids"):
            ARDecoder(model, bad, DecodeConfig())
    assert ARDecoder(model, [np.int64(3), 4], DecodeConfig(max_new_tokens=2)).prompt == [3, 4]
    for text in ("１,２,３", "١٢"):  # full-width and Arabic-Indic digits are not ASCII ids
        with pytest.raises(DecodeError, match="not integers"):
            parse_prompt(text, 512)


def test_rope_tables_are_sized_by_the_run_not_by_the_config(tiny):
    """A config may claim a huge context; a decode allocates only the positions it can reach."""
    ckpt, _ = tiny
    import dataclasses

    huge = dataclasses.replace(ckpt, config=dataclasses.replace(ckpt.config, max_position_embeddings=10**6))
    cfg = DecodeConfig(max_new_tokens=np.random.default_rng().integers(2, len(ckpt.golden_tokens) + 1), block_size=6)
    dec = ARDecoder(TargetModel.from_checkpoint(huge), ckpt.prompt.tolist(), cfg)
    reach = len(ckpt.prompt) + cfg.max_new_tokens + cfg.block_size
    assert dec.cache.cos.shape[0] == reach + 1 and dec.run().tokens == ckpt.golden_tokens.tolist()[: cfg.max_new_tokens]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_the_verifys_logits_in_the_models_dtype_hold_the_float32_logits_bits(device):
    """forward(float_logits=False), the decoder's verify: the lm_head's own bf16 logits, whose float32 copy is the
    default's logits bit for bit, so the greedy pick (argmax, ties to the first) is the same token."""
    seed = random.randrange(2**16)
    cfg = make_config({"layers": 2, "heads": 2, "q_lora": 16, "kv_lora": 24, "rope": 8, "experts": (4, 1, 1, 2),
                       "norm_topk": True, "dense": 1, "interleave": False, "yarn": False})
    model = TargetModel.from_checkpoint(Checkpoint(cfg, random_weights(cfg, seed), "random"), device, "bfloat16")
    tokens = torch.from_numpy(np.random.default_rng(seed).integers(0, cfg.vocab_size, 9)).to(device)
    out = {}
    for as_float in (True, False):
        cache = LatentCache(cfg.num_hidden_layers, 16, cfg.kv_lora_rank, cfg.qk_rope_head_dim, model.device,
                            model.dtype, model.rope(17))
        causal = torch.ones(9, 9, dtype=torch.bool, device=model.device).tril()
        out[as_float], _ = model.forward(tokens, torch.arange(9, device=model.device), causal, cache,
                                         float_logits=as_float)
    assert out[True].dtype == torch.float32 and out[False].dtype == torch.bfloat16
    assert torch.equal(out[False].float(), out[True])
    assert torch.equal(out[False].argmax(-1), out[True].argmax(-1))
