"""The block size a decode takes when none is given: the drafter's own (a DFlash checkpoint's block_size, the one it
was trained at), else DecodeConfig's default; an explicit --block-size still wins, with the mismatch warning."""
from __future__ import annotations

import argparse
import json
import pathlib
import warnings

import pytest
from dflash_dirs import small_layout
from test_drafters import ToySettings, build_toy

from cli import drafter_check, run
from cli.__main__ import main
from cli.request import request_from_args
from engine.config import DecodeConfig
from engine.drafters import REGISTRY, DrafterEntry, DrafterSpec
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.shipped import DEFAULT_MODEL
from engine.model.dflash_fixtures import make_dflash_dir

TINY = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"
NATIVE = 6  # the tests' drafter's block size: neither DecodeConfig's default nor the flags' below
DEFAULT = DecodeConfig().block_size


@pytest.fixture()
def drafter_dir(tiny_checkpoint, tmp_path) -> pathlib.Path:
    return make_dflash_dir(tmp_path / "dflash", small_layout(tiny_checkpoint.config, "plain", block_size=NATIVE))


def command_args(command, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers())
    return parser.parse_args(argv)


def block_size_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "block_size" in str(w.message)]


def test_a_drafters_native_block_size_comes_from_its_registry_entry(drafter_dir, monkeypatch):
    assert DrafterSpec("dflash", model=str(drafter_dir)).native_block_size() == NATIVE
    assert DrafterSpec("dflash", model=str(drafter_dir)).default_block_size() == NATIVE
    assert DrafterSpec("oracle", noise=0.3).native_block_size() is None
    assert DrafterSpec("oracle", noise=0.3).default_block_size() == DEFAULT == 8
    monkeypatch.setitem(REGISTRY, "toy", DrafterEntry("Random log-probabilities.", ToySettings, build_toy))
    assert DrafterSpec("toy").default_block_size() == DEFAULT, "a new drafter needs no block size of its own"


def test_left_out_the_block_size_is_the_drafters_own_and_an_explicit_one_wins(drafter_dir, tmp_path, capsys):
    flags = ["--fixture", str(TINY), "--drafter-model", str(drafter_dir), "--max-new", "6", "--budget", "6"]
    out = tmp_path / "reports"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["run", *flags, "--report", str(out)]) == 0
    assert not block_size_warnings(caught), "the drafter's own block size: nothing to warn of"
    assert json.loads((out / "report.json").read_text())["config"]["decode"]["block_size"] == NATIVE
    assert "greedy-exact: DDTree tokens == AR tokens" in capsys.readouterr().out
    assert request_from_args(command_args(run, ["run", *flags, "--block-size", "4"])).config.block_size == 4
    with pytest.warns(UserWarning, match=f"block_size 4 differs from the checkpoint's {NATIVE}"):
        assert main(["verify", *flags, "--block-size", "4"]) == 0
    assert main(["verify", "--fixture", str(TINY), "--drafter-model", str(tmp_path / "missing")]) == 2
    assert "missing: no such directory" in capsys.readouterr().err, "an unreadable drafter: the loader's error"


def test_every_command_defaults_to_its_drafters_block_size(drafter_dir):
    oracle = request_from_args(command_args(run, ["run", "--fixture", str(TINY), "--noise", "0.2"]))
    assert oracle.drafter.name == "oracle" and oracle.config.block_size == DEFAULT
    args = command_args(drafter_check, ["drafter-check", "--fixture", str(TINY), "--drafter-model", str(drafter_dir)])
    checked = request_from_args(args, DrafterSpec("dflash", model=args.drafter_model))
    assert checked.config.block_size == NATIVE
    own = json.loads((dflash_dir_beside(DEFAULT_MODEL) / "config.json").read_text())["block_size"]
    shipped = request_from_args(command_args(run, ["run", "--max-new", "4"]))
    assert shipped.drafter.name == "dflash" and shipped.config.block_size == own, "the shipped pair"


def test_the_block_size_help_names_its_default():
    subparsers = argparse.ArgumentParser().add_subparsers()
    run.register(subparsers)
    help_text = " ".join(subparsers.choices["run"].format_help().split())
    assert (f"(default: the drafter's own: a DFlash checkpoint's block_size, the one it was trained at; else "
            f"{DEFAULT})") in help_text
