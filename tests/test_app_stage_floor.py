"""The Profile page's stages against their bytes floor (ui/stage_floor_panel.py), on a recording of the tiny fixture
(AppTest): every stage with its time, bytes, floor and time / floor, at the bandwidth measured here or typed."""
from __future__ import annotations

import random

import pytest
from recordings import record
from test_app import run, start
from test_app_recording import open_path

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from profiling.bandwidth import copy_bandwidth
from profiling.stage_floor import FloorModel


@pytest.fixture(scope="module")
def recorded(tiny_checkpoint, tmp_path_factory):
    cfg = DecodeConfig(budget=random.randint(4, 12), block_size=4, max_new_tokens=8)
    return record(tiny_checkpoint, tmp_path_factory.mktemp("recording"), cfg, DrafterSpec(noise=0.3), ("ddtree",), 1)


def floors_table(at):
    return next(d.value for d in at.dataframe if "time/floor" in d.value.columns)


def test_the_profile_page_shows_each_stage_against_its_floor(recorded):
    _, runs, path = recorded
    at = start()
    open_path(at, path)
    run(at.switch_page("app_pages/profile.py"))
    table = floors_table(at)
    assert list(table.columns) == ["stage", "steps", "ms/step", "MB read", "floor ms", "time/floor"]
    stages = [s.strip() for s in table["stage"]]
    assert stages[:3] == ["draft", "draft_update", "tree_build"] and {"verify", "attn", "ffn", "lm_head"} <= set(stages)
    here = copy_bandwidth("cpu", "float32")
    assert at.number_input(key="floor_bandwidth_gbps").value == pytest.approx(here.bytes_per_s / 1e9, abs=1e-3)
    verify = table[table["stage"] == "verify"].iloc[0]
    steps = runs["ddtree"].steps
    expected = sum(FloorModel.of_run(runs["ddtree"]).step_bytes(s)["verify"] for s in steps) / len(steps)
    assert verify["MB read"] * 1e6 == pytest.approx(expected)
    assert verify["time/floor"] == pytest.approx(verify["ms/step"] / verify["floor ms"])
    at.number_input(key="floor_bandwidth_gbps").set_value(2.0)
    run(at)
    verify = floors_table(at).query("stage == 'verify'").iloc[0]
    assert verify["floor ms"] == pytest.approx(expected / 2e9 * 1e3)
    assert any("as typed" in c.value and "A recording" in c.value for c in at.caption)
