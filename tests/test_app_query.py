"""Shareable views (Streamlit's AppTest): the sidebar's settings live in the query parameters, a new tab opened
with them shows the same settings, and values that do not fit (or an upload, which cannot survive a reload) are
named in a notice while the defaults stand in."""
from __future__ import annotations

import math
import random

import pytest
from streamlit.testing.v1 import AppTest
from test_app import FIXTURE, ROOT, TIMEOUT, run, start
from test_drafters import ToySettings, build_toy

from engine.config import ConfigError, DecodeConfig
from engine.drafters import REGISTRY, DrafterEntry, DrafterSpec
from engine.loaders.loading import load_model
from engine.settings import options_of
from ui import query, setting_widgets


def open_link(params: dict[str, str]) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for key, value in params.items():
        at.query_params[key] = value
    return run(at)


def params_of(at: AppTest) -> dict[str, str]:
    return {key: at.query_params[key][0] if isinstance(at.query_params[key], list) else at.query_params[key]
            for key in at.query_params}


def test_a_link_reopens_the_same_settings():
    at = start(None)
    budget, temperature, seed = random.randint(1, 200), round(random.uniform(0.1, 2.0), 1), random.randrange(99)
    at.sidebar.number_input(key="budget").set_value(budget)
    at.sidebar.number_input(key="temperature").set_value(temperature)
    run(at)
    at.sidebar.number_input(key="sample_seed").set_value(seed)
    at.sidebar.text_area(key="prompt_box").set_value("import os\nprint(os.getcwd())")
    at.sidebar.radio(key="verify_tree").set_value("both")
    run(at)
    params = params_of(at)
    assert params["budget"] == str(budget) and params["temperature"] == str(temperature)
    assert params["prompt_box"] == "import os\nprint(os.getcwd())"

    again = open_link(params)
    assert again.session_state["live"].settings == at.session_state["live"].settings
    assert again.sidebar.text_area(key="prompt_box").value == "import os\nprint(os.getcwd())"
    assert not any("link's settings" in i.value for i in again.info), "nothing to report"

    fixture = open_link({"model": FIXTURE.name, "budget": "7", "drafter": "oracle", "noise": "0.25"})
    settings = fixture.session_state["live"].settings
    assert (settings.model, settings.budget, settings.drafter.noise) == (FIXTURE.name, 7, 0.25)


def test_values_that_do_not_fit_and_uploads_are_named():
    at = open_link({"model": "copy.kdtr (0123abcd)", "budget": "5000", "dtype": "float64", "top_p": "x",
                    "block_size": "4"})
    notice = next(i.value for i in at.info if "link's settings" in i.value)
    assert "uploads do not survive a reload" in notice
    assert "budget='5000' (expected an integer in [0, 1024])" in notice
    assert "dtype='float64'" in notice and "top_p='x'" in notice
    settings = at.session_state["live"].settings
    assert settings.block_size == 4 and settings.budget == 64 and settings.dtype == "float32"


def outside(opt) -> list:
    s = opt.setting
    return [opt.kind(s.lo) if s.lo_open else opt.kind(s.lo - 1)] + ([] if s.hi is None else [opt.kind(s.hi + 1)])


def test_the_sidebar_and_the_link_take_exactly_the_configs_ranges():
    at = start(FIXTURE.name)
    positions = load_model(FIXTURE).config.max_position_embeddings
    for opt in (o for o in options_of(DecodeConfig) if o.kind in (int, float)):
        widget = at.sidebar.number_input(key=opt.key)
        lo, hi = setting_widgets.number_bounds(opt)
        assert (widget.min, widget.step) == (lo, opt.setting.step), opt.name
        assert widget.max == (positions if opt.name == "max_new_tokens" else hi), opt.name
        assert getattr(DecodeConfig(**{opt.name: lo}), opt.name) == lo, "the widget's least value is the config's"
        for value in outside(opt):  # the link's parser refuses what the config refuses, in the same words
            with pytest.raises(ConfigError) as config:
                DecodeConfig(**{opt.name: value})
            with pytest.raises(ConfigError) as link:
                query.fields()[opt.key][0](str(value))
            assert str(link.value) == str(config.value)
    noise = at.sidebar.slider(key="noise")
    assert (noise.min, noise.max, noise.step) == (0.0, 1.0, 0.05)
    assert at.sidebar.number_input(key="top_p").min == math.nextafter(0.0, 1.0), "top-p is (0, 1], as configured"


def test_a_registered_drafter_gets_its_sidebar_control_and_link_parameter(monkeypatch):
    monkeypatch.setitem(REGISTRY, "toy", DrafterEntry("Random log-probabilities.", ToySettings, build_toy))
    at = open_link({"model": FIXTURE.name, "drafter": "toy", "width": "5"})
    width = at.sidebar.number_input(key="width")
    assert (width.label, width.min, width.max, width.value) == ("Width", 1, 8, 5)
    assert at.session_state["live"].settings.drafter == DrafterSpec("toy", width=5)
    assert params_of(at)["width"] == "5"
    notice = next(i.value for i in open_link({"drafter": "toy", "width": "9"}).info if "link's settings" in i.value)
    assert "width='9' (expected an integer in [1, 8])" in notice
