"""`python -m engine run`: a real decode of the tiny fixture to a report directory, and the error cases."""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import random
import subprocess
import sys

import pytest
import torch

from cli.__main__ import main
from cli.options import CliError, add_decode_args, add_drafter_args, add_model_args, decode_config, drafter_spec
from engine.config import ConfigError, DecodeConfig
from engine.drafters import REGISTRY, DrafterSpec
from engine.settings import options_of
from profiling.report import FORMATS

TINY = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"

BASE = ["run", "--fixture", str(TINY), "--max-new", "6", "--budget", "6", "--block-size", "4"]


def fill_with_sentinels(directory) -> dict[str, str]:
    directory.mkdir(exist_ok=True)
    content = {name: f"old {name} {random.random()}" for name in FORMATS}
    for name, text in content.items():
        (directory / name).write_text(text)
    return content


def assert_untouched(directory, content: dict[str, str]) -> None:
    assert {p.name: p.read_text() for p in directory.iterdir()} == content


def test_run_writes_all_five_reports(tmp_path, capsys):
    out = tmp_path / "reports"
    noise = round(random.uniform(0, 0.5), 2)
    seed = random.randrange(100)
    assert main([*BASE, "--noise", str(noise), "--drafter-seed", str(seed), "--report", str(out)]) == 0
    printed = capsys.readouterr()
    assert "speedup" in printed.out and "greedy-exact: DDTree tokens == AR tokens" in printed.out
    assert "ddtree [" in printed.err and "6/6 tokens" in printed.err
    assert sorted(p.name for p in out.iterdir()) == sorted(FORMATS)
    doc = json.loads((out / "report.json").read_text())
    summary = doc["summaries"]["ddtree"]
    assert summary["matches_ar"] and doc["config"]["drafter"]["noise"] == noise
    assert doc["config"]["drafter"]["seed"] == seed and doc["config"]["modes"] == ["ar", "ddtree"]
    assert doc["config"]["decode"]["budget"] == 6 and len(summary["tokens"]) == 6


def test_run_with_the_chain_beside_the_tree(tmp_path, capsys):
    out = tmp_path / "reports"
    assert main([*BASE, "--noise", "0.3", "--tree", "both", "--report", str(out)]) == 0
    printed = capsys.readouterr().out
    header = printed.splitlines()[0].split()
    assert header == ["AR", "chain", "DDTree"]
    assert "greedy-exact: chain tokens == AR tokens" in printed
    assert "greedy-exact: DDTree tokens == AR tokens" in printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["config"]["modes"] == ["ar", "chain", "ddtree"] and doc["primary"] == "ddtree"
    chain_steps = [s for s in doc["steps"] if s["mode"] == "chain"]
    assert chain_steps and all(len(s["tree"]["tokens"]) == 4 for s in chain_steps)  # block size 4: L + 1 nodes
    assert doc["summaries"]["chain"]["tokens"] == doc["summaries"]["ddtree"]["tokens"] == doc["runs"]["ar"]["tokens"]


def test_run_profile_and_force(tmp_path, capsys):
    out = tmp_path / "reports"
    content = fill_with_sentinels(out)
    assert main([*BASE, "--profile", "--report", str(out), "--force"]) == 0
    capsys.readouterr()
    doc = json.loads((out / "report.json").read_text())
    assert doc["capture"]["activities"] == ["cpu"]
    assert all((out / name).read_text() != old for name, old in content.items())


def test_run_without_a_report_prints_the_summary_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*BASE, "--prompt", "3, 1 4"]) == 0
    assert "tokens/s" in capsys.readouterr().out and list(tmp_path.iterdir()) == []


def test_the_summary_puts_the_new_text_tau_and_distinct_4_beside_tau(tmp_path, capsys):
    """run's table shows, per speculative mode, the tau of its steps on new text, how many steps that is and the
    distinct-4 rate, as report.json's summaries hold them (profiling.metrics), and says what they are."""
    out = tmp_path / "r"
    assert main([*BASE, "--prompt", "3, 1, 4, 1, 5", "--report", str(out)]) == 0
    printed = capsys.readouterr().out
    summaries = json.loads((out / "report.json").read_text())["summaries"]
    rows = {line[:20].strip(): line[20:].split() for line in printed.splitlines() if len(line) > 20}
    for column, summary in enumerate(summaries.values(), start=1):  # column 0 is AR's: blank on these rows
        assert rows["tau on new text"][column - 1] == f"{summary['new_text_tau']:.2f}"
        assert rows["new-text steps"][column - 1] == f"{summary['new_text_steps']}/{summary['num_steps']}"
        assert rows["distinct-4"][column - 1] == f"{summary['distinct_4gram_rate']:.2f}"
    assert "tau on new text is that of the steps" in printed


def test_existing_reports_without_force_are_left_untouched(tmp_path, capsys):
    out = tmp_path / "reports"
    content = fill_with_sentinels(out)
    assert main([*BASE, "--report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--force" in err and "report.json" in err
    assert_untouched(out, content)


@pytest.mark.parametrize("args, message", [
    (["--fixture", "/no/such/model.kdtr"], "no such file"),
    (["--model", "/no/such/dir"], "no such file or directory"),
    (["--fixture", str(TINY), "--prompt", "1,x"], "not integers"),
    (["--fixture", str(TINY), "--prompt", "99999999"], "out of range"),
    (["--fixture", str(TINY), "--noise", "1.5"], "--noise"),
    (["--fixture", str(TINY), "--drafter-seed", "-2"], "--drafter-seed"),
    (["--fixture", str(TINY), "--drafter", "oracle", "--drafter-model", "/x"],
     "--drafter oracle does not take --drafter-model"),
    (["--fixture", str(TINY), "--drafter-model", "/x"], "/x: no such directory"),  # --drafter-model means dflash
    (["--fixture", str(TINY), "--tree", "chain", "--noise", "nan"], "--noise"),
    (["--fixture", str(TINY), "--budget", "-1"], "budget"),
    (["--fixture", str(TINY), "--block-size", "1"], "block_size"),
    (["--fixture", str(TINY), "--max-new", "0"], "max_new_tokens"),
])
def test_bad_inputs_exit_2_with_a_clear_message(args, message, capsys):
    assert main(["run", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_report_path_that_is_a_file_or_under_one(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    for target, message in ((blocker, "not a directory"), (blocker / "sub", "cannot create")):
        assert main([*BASE, "--report", str(target)]) == 2
        assert message in capsys.readouterr().err
    assert blocker.read_text() == "keep"


def test_a_fixture_that_is_not_a_kdtr(tmp_path, capsys):
    bad = tmp_path / "bad.kdtr"
    bad.write_bytes(random.randbytes(64))
    assert main(["run", "--fixture", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_cuda_without_a_gpu(capsys):
    assert main([*BASE, "--device", "cuda"]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_without_a_model_the_default_model_runs(capsys):
    from cli.options import DEFAULT_MODEL

    assert main(["run", "--max-new", "3", "--budget", "4"]) == 0
    assert "greedy-exact" in capsys.readouterr().out and DEFAULT_MODEL.exists()


def test_without_plotly_the_run_works_and_reports_fail_up_front(tmp_path):
    """The GPU machine has no plotly: `run` must still import and decode; --report says what is missing."""
    code = ("import sys; sys.modules['plotly'] = None\n"
            "from cli.__main__ import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    base = [sys.executable, "-c", code, *BASE[:3], "--max-new", "3"]
    root = pathlib.Path(__file__).parent.parent
    plain = subprocess.run(base, capture_output=True, text=True, cwd=root, timeout=300)
    assert plain.returncode == 0 and "speedup" in plain.stdout, plain.stderr
    out = tmp_path / "reports"
    failed = subprocess.run([*base, "--report", str(out)], capture_output=True, text=True, cwd=root, timeout=300)
    assert failed.returncode == 2 and "report.html needs plotly" in failed.stderr
    assert not out.exists() and "speedup" not in failed.stdout  # refused before decoding


def test_model_accepts_a_kdtr_file(capsys):
    assert main(["run", "--model", str(TINY), "--max-new", "3", "--budget", "4"]) == 0
    assert "greedy-exact" in capsys.readouterr().out


def test_prompt_text_needs_a_tokenizer_and_reaches_the_reports(tiny_target_run, tmp_path, capsys):
    target, _ = tiny_target_run
    assert main(["run", "--model", str(TINY), "--prompt-text", "x = 1"]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err
    out = tmp_path / "reports"
    text = "def main():\n    return 1"
    assert main(["run", "--model", str(target), "--prompt-text", text, "--max-new", "12", "--report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"prompt: {text!r}" in printed and "AR text: " in printed
    doc = json.loads((out / "report.json").read_text())
    from engine.loaders.text import Tokenizer

    tokenizer = Tokenizer.load(target)
    ar = doc["runs"]["ar"]
    assert ar["prompt_text"] == text and ar["text"] == tokenizer.decode(ar["tokens"])
    assert doc["summaries"]["ddtree"]["text"] == ar["text"]
    steps = [s for s in doc["steps"] if s["mode"] == "ddtree"]
    assert "".join(s["committed_text"] for s in steps).startswith(tokenizer.decode(steps[0]["committed"]))
    assert main(["run", "--model", str(target), "--max-new", "4"]) == 0, "prompts.json gives the default prompt"
    from engine.loaders.loading import load_model

    assert "prompt: " + repr(load_model(target).prompt_texts[0]) in capsys.readouterr().out


def test_the_default_drafter_is_the_models_own_dflash_else_the_oracle(tmp_path):
    """Without --drafter: the DFlash directory beside the model, unless an oracle option is given."""
    from cli.options import DEFAULT_MODEL
    from engine.loaders.dflash_checkpoint import dflash_dir_beside

    parser = argparse.ArgumentParser()
    add_model_args(parser)
    add_drafter_args(parser)
    spec = drafter_spec(parser.parse_args([]))
    assert spec.name == "dflash" and spec.model == str(dflash_dir_beside(DEFAULT_MODEL))
    assert drafter_spec(parser.parse_args(["--noise", "0.2"])).name == "oracle"
    assert drafter_spec(parser.parse_args(["--model", str(TINY)])).name == "oracle"  # no DFlash beside it
    (tmp_path / "model").mkdir()  # a model directory without a drafter in it or beside it
    assert drafter_spec(parser.parse_args(["--model", str(tmp_path / "model")])).name == "oracle"
    picked = drafter_spec(parser.parse_args(["--model", str(TINY), "--drafter-model", str(tmp_path)]))
    assert picked.name == "dflash" and picked.model == str(tmp_path)


def decode_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_model_args(parser)
    add_drafter_args(parser)
    add_decode_args(parser)
    return parser


def outside(opt) -> list:
    s = opt.setting
    return [opt.kind(s.lo) if s.lo_open else opt.kind(s.lo - 1)] + ([] if s.hi is None else [opt.kind(s.hi + 1)])


@pytest.mark.parametrize("opt", [o for o in options_of(DecodeConfig) if o.kind in (int, float)], ids=lambda o: o.name)
def test_the_decode_flags_take_exactly_the_configs_range(opt, tiny_checkpoint):
    parser = decode_parser()
    assert opt.expected in " ".join(parser.format_help().split()), "the help states the range"
    for value in outside(opt):
        args = parser.parse_args(["--model", str(TINY), opt.setting.flag, str(value)])
        with pytest.raises(ConfigError) as config:
            DecodeConfig(**{opt.name: value})
        with pytest.raises(CliError) as cli:
            decode_config(args, tiny_checkpoint, tiny_checkpoint.prompt.tolist())
        assert str(cli.value) == f"{opt.setting.flag}: {config.value}"
    edge = opt.kind(opt.setting.hi if opt.setting.hi is not None else opt.setting.lo + 1)
    args = parser.parse_args(["--model", str(TINY), opt.setting.flag, str(edge)])
    assert getattr(decode_config(args, tiny_checkpoint, tiny_checkpoint.prompt.tolist()), opt.name) == edge


def test_the_decode_flags_are_the_configs_fields_with_their_defaults(tiny_checkpoint):
    args = decode_parser().parse_args(["--model", str(TINY)])
    cfg = decode_config(args, tiny_checkpoint, tiny_checkpoint.prompt.tolist())
    golden = len(tiny_checkpoint.golden_tokens)
    assert cfg == dataclasses.replace(DecodeConfig(), max_new_tokens=golden), "--max-new: the fixture's golden length"
    aliased = decode_parser().parse_args(["--model", str(TINY), "--max-new-tokens", "5", "--batch-invariant"])
    cfg = decode_config(aliased, tiny_checkpoint, [1, 2])
    assert (cfg.max_new_tokens, cfg.batch_invariant) == (5, True)
    assert cfg.batch_invariant and decode_config(args, tiny_checkpoint, [1, 2]).batch_invariant, "the CPU's default"
    off = decode_parser().parse_args(["--model", str(TINY), "--no-batch-invariant"])
    assert decode_config(off, tiny_checkpoint, [1, 2]).batch_invariant is False
    assert decode_config(decode_parser().parse_args([]), tiny_checkpoint, [1, 2]).max_new_tokens == 24


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_the_drafter_flags_take_exactly_their_settings_range(name):
    parser = decode_parser()
    for opt in (o for o in options_of(REGISTRY[name].settings) if o.kind in (int, float)):
        for value in outside(opt):
            with pytest.raises(ConfigError) as config:
                DrafterSpec(name, **{opt.name: value})
            args = parser.parse_args(["--model", str(TINY), "--drafter", name, opt.setting.flag, str(value)])
            with pytest.raises(CliError) as cli:
                drafter_spec(args)
            assert str(cli.value) == f"{opt.setting.flag}: {config.value}"


def test_run_says_its_numbers_come_from_one_run_and_repeats_give_medians(capsys):
    """One run's speedup on a busy machine can be anything (21.78x was seen): run says when it is one run; with
    --repeats the table is the median repeat's and the medians with their spread follow."""
    assert main(BASE) == 0
    single = capsys.readouterr().out
    assert "one run: the times and speedups above come from a single decode" in single
    assert "--repeats 5" in single and "repeats after one warm-up" not in single
    assert main([*BASE, "--repeats", "3"]) == 0
    repeated = capsys.readouterr().out
    assert "one run:" not in repeated
    assert "the table above is the median repeat's runs (by its DDTree time); medians over all 3 repeats" in repeated
    speedup = next(line.split() for line in repeated.splitlines() if line.startswith("DDTree speedup"))
    median, p10, p90, lo, hi = map(float, speedup[2:])
    assert lo <= p10 <= median <= p90 <= hi
