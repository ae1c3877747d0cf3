"""Under AppTest: the Profile page decodes nothing until a button asks; a measurement and a sweep run in the
background with their progress, and Stop ends them with nothing kept; the speed badge's arrow follows the speedup."""
from __future__ import annotations

import dataclasses
import time

from streamlit.testing.v1 import AppTest
from test_app import press, run, start
from test_app import wait_for_job as finish

from engine.config import DecodeConfig
from engine.decoding.session import decode_runs
from profiling.measurement import Measurement
from profiling.sweep import QUICK_BUDGETS, QUICK_REPEATS
from ui import profile_jobs

PROFILE = "app_pages/profile.py"
JOB_TIMEOUT = 600


def test_nothing_is_measured_before_the_button_then_measure_takes_the_repeats():
    at = run(start().switch_page(PROFILE))
    assert at.session_state["live"].measurement is None, "opening the page decodes nothing"
    assert at.session_state[profile_jobs.KEY] is None and not at.metric
    assert any(i.value.startswith("Nothing measured yet") for i in at.info)
    assert any(c.value.startswith("No estimate yet") for c in at.caption)
    at.number_input(key="profile_repeats").set_value(2)
    press(at, "Measure")
    assert at.session_state[profile_jobs.KEY].job.plan.units == 2
    finish(at)
    measured = at.session_state["live"].measurement
    assert measured is not None and measured.repeats.count == 2
    assert at.session_state[profile_jobs.KEY] is None, "the result was handed over"
    assert [b.label for b in at.button if b.key == "profile_measure"] == ["Measure again"]
    at.number_input(key="profile_repeats").set_value(4)
    run(at)
    assert at.session_state["live"].measurement is measured, "a new count waits for the button"
    estimate = next(c.value for c in at.caption if c.value.startswith("About "))
    assert "for 4 repeat(s), at the pace of the last measurement" in estimate


def test_stop_ends_a_measurement_and_keeps_nothing():
    at = run(start().switch_page(PROFILE))
    at.number_input(key="profile_repeats").set_value(50)
    press(at, "Measure")
    running = at.session_state[profile_jobs.KEY]
    assert next(b for b in at.button if b.key == "stop_measure").label == "Stop"
    assert next(b for b in at.button if b.key == "profile_measure").disabled, "one job at a time"
    at.button(key="stop_measure").click()
    run(at)
    assert running.job.join(JOB_TIMEOUT)
    run(at)
    assert running.job.stopped and running.job.units < 50
    assert at.session_state["live"].measurement is None and at.session_state[profile_jobs.KEY] is None
    assert any(w.value.startswith("Stopped after") for w in at.warning)


def test_the_quick_sweep_runs_in_the_background_and_stop_ends_a_long_one():
    at = run(start().switch_page(PROFILE))
    assert at.text_input(key="sweep_budgets").value == ", ".join(map(str, QUICK_BUDGETS))
    assert at.number_input(key="sweep_repeats").value == QUICK_REPEATS
    began = time.monotonic()
    press(at, "Run sweep")
    finish(at)
    print(f"the quick sweep ({QUICK_BUDGETS} x {QUICK_REPEATS}) took {time.monotonic() - began:.1f} s")
    rows = at.session_state["live"].sweep
    assert [r["budget"] for r in rows] == list(QUICK_BUDGETS) and all(r["repeats"] == QUICK_REPEATS for r in rows)
    at.text_input(key="sweep_budgets").set_value("1 2 4 8 16 32 64 128 256 512 1024")
    at.number_input(key="sweep_repeats").set_value(20)
    press(at, "Run sweep")
    at.button(key="stop_sweep").click()
    run(at)
    finish(at)
    assert at.session_state["live"].sweep is rows, "a stopped sweep keeps nothing"
    assert any(w.value.startswith("Stopped after") for w in at.warning)


def _badges(measurement):  # AppTest runs its source alone: no names from this module
    from ui import profile_measure
    profile_measure.badges(measurement)


def test_the_badge_points_down_for_a_slowdown_and_up_for_a_speedup(tiny_checkpoint):
    runs = decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), DecodeConfig(max_new_tokens=4))
    real = Measurement.of(runs)
    for speedup, direction, colour in ((0.55, "DOWN", "RED"), (1.8, "UP", "GREEN")):
        modes = {m: dict(row) for m, row in real.repeats.modes.items()}
        modes["ddtree"]["speedup"] = {**modes["ddtree"]["speedup"], "median": speedup}
        shown = dataclasses.replace(real, repeats=dataclasses.replace(real.repeats, modes=modes))
        at = AppTest.from_function(_badges, args=(shown,))
        at.run()
        assert not at.exception, at.exception
        badge = next(m for m in at.metric if m.label == "DDTree tokens/s")
        assert badge.delta.startswith(f"{speedup:.2f}x speedup")
        assert type(badge.proto).MetricDirection.Name(badge.proto.direction) == direction
        assert type(badge.proto).MetricColor.Name(badge.proto.color) == colour
