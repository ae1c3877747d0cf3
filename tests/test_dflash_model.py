"""The DFlash forward against its numpy float64 golden model (engine/model/dflash_reference.py): the first draft and
the drafts after partial accepted paths, fed synthetic hidden states and, inside a Decoder, the target's own;
and the drafter's RoPE against transformers' Qwen3 rotary embedding."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from dflash_dirs import ROPES, small_layout

from engine.config import DecodeConfig
from engine.decoding.session import make_decoder
from engine.drafters import DrafterSpec
from engine.drafters.dflash import DFlashDrafter, context_capacity
from engine.model import dflash_reference as dflash_reference
from engine.model import reference
from engine.model.dflash import DFlashWeights
from engine.model.dflash_fixtures import make_dflash_dir, random_tensors
from engine.model.rope import attention_factor, cos_sin
from engine.model.target import TargetModel

TOLERANCE = 1e-4  # float32 engine vs float64 reference, on log-probabilities


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


def reference_draft(ckpt, cfg, tensors, context: np.ndarray, root: int, block_size: int) -> np.ndarray:
    weights, target = {name: t.numpy() for name, t in tensors.items()}, ckpt.numpy_weights()
    return dflash_reference.draft_logprobs(cfg, weights, target["model.embed_tokens.weight"],
                                           target["lm_head.weight"], context, root, block_size)


@pytest.mark.parametrize("rope", list(ROPES))
def test_drafts_after_partial_accepted_paths_equal_the_reference(tiny, rope):
    ckpt, model = tiny
    cfg = small_layout(ckpt.config, rope)
    seed, block_size = random.randrange(10**6), random.randint(2, 9)
    depth = block_size - 1
    tensors = random_tensors(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    prompt_len, num_steps = random.randint(1, 12), 6
    capacity = context_capacity(prompt_len, num_steps * block_size, block_size)
    drafter = DFlashDrafter(cfg, DFlashWeights.from_tensors(cfg, tensors), model, depth, capacity, "test")
    hidden = torch.randn(prompt_len, cfg.num_context_features, generator=gen)  # any target states will do
    drafter.begin(torch.zeros(prompt_len, dtype=torch.int64), hidden)
    context = hidden.numpy()
    path_lens = [1, depth + 1] + [random.randint(1, depth + 1) for _ in range(num_steps - 2)]  # both extremes
    for path_len in path_lens:
        root = random.randrange(ckpt.config.vocab_size)
        draft = drafter.propose(torch.tensor(root), torch.tensor(0))
        assert draft.shape == (depth, ckpt.config.vocab_size) and draft.dtype == torch.float32
        want = reference_draft(ckpt, cfg, tensors, context, root, block_size)
        assert np.abs(draft.numpy() - want).max() < TOLERANCE
        num_nodes = random.randint(depth + 1, 3 * depth + 4)  # a verified tree; the path picks its nodes in order
        path = [0] + sorted(random.sample(range(1, num_nodes), path_len - 1))
        verified = torch.randn(num_nodes, cfg.num_context_features, generator=gen)
        drafter.commit(torch.tensor(path + [-1] * (depth + 1 - path_len)), torch.tensor(path_len), verified)
        context = np.concatenate([context, verified.numpy()[path]])
        assert int(drafter.model.length) == len(context)


def test_every_step_of_a_decode_drafts_what_the_reference_drafts(tiny, tmp_path):
    """Driven by a Decoder on the tiny target: each step's draft equals the reference's over the prompt and
    the committed tokens, with the golden model's hidden states of those tokens. A large tree makes accepted
    paths longer than the root (a flat draft still ranks most depth-1 tokens); a random drafter whose decode
    accepted none (about 1 in 60) is drawn again, so that the commits of accepted paths are always checked."""
    ckpt, model = tiny
    decode_cfg = DecodeConfig(budget=400, block_size=random.randint(3, 8), max_new_tokens=20)
    cfg = small_layout(ckpt.config, random.choice(list(ROPES)), block_size=decode_cfg.block_size)
    for attempt in range(5):
        seed = random.randrange(10**6)
        root = make_dflash_dir(tmp_path / f"dflash{attempt}", cfg, seed=seed)
        prompt = np.random.default_rng().integers(0, ckpt.config.vocab_size, random.randint(2, 10)).tolist()
        dec = make_decoder(ckpt, prompt, decode_cfg, "ddtree", DrafterSpec("dflash", model=str(root)), model=model)
        drafts = []
        propose = dec.drafter.propose
        dec.drafter.propose = lambda r, n, propose=propose, drafts=drafts: drafts.append(propose(r, n).clone()) \
            or drafts[-1]
        run = dec.run()
        if any(len(s.path) > 1 for s in run.steps):
            break
    sequence = prompt + run.tokens
    trace = reference.run_model(ckpt.config, ckpt.numpy_weights(), sequence)
    features = np.concatenate([trace.hidden[i] for i in cfg.target_layer_ids], axis=-1)  # [T, n * d]
    tensors = random_tensors(cfg, seed)
    num_generated = 1
    for step, draft in zip(run.steps, drafts, strict=True):
        context_len = len(prompt) + num_generated - 1  # every token before the root
        want = reference_draft(ckpt, cfg, tensors, features[:context_len], sequence[context_len],
                               decode_cfg.block_size)
        assert np.abs(draft.numpy() - want).max() < TOLERANCE, f"step {step.index}"
        num_generated += step.num_committed
    assert any(len(s.path) > 1 for s in run.steps), "some step accepted a drafted token"


@pytest.mark.parametrize("rope", list(ROPES))
def test_the_drafter_rope_is_transformers_qwen3_rope(tiny_checkpoint, rope):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    cfg = small_layout(tiny_checkpoint.config, rope)
    rs = dict(cfg.rope_scaling or {"type": "default"})
    hf_cfg = Qwen3Config(hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_attention_heads,
                         head_dim=cfg.head_dim, max_position_embeddings=cfg.max_position_embeddings,
                         rope_parameters={"rope_type": rs.pop("type"), **rs, "rope_theta": cfg.rope_theta})
    emb = Qwen3RotaryEmbedding(hf_cfg)
    num_positions = 1024
    hf_cos, hf_sin = emb(torch.zeros(1, num_positions, cfg.head_dim), torch.arange(num_positions)[None])
    cos, sin = cos_sin(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, num_positions, "cpu")  # [T, D/2]
    half = cfg.head_dim // 2
    for ours, theirs in ((cos, hf_cos[0]), (sin, hf_sin[0])):
        assert torch.allclose(theirs[:, :half], theirs[:, half:])  # rotate-half: both halves share an angle
        assert (ours - theirs[:, :half]).abs().max() < 2e-6
    assert attention_factor(cfg.rope_scaling) == pytest.approx(emb.attention_scaling, abs=1e-12)
    ref_cos, ref_sin = dflash_reference.rope_tables(cfg, num_positions)  # float64 angles: off by float32's
    assert np.abs(ref_cos - hf_cos[0, :, :half].numpy()).max() < 1e-4  # rounding of position x frequency
    assert np.abs(ref_sin - hf_sin[0, :, :half].numpy()).max() < 1e-4
