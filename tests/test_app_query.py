"""Shareable views (Streamlit's AppTest): the sidebar's settings live in the query parameters, a new tab opened
with them shows the same settings, and values that do not fit (or an upload, which cannot survive a reload) are
named in a notice while the defaults stand in."""
from __future__ import annotations

import math
import random

import pytest
import torch
from streamlit.testing.v1 import AppTest
from test_app import FIXTURE, ROOT, TIMEOUT, run, start
from test_drafters import ToySettings, build_toy

from engine.config import ConfigError, DecodeConfig
from engine.drafters import REGISTRY, DrafterEntry, DrafterSpec
from engine.loaders.loading import load_model
from engine.settings import options_of
from ui import query, setting_widgets, settings
from ui.safe_text import plain
from ui.settings import setting_options


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
    shown = fixture.session_state["live"].settings
    assert (shown.model, shown.config.budget, shown.drafter.noise) == (FIXTURE.name, 7, 0.25)


def link_notice(at: AppTest) -> str:
    return next(i.value for i in at.info if "link's settings" in i.value)


def refusal(opt, value: str, kept: object, ckpt) -> str:
    """How the notice names a setting's value that its widget would not hold, as shown (escaped: ui.safe_text)."""
    shown, why = settings.offered(opt, ckpt)
    return plain(f"{opt.setting.label}: {opt.key}={value!r:.60} is not {shown.expected}"
                 f"{f' ({why})' if why else ''}; kept {kept}")


def test_values_that_do_not_fit_and_uploads_are_named():
    at = open_link({"model": "copy.kdtr (0123abcd)", "budget": "5000", "dtype": "float64", "top_p": "x",
                    "block_size": "4"})
    notice = link_notice(at)
    assert "uploads do not survive a reload" in notice
    assert plain("Budget B (tree nodes): budget='5000' is not an integer in [0, 1024]; kept 64") in notice
    assert plain("Dtype: dtype='float64' is not one of float32, bfloat16; kept float32") in notice
    assert plain("Top-p: top_p='x' is not a number in (0, 1] (1: no nucleus filter); kept 1.0") in notice
    assert at.session_state["live"].settings.config == DecodeConfig(block_size=4), "the defaults stand in"


def test_every_number_past_its_widget_is_named_with_its_range_and_the_value_kept():
    """Streamlit puts a widget's least value in place of one past its bounds (a link's max new tokens became 1, its
    seed 0, silently): the link's values are held to the bounds each widget has here, the model's context and the
    browser's integers included, and every default stays."""
    ckpt = load_model(FIXTURE)
    numbers = [opt for opt in setting_options() if opt.kind in (int, float)]
    past = {}
    for opt in numbers:
        _, hi = setting_widgets.number_bounds(settings.offered(opt, ckpt)[0])
        past[opt.key] = str(hi + 1 if opt.kind is int else hi * 2)
    positions = ckpt.config.max_position_embeddings
    assert past["max_new_tokens"] == str(positions + 1) and past["sample_seed"] == str(2**53), "within the config"
    at = open_link({"model": FIXTURE.name, **past})
    notice = link_notice(at)
    for opt in numbers:
        assert refusal(opt, past[opt.key], opt.default, ckpt) in notice, opt.key
    assert f"the model's context holds {positions} positions); kept 24" in notice
    assert "[0, 9007199254740991] (the largest integer a browser holds exactly); kept 0" in notice
    live = at.session_state["live"].settings
    assert live.config == DecodeConfig() and live.drafter == DrafterSpec("oracle"), "every default kept"

    seed = next(opt for opt in numbers if opt.key == "sample_seed")
    for value in ("2**63", str(2**63), "-1", "1e3", "nan"):  # the issue's, and what the config itself refuses
        at = open_link({"model": FIXTURE.name, "max_new_tokens": "0", "sample_seed": value})
        assert refusal(seed, value, 0, ckpt) in link_notice(at), value
        assert not at.exception and at.session_state["live"].settings.config == DecodeConfig()


@pytest.mark.parametrize("page", ["app_pages/profile.py", "app_pages/compare.py", "app_pages/report.py"])
def test_an_out_of_range_seed_is_named_on_every_page(page):
    """The issue's ?sample_seed=2**63, and a top-k the config takes but the browser does not hold, opened on each
    page: named in the notice, never a traceback, never silently replaced."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    for key, value in {"model": FIXTURE.name, "sample_seed": str(2**63), "top_k": str(2**53 + 1),
                       "temperature": "0.5"}.items():
        at.query_params[key] = value
    at.session_state["profile_repeats"] = 1
    run(at.switch_page(page))
    notice = link_notice(at)
    assert "sample_seed='9223372036854775808' is not an integer in [0, 9007199254740991]" in notice
    assert "top_k='9007199254740993' is not an integer in [0, 9007199254740991]" in notice
    assert at.session_state["live"].settings.config == DecodeConfig(temperature=0.5)


def test_what_this_machine_or_model_does_not_offer_is_named_with_what_stands_in(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    at = open_link({"model": FIXTURE.name, "device": "cuda", "prompt_source": "text"})
    notice = link_notice(at)
    assert plain("Device: device='cuda' is not one of cpu (torch sees no GPU on this server); kept cpu") in notice
    assert plain("Prompt: prompt_source='text' is not one of fixture prompt, token ids (model_tiny.kdtr has no "
                 "tokenizer); kept fixture prompt") in notice
    live = at.session_state["live"].settings
    assert live.config.device == "cpu" and list(live.prompt) == load_model(FIXTURE).prompt.tolist()

    at = open_link({"prompt_source": "fixture prompt", "drafter": "nope"})  # the default model: text and its DFlash
    assert plain("Drafter: drafter='nope' is not one of oracle, dflash; kept dflash") in link_notice(at)
    assert at.sidebar.text_area(key="prompt_box").value, "a refused prompt source leaves the model's example prompt"
    assert at.session_state["live"].settings.drafter.name == "dflash", "a refused drafter leaves the model's own"


def outside(opt) -> list:
    s = opt.setting
    return [opt.kind(s.lo) if s.lo_open else opt.kind(s.lo - 1)] + ([] if s.hi is None else [opt.kind(s.hi + 1)])


def test_the_sidebar_and_the_link_take_exactly_the_widgets_ranges():
    at = start(FIXTURE.name)
    ckpt = load_model(FIXTURE)
    fields = query.fields(FIXTURE.name, ckpt)
    for opt in (o for o in options_of(DecodeConfig) if o.kind in (int, float)):
        widget = at.sidebar.number_input(key=opt.key)
        lo, hi = setting_widgets.number_bounds(settings.offered(opt, ckpt)[0])
        assert (widget.min, widget.max, widget.step) == (lo, hi, opt.setting.step), opt.name
        top = ckpt.config.max_position_embeddings if opt.name == "max_new_tokens" else opt.setting.hi
        browser = setting_widgets.MAX_SAFE_INTEGER  # an integer widget's largest (the seed's 2^63 - 1, top-k's inf)
        assert hi == (min(top or browser, browser) if opt.kind is int else top), opt.name
        assert getattr(DecodeConfig(**{opt.name: lo}), opt.name) == lo, "the widget's least value is the config's"
        assert fields[opt.key].parse(str(lo)) == lo and fields[opt.key].parse(str(hi)) == hi, opt.name
        for value in outside(opt):  # what the config refuses, the link refuses
            with pytest.raises(ConfigError):
                DecodeConfig(**{opt.name: value})
            with pytest.raises(ConfigError):
                fields[opt.key].parse(str(value))
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
    notice = link_notice(open_link({"drafter": "toy", "width": "9"}))
    assert plain("Width: width='9' is not an integer in [1, 8]; kept 2") in notice
