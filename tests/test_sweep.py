"""Budget sweep: rows agree with independent decodes, progress is reported, bad budgets are refused clearly."""
from __future__ import annotations

import dataclasses
import json
import random

import pytest

from engine.__main__ import main
from engine.config import ConfigError, DecodeConfig
from engine.drafters import DrafterSpec
from engine.model import TargetModel
from engine.session import decode
from profiling.metrics import tau
from profiling.sweep import budget_sweep, format_rows, parse_budgets


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
    rows = budget_sweep(tiny_checkpoint, prompt, cfg, budgets, DrafterSpec(noise=noise, seed=seed),
                        on_progress=lambda done, total: progress.append((done, total)), model=model,
                        repeats=random.randint(1, 3))
    assert [r["budget"] for r in rows] == sorted(set(budgets))
    assert progress == [(i + 1, len(rows)) for i in range(len(rows))]
    for row in rows:
        run = decode(tiny_checkpoint, prompt, dataclasses.replace(cfg, budget=row["budget"]), "ddtree",
                     DrafterSpec(noise=noise, seed=seed), model=model)
        assert row["num_steps"] == run.num_steps
        assert row["tau"] == pytest.approx(tau(run))
        assert 1 <= row["tau"] <= min(row["budget"], block_size - 1) + 1
        assert row["ms_per_token"] > 0
        assert row["tokens_per_s"] == pytest.approx(1e3 / row["ms_per_token"])


def test_exact_oracle_accepts_whole_blocks_once_the_budget_covers_a_block(tiny_checkpoint, model):
    """With the exact oracle the true chain outscores every distractor, so a step accepts min(B, L) tokens."""
    block_size = random.randint(3, 8)
    cfg = DecodeConfig(block_size=block_size, max_new_tokens=len(tiny_checkpoint.golden_tokens))
    rows = budget_sweep(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, [1, block_size - 1, 64], model=model)
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
        budget_sweep(tiny_checkpoint, prompt, DecodeConfig(), [4, -3], model=model)
    with pytest.raises(ValueError, match="no budgets"):
        budget_sweep(tiny_checkpoint, prompt, DecodeConfig(), [], model=model)
    with pytest.raises(ValueError, match="repeats=0"):
        budget_sweep(tiny_checkpoint, prompt, DecodeConfig(), [4], model=model, repeats=0)


def test_format_rows_marks_the_fastest():
    rows = [{"budget": b, "tau": 1.0 + b / 8, "ms_per_token": ms, "tokens_per_s": 1e3 / ms, "num_steps": 3}
            for b, ms in zip((1, 2, 4), random.sample([0.5, 0.7, 0.9], 3), strict=True)]
    fastest = min(rows, key=lambda r: r["ms_per_token"])["budget"]
    marked = [line for line in format_rows(rows).splitlines() if "fastest" in line]
    assert len(marked) == 1 and marked[0].split()[0] == str(fastest)


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--budgets", "2, 1", "--max-new-tokens", "12", "--repeats", "2", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert [r["budget"] for r in data["rows"]] == [1, 2] and data["repeats"] == 2
    assert data["decode"]["max_new_tokens"] == 12
    assert "fastest" in capsys.readouterr().out


def test_cli_reports_bad_budgets(capsys):
    assert main(["sweep", "--budgets", "1, two"]) == 2
    assert "'two'" in capsys.readouterr().err
