"""The drafter seam: the lifecycle a drafter sees (begin, propose, commit) with the target's hidden states, the
registry's typed spec, chain mode, and a drafter's bad output stopped where it enters the step."""
from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from cli.options import CliError, add_drafter_args, add_model_args, drafter_spec
from engine.config import ConfigError, DecodeConfig
from engine.decoding.decoder import DecodeError, Decoder
from engine.decoding.session import decode, make_decoder
from engine.drafters import REGISTRY, DrafterEntry, DrafterSpec, DraftTarget
from engine.drafters.oracle import OracleSettings
from engine.loaders.shipped import TINY_FIXTURE as TINY
from engine.model import reference
from engine.model.target import TargetModel
from engine.settings import Setting, check_fields, option, options_of
from profiling.metrics import tau


@pytest.fixture(scope="module")
def tiny(tiny_checkpoint):
    return tiny_checkpoint, TargetModel.from_checkpoint(tiny_checkpoint)


class ProbeDrafter:
    """Proposes seeded random log-probabilities and records what the decoder tells it."""

    name = "probe"

    def __init__(self, vocab_size: int, depth: int, hidden_layers: tuple[int, ...], seed: int) -> None:
        self.hidden_layers = hidden_layers
        self.vocab_size, self.depth = vocab_size, depth
        self.gen = torch.Generator().manual_seed(seed)
        self.begun: tuple | None = None
        self.commits: list[tuple] = []

    def begin(self, prompt, hidden):
        self.begun = (prompt.tolist(), None if hidden is None else hidden.clone())

    def propose(self, root, num_generated):
        logits = torch.randn(self.depth, self.vocab_size, generator=self.gen) * 3
        return logits.log_softmax(-1)

    def commit(self, path, path_len, hidden):
        self.commits.append((path.clone(), int(path_len), None if hidden is None else hidden.clone()))

    def describe(self):
        return {"name": self.name}


def test_the_drafter_sees_the_target_hidden_states_of_the_prompt_and_of_every_accepted_node(tiny):
    ckpt, model = tiny
    layers = tuple(sorted(random.sample(range(ckpt.config.num_hidden_layers), 2)))
    cfg = DecodeConfig(budget=random.randint(4, 24), block_size=random.randint(3, 6), max_new_tokens=16)
    prompt = np.random.default_rng().integers(0, ckpt.config.vocab_size, 6).tolist()
    probe = ProbeDrafter(ckpt.config.vocab_size, cfg.num_draft_positions, layers, random.randrange(1000))
    run = Decoder(model, prompt, cfg, "ddtree", probe).run()
    sequence = prompt + run.tokens
    trace = reference.run_model(ckpt.config, ckpt.numpy_weights(), sequence)
    golden = np.concatenate([trace.hidden[i] for i in layers], axis=-1)  # [T, 2 * hidden]
    seen_prompt, seen_hidden = probe.begun
    assert seen_prompt == prompt
    assert np.abs(seen_hidden.numpy() - golden[: len(prompt)]).max() < 1e-4
    position = len(prompt)  # the first root's position
    assert len(probe.commits) == run.num_steps
    for step, (path, path_len, hidden) in zip(run.steps, probe.commits, strict=True):
        assert path[:path_len].tolist() == step.path and (path[path_len:] == -1).all()
        rows = hidden[path[:path_len]].numpy()  # the accepted nodes: positions position .. position + len - 1
        assert np.abs(rows - golden[position: position + path_len]).max() < 1e-4
        position += path_len


def test_chain_verifies_the_top1_token_per_depth_and_equals_ar(tiny):
    ckpt, model = tiny
    prompt = ckpt.prompt.tolist()
    noise, seed = random.choice([0.2, 0.5, 0.8]), random.randrange(1000)
    block_size = random.randint(2, 8)
    cfg = DecodeConfig(block_size=block_size, max_new_tokens=24)
    ar = decode(ckpt, prompt, cfg, "ar", model=model)
    chain = decode(ckpt, prompt, cfg, "chain", DrafterSpec(noise=noise, seed=seed), model=model)
    assert chain.tokens == ar.tokens
    for step in chain.steps:
        tree = step.tree
        assert tree.num_nodes == block_size and tree.parents == list(range(-1, block_size - 1))
        assert tree.depths == list(range(block_size)) and set(tree.ranks) == {0}
        assert (tree.visibility == np.tri(block_size, dtype=bool)).all()
        assert all(b > a for a, b in zip(tree.scores[1:], tree.scores, strict=False))  # cumulative log-probs fall
    tree = decode(ckpt, prompt, cfg, "ddtree", DrafterSpec(noise=noise, seed=seed), model=model)
    assert tau(tree) >= tau(chain), "a tree of B >= L nodes holds the chain: it never accepts less"


def test_the_exact_oracle_is_exact_past_the_fixture_golden_tokens(tiny):
    ckpt, model = tiny
    golden = len(ckpt.golden_tokens)
    max_new = golden + random.randint(8, 30)
    cfg = DecodeConfig(budget=64, block_size=8, max_new_tokens=max_new)
    run = decode(ckpt, ckpt.prompt.tolist(), cfg, "ddtree", model=model)
    assert all(s.num_committed == 8 for s in run.steps[:-1]), [s.num_committed for s in run.steps]
    assert run.tokens == decode(ckpt, ckpt.prompt.tolist(), cfg, "ar", model=model).tokens


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "nope"}, "drafter='nope' is unknown"),
    ({"noise": 1.5}, r"noise=1.5 is out of range"),
    ({"noise": float("nan")}, "noise=nan"),
    ({"seed": -1}, "seed=-1"),
    ({"seed": True}, "seed=True"),
    ({"model": "some/dir"}, "drafter 'oracle' does not take model"),
])
def test_a_bad_spec_is_refused_naming_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DrafterSpec(**kwargs)


def test_each_drafter_declares_its_settings_with_their_metadata():
    for name, entry in REGISTRY.items():
        options = options_of(entry.settings)
        assert entry.summary and [o.name for o in options] == list(entry.fields), name
        assert all(o.setting.flag.startswith("--") and o.setting.help and o.setting.label for o in options), name
    spec = DrafterSpec(noise=0.25, seed=3)
    assert spec.options == OracleSettings(0.25, 3) and spec == DrafterSpec("oracle", OracleSettings(0.25, 3))
    assert spec.settings() == {"noise": 0.25, "seed": 3} and spec.label() == "oracle (noise 0.25, seed 3)"
    assert (spec.noise, spec.seed) == (0.25, 3)
    dflash = DrafterSpec("dflash", model="models/x/dflash")
    assert dflash.settings() == {"model": "models/x/dflash"} and dflash.label() == "dflash (models/x/dflash)"
    with pytest.raises(ConfigError, match="drafter 'dflash' takes one DFlashSettings"):
        DrafterSpec("dflash", OracleSettings())


@dataclass(frozen=True, slots=True)
class ToySettings:
    """A drafter added in a test: one settings class and one build function, nothing else."""

    width: int = option(2, Setting("how many depths the toy drafts at random", "Width", "--toy-width", lo=1, hi=8,
                                   step=1))

    def __post_init__(self) -> None:
        check_fields(self)


def build_toy(settings: ToySettings, target: DraftTarget) -> ProbeDrafter:
    return ProbeDrafter(target.model.cfg.vocab_size, target.cfg.num_draft_positions, (), settings.width)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", DrafterEntry("Random log-probabilities.", ToySettings, build_toy))


def test_a_new_drafter_is_one_settings_class_and_one_registry_line(toy, tiny):
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    add_drafter_args(parser)
    help_text = " ".join(parser.format_help().split())
    assert "{dflash,oracle,toy}" in help_text and "--toy-width TOY_WIDTH toy: how many depths" in help_text
    assert "an integer in [1, 8] (default: 2)" in help_text
    spec = drafter_spec(parser.parse_args(["--model", str(TINY), "--toy-width", "3"]))  # its flag picks it
    assert spec == DrafterSpec("toy", width=3) and spec.label() == "toy (width 3)"
    with pytest.raises(CliError, match=r"--toy-width: width=9 is out of range: expected an integer in \[1, 8\]"):
        drafter_spec(parser.parse_args(["--model", str(TINY), "--toy-width", "9"]))
    with pytest.raises(CliError, match="--drafter oracle does not take --toy-width"):
        drafter_spec(parser.parse_args(["--model", str(TINY), "--drafter", "oracle", "--toy-width", "3"]))
    with pytest.raises(ConfigError, match="drafter 'toy' does not take noise; it takes width"):
        DrafterSpec("toy", noise=0.5)
    ckpt, model = tiny
    cfg = DecodeConfig(budget=12, block_size=4, max_new_tokens=10)
    run = decode(ckpt, ckpt.prompt.tolist(), cfg, "ddtree", spec, model=model)
    assert run.tokens == decode(ckpt, ckpt.prompt.tolist(), cfg, "ar", model=model).tokens


class BadDrafter(ProbeDrafter):
    def __init__(self, vocab_size, depth, shape, dtype=torch.float32, layers=()):
        super().__init__(vocab_size, depth, layers, 0)
        self.shape, self.dtype = shape, dtype

    def propose(self, root, num_generated):
        return torch.zeros(self.shape, dtype=self.dtype)


@pytest.mark.parametrize("shape, dtype, message", [
    ((6, 512), torch.float32, r"proposed \(6, 512\) torch.float32"),
    ((7, 600), torch.float32, r"proposed \(7, 600\)"),
    ((7, 512), torch.float64, r"proposed \(7, 512\) torch.float64"),
])
def test_a_drafter_proposal_of_the_wrong_shape_or_dtype_is_a_decode_error(tiny, shape, dtype, message):
    ckpt, model = tiny
    dec = Decoder(model, ckpt.prompt.tolist(), DecodeConfig(block_size=8), "ddtree",
                  BadDrafter(512, 7, shape, dtype))
    with pytest.raises(DecodeError, match=f"step 0: drafter 'probe' {message}"):
        dec.step()


def test_a_drafter_asking_for_layers_the_target_lacks_is_refused(tiny):
    ckpt, model = tiny
    with pytest.raises(DecodeError, match=r"target layer\(s\) \[3\]"):
        Decoder(model, ckpt.prompt.tolist(), DecodeConfig(), "ddtree", ProbeDrafter(512, 7, (0, 3), 0))


def test_modes_and_drafters_must_agree(tiny):
    ckpt, model = tiny
    with pytest.raises(DecodeError, match="mode 'ar' takes no drafter"):
        Decoder(model, ckpt.prompt.tolist(), DecodeConfig(), "ar", ProbeDrafter(512, 7, (), 0))
    with pytest.raises(DecodeError, match="mode 'chain' needs a drafter"):
        Decoder(model, ckpt.prompt.tolist(), DecodeConfig(), "chain")
    with pytest.raises(DecodeError, match="mode='tree'"):
        make_decoder(ckpt, ckpt.prompt.tolist(), DecodeConfig(), "tree", model=model)
