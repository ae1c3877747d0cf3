"""`--drafter dflash --drafter-model DIR` through `python -m engine` run, sweep and verify (cli.__main__.main),
on the tiny target with a random DFlash drafter in tmp_path, and the command-line errors."""
from __future__ import annotations

import json
import pathlib

import pytest
from dflash_dirs import small_layout

from cli.__main__ import main
from engine.model.dflash_fixtures import make_dflash_dir

TINY = pathlib.Path(__file__).parents[1] / "models" / "model_tiny.kdtr"


@pytest.fixture()
def drafter_dir(tiny_checkpoint, tmp_path):
    layout = small_layout(tiny_checkpoint.config, block_size=4)
    return layout, make_dflash_dir(tmp_path / "dflash", layout)


def test_run_with_both_trees_reports_the_dflash_drafter(drafter_dir, tmp_path, capsys):
    layout, root = drafter_dir
    out = tmp_path / "reports"
    argv = ["run", "--fixture", str(TINY), "--max-new", "8", "--budget", "12", "--block-size", "4", "--drafter",
            "dflash", "--drafter-model", str(root), "--tree", "both", "--report", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for label in ("chain", "DDTree"):
        assert f"greedy-exact: {label} tokens == AR tokens" in printed
    doc = json.loads((out / "report.json").read_text())
    assert doc["config"]["modes"] == ["ar", "chain", "ddtree"]
    assert doc["config"]["drafter"] == {"name": "dflash", "model": str(root), "num_layers": 2, "block_size": 4,
                                        "target_layer_ids": list(layout.target_layer_ids),
                                        "mask_token_id": layout.mask_token_id, "hidden_size": 64}
    assert all(doc["summaries"][m]["matches_ar"] for m in ("chain", "ddtree"))


def test_sweep_and_verify_take_the_dflash_drafter(drafter_dir, tmp_path, capsys, tiny_checkpoint):
    _, root = drafter_dir
    flags = ["--fixture", str(TINY), "--block-size", "4", "--drafter", "dflash", "--drafter-model", str(root)]
    sweep_json = tmp_path / "sweep.json"
    assert main(["sweep", *flags, "--max-new", "6", "--budgets", "2 9", "--repeats", "1", "--json",
                 str(sweep_json)]) == 0
    rows = json.loads(sweep_json.read_text())
    assert [r["budget"] for r in rows["rows"]] == [2, 9] and rows["drafter"] == {"name": "dflash", "model": str(root)}
    capsys.readouterr()
    assert main(["verify", *flags, "--max-new", "10", "--tree", "both"]) == 0
    lines = capsys.readouterr().out.splitlines()
    golden = " ".join(map(str, tiny_checkpoint.golden_tokens[:10]))
    assert lines[0] == f"golden : {golden}" and lines[2] == f"chain  : {golden}" and lines[3] == f"ddtree : {golden}"
    assert lines[-1].startswith("PASS model_ddtree AR==golden and CHAIN==golden and DDTREE==golden")


def test_dflash_command_line_errors_say_what_to_do(drafter_dir, tmp_path, capsys, tiny_checkpoint):
    _, root = drafter_dir
    base = ["verify", "--fixture", str(TINY), "--max-new", "4", "--block-size", "4"]
    cases = [
        (["--drafter", "dflash"], "needs a checkpoint directory (--drafter-model DIR)"),
        (["--drafter", "dflash", "--drafter-model", str(tmp_path / "missing")], "no such directory"),
        (["--drafter", "oracle", "--drafter-model", str(root)], "does not take --drafter-model"),
        (["--drafter", "dflash", "--drafter-model", str(root), "--noise", "0.2"], "does not take --noise"),
    ]
    misfit = make_dflash_dir(tmp_path / "wide", small_layout(tiny_checkpoint.config, hidden_size=32))
    cases.append((["--drafter", "dflash", "--drafter-model", str(misfit)], "but the target's hidden_size is 64"))
    for extra, message in cases:
        assert main([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (extra, err)
