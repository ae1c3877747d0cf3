"""profiling.expert_chart: the experts-touched rows and chart agree with the records they summarise."""
from __future__ import annotations

import random

import numpy as np

from engine.config import DecodeConfig
from engine.decoding.session import decode_runs
from engine.drafters import DrafterSpec
from profiling.expert_chart import expert_figure, expert_rows


def test_rows_and_bars_are_the_records_means(tiny_checkpoint):
    rng = random.Random()
    cfg = DecodeConfig(budget=rng.choice([8, 32, 64]), max_new_tokens=12)
    runs = decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg,
                       DrafterSpec(noise=rng.random(), seed=rng.randrange(99)), modes=("ddtree",))
    rows = {row["mode"]: row for row in expert_rows(runs)}
    assert set(rows) == {"ar", "ddtree"}
    for mode, run in runs.items():
        touched = np.mean([s.experts.touched for s in run.steps], axis=0)
        assert np.allclose(rows[mode]["touched"], touched)
        bytes_read = sum(s.experts.bytes_read for s in run.steps)
        assert np.isclose(rows[mode]["mb_per_token"] * 1e6, bytes_read / sum(s.num_committed for s in run.steps))
    k = tiny_checkpoint.config.num_experts_per_tok
    assert all(t <= k for t in rows["ar"]["touched"]), "one AR token touches at most top-k experts"
    assert rows["ddtree"]["touched_total"] >= rows["ar"]["touched_total"]
    fig = expert_figure(list(rows.values()))
    assert [trace.name for trace in fig.data] == ["AR", "DDTree"]
    assert np.allclose(fig.data[1].y, rows["ddtree"]["touched"])


def test_the_chart_names_the_moe_layers_as_the_timing_table_does(tiny_checkpoint):
    cfg = DecodeConfig(budget=random.choice([4, 16]), max_new_tokens=4)
    runs = decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, modes=("ddtree",))
    timed = {name.split("/")[2] for name in runs["ddtree"].steps[0].timings_ns if name.endswith("/moe")}
    fig = expert_figure(expert_rows(runs))
    model = tiny_checkpoint.config
    assert model.first_k_dense_replace > 0, "the fixture has a dense layer first: the two numberings differ"
    for trace in fig.data:
        assert list(trace.x) == sorted(timed, key=lambda n: int(n[5:])), "the timing ranges' layer names"
        assert len(trace.x) == model.num_hidden_layers - model.first_k_dense_replace
