"""Budget sweep: rows agree with independent decodes, progress is reported, bad budgets are refused clearly."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest

from cli.__main__ import main
from engine.config import ConfigError, DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import decode
from engine.drafters import DrafterSpec
from engine.model.target import TargetModel
from profiling.metrics import tau
from profiling.sweep import budget_sweep, format_rows, parse_budgets, ties, verdict, winner


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return TargetModel.from_checkpoint(tiny_checkpoint)


def test_rows_match_independent_decodes(tiny_checkpoint, model):
    rng = random.Random()
    budgets = rng.sample(range(0, 40), 3)
    budgets += budgets[:1]  # a duplicate is swept once
    noise, seed = rng.choice([0.0, 0.3, 0.7]), rng.randrange(1000)
    block_size = rng.randint(2, 8)
    prompt = tiny_checkpoint.prompt.tolist()
    cfg = DecodeConfig(block_size=block_size, max_new_tokens=rng.randint(8, 24))
    progress = []
    repeats = random.randint(1, 3)
    rows = budget_sweep(DecodeRequest(tiny_checkpoint, prompt, cfg, DrafterSpec(noise=noise, seed=seed)), budgets,
                        repeats, model, on_progress=lambda done, total: progress.append((done, total)))
    assert [r["budget"] for r in rows] == sorted(set(budgets))
    assert progress == [(i + 1, len(rows)) for i in range(len(rows))]
    for row in rows:
        run = decode(tiny_checkpoint, prompt, dataclasses.replace(cfg, budget=row["budget"]), "ddtree",
                     DrafterSpec(noise=noise, seed=seed), model=model)
        assert row["num_steps"] == run.num_steps
        assert row["tau"] == pytest.approx(tau(run))
        assert 1 <= row["tau"] <= min(row["budget"], block_size - 1) + 1
        assert 0 < row["ms_p10"] <= row["ms_per_token"] <= row["ms_p90"] and row["repeats"] == repeats
        assert row["tokens_per_s"] == pytest.approx(1e3 / row["ms_per_token"])


def test_exact_oracle_accepts_whole_blocks_once_the_budget_covers_a_block(tiny_checkpoint, model):
    """With the exact oracle the true chain outscores every distractor, so a step accepts min(B, L) tokens."""
    block_size = random.randint(3, 8)
    cfg = DecodeConfig(block_size=block_size, max_new_tokens=len(tiny_checkpoint.golden_tokens))
    rows = budget_sweep(DecodeRequest(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg), [1, block_size - 1, 64],
                        model=model)
    by_budget = {r["budget"]: r for r in rows}
    generated_by_steps = cfg.max_new_tokens - 1
    for budget, row in by_budget.items():
        per_step = min(budget, block_size - 1) + 1
        assert row["num_steps"] == -(-generated_by_steps // per_step)
    assert by_budget[64]["tau"] == by_budget[block_size - 1]["tau"] > by_budget[1]["tau"]


@pytest.mark.parametrize("text, message", [("", "no budgets"), ("1, x", "'x'"), ("4 2048", "'2048'"),
                                           ("-1", "'-1'")])
def test_parse_budgets_refuses_bad_text(text, message):
    with pytest.raises(ValueError, match=message):
        parse_budgets(text)


def test_parse_budgets_sorts_and_dedupes():
    budgets = random.sample(range(0, 1025), 5)
    text = " , ".join(map(str, budgets + budgets[:2]))
    assert parse_budgets(text) == sorted(budgets)


def test_sweep_refuses_bad_budgets(tiny_checkpoint, model):
    prompt = tiny_checkpoint.prompt.tolist()
    with pytest.raises(ConfigError, match="budget=-3"):
        budget_sweep(DecodeRequest(tiny_checkpoint, prompt, DecodeConfig()), [4, -3], model=model)
    with pytest.raises(ValueError, match="no budgets"):
        budget_sweep(DecodeRequest(tiny_checkpoint, prompt, DecodeConfig()), [], model=model)
    with pytest.raises(ValueError, match="repeats=0"):
        budget_sweep(DecodeRequest(tiny_checkpoint, prompt, DecodeConfig()), [4], 0, model)


def sweep_rows(medians: list[float], half_width: float, repeats: int = 3) -> list[dict]:
    return [{"budget": b, "tau": 1.0 + b / 8, "ms_per_token": ms, "ms_p10": ms - half_width, "ms_p90": ms + half_width,
             "tokens_per_s": 1e3 / ms, "num_steps": 3, "repeats": repeats} for b, ms in zip((1, 2, 4), medians,
                                                                                          strict=True)]


def test_the_fastest_is_starred_only_when_clear_of_the_spread():
    medians = random.sample([0.5, 0.7, 0.9], 3)
    best = (1, 2, 4)[medians.index(0.5)]
    clear = sweep_rows(medians, half_width=0.05)  # ranges 0.1 wide, 0.2 apart
    assert winner(clear)["budget"] == best and ties(clear) == []
    marked = [line for line in format_rows(clear).splitlines() if "<- fastest" in line]
    assert len(marked) == 1 and marked[0].split()[0] == str(best)
    assert f"fastest: B = {best}" in format_rows(clear)
    close = sweep_rows(medians, half_width=0.15)  # the 0.5 and 0.7 ranges overlap, 0.9's does not reach 0.65
    second = (1, 2, 4)[medians.index(0.7)]
    assert winner(close) is None and [r["budget"] for r in ties(close)] == [second]
    assert "<- fastest" not in format_rows(close) and f"overlaps B = {second}" in verdict(close)
    single = sweep_rows(medians, half_width=0.0, repeats=1)  # one decode: no spread, no winner
    assert winner(single) is None and "no spread" in verdict(single)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--budgets", "2, 1", "--max-new-tokens", "12", "--repeats", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["budget"] for r in data["rows"]] == [1, 2] and data["repeats"] == 2
    assert data["decode"]["max_new_tokens"] == 12
    out = capsys.readouterr().out
    assert "p10" in out and ("fastest: B = " in out or "no clear fastest" in out)


def test_cli_reports_bad_budgets(capsys):
    assert main(["sweep", "--budgets", "1, two"]) == 2
    assert "'two'" in capsys.readouterr().err


def test_parse_budgets_takes_auto_after_the_fixed_ones():
    assert parse_budgets("64, auto, 16, auto:32, auto") == [16, 64, "auto:32", "auto:256"]
    with pytest.raises(ValueError, match="'auto:0'"):
        parse_budgets("auto:0")
    with pytest.raises(ValueError, match="'auto:x'"):
        parse_budgets("auto:x")


def test_the_sweep_runs_auto_beside_the_fixed_budgets(tiny_checkpoint):
    """An auto row decodes the same prompt with --budget auto:MAX, after the fixed rows, labelled by its label."""
    cfg = DecodeConfig(max_new_tokens=16)
    request = DecodeRequest(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, DrafterSpec(noise=0.2))
    rows = budget_sweep(request, [4, "auto:16"])
    assert [r["budget"] for r in rows] == [4, "auto:16"]
    assert all(r["tau"] >= 1 and r["ms_per_token"] > 0 for r in rows)
    assert "auto:16" in format_rows(rows)
