"""The sidebar's settings (Streamlit's AppTest): one DecodeConfig behind them, a change named in the sidebar's own
words, the live settings locked while a recording is shown, a combination the config refuses named in the sidebar,
nothing from a link or a path rendered as markdown, and the block size following the drafter (a DFlash checkpoint's
own) unless it was set by hand or by a link."""
from __future__ import annotations

import dataclasses
import json
import random
import re
import shutil

import pytest
from dflash_dirs import small_layout
from recordings import record
from test_app import FIXTURE, ROOT, metric, press, run, start
from test_app_query import link_notice, open_link, params_of

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.shipped import DEFAULT_MODEL
from engine.model.dflash_fixtures import make_dflash_dir
from ui.settings import LOCKED, Settings

UNESCAPED_LINK = re.compile(r"(?<!\\)\]\(")  # the middle of [text](url) or ![alt](url), as markdown renders it


def test_settings_hold_one_decode_config():
    """The decode fields are written once, in DecodeConfig; Settings holds one instead of restating them."""
    restated = {f.name for f in dataclasses.fields(Settings)} & {f.name for f in dataclasses.fields(DecodeConfig)}
    assert not restated, f"Settings restates DecodeConfig's {sorted(restated)}"
    at = start()
    budget = random.randint(1, 50)
    at.sidebar.number_input(key="budget").set_value(budget)
    at.sidebar.toggle(key="auto_budget").set_value(True)
    run(at)
    assert at.session_state["live"].settings.config == DecodeConfig(budget=budget, auto_budget=True)


def test_a_change_is_named_by_the_sidebars_labels():
    at = start()
    press(at, "Step")
    at.sidebar.radio(key="verify_tree").set_value("both")
    at.sidebar.toggle(key="auto_budget").set_value(True)
    at.sidebar.slider(key="noise").set_value(0.35)
    run(at)
    notice = at.info[0].value
    assert "Verify DDTree -> chain and DDTree" in notice and "tree tree" not in notice
    assert "Auto budget (up to B) off -> on" in notice and "Noise 0.0 -> 0.35" in notice
    assert metric(at, "Steps") == "0" and "reset" in notice


def test_a_combination_the_config_refuses_is_named_in_the_sidebar():
    at = start()
    at.sidebar.number_input(key="budget").set_value(0)
    at.sidebar.toggle(key="auto_budget").set_value(True)
    run(at)
    assert any("auto_budget=True needs a budget of at least 1" in e.value for e in at.sidebar.error)
    assert any("decode configuration" in w.value for w in at.warning), "the page waits, naming why"


def sidebar_widgets(at) -> list:
    return [w for kind in ("selectbox", "radio", "text_area", "text_input", "number_input", "slider", "toggle")
            for w in at.sidebar.get(kind)]


def test_the_live_settings_are_locked_while_a_recording_is_shown(tiny_checkpoint, tmp_path):
    cfg = DecodeConfig(budget=random.randint(4, 16), max_new_tokens=8)
    _, _, path = record(tiny_checkpoint, tmp_path, cfg, DrafterSpec(noise=0.3), ("ddtree",), 1)
    at = start()
    at.sidebar.number_input(key="budget").set_value(33)
    run(at)
    assert not any(w.disabled for w in sidebar_widgets(at) if w.key in ("model", "budget", "prompt_source"))
    at.sidebar.text_input(key="report_path").set_value(str(path))
    run(at)
    live = [w for w in sidebar_widgets(at) if w.key not in ("report_path",)]
    assert live and all(w.disabled for w in live), [w.key for w in live if not w.disabled]
    assert any(c.value == LOCKED for c in at.sidebar.caption)
    assert f"B = {cfg.budget}," in next(i.value for i in at.info if i.value.startswith("**A recording**"))

    next(b for b in at.sidebar.button if b.label == "Close the recording").click()
    run(at)
    assert not any(w.disabled for w in sidebar_widgets(at) if w.key not in ("top_k", "top_p", "sample_seed"))
    assert at.session_state["live"].settings.config.budget == 33, "the live settings are back as they were"
    assert not any(c.value == LOCKED for c in at.sidebar.caption)


def shown_text(at) -> list[str]:
    """Every string the page renders as markdown: messages, captions, markdown, and every widget's label and help."""
    elements = [*at.info, *at.warning, *at.error, *at.success, *at.caption, *at.markdown]
    return [e.value for e in elements] + [text for w in sidebar_widgets(at) for text in (w.label, w.help or "")]


def test_nothing_from_a_link_or_a_path_renders_as_markdown(tmp_path):
    """A directory whose path holds an image (http:/host/x.png is an absolute URL to a browser) and a link whose
    parameters hold some: every string the page shows them in is escaped (ui.safe_text.plain)."""
    model = tmp_path / "![x](http:" / "host" / "x.png)"
    model.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "prompts.json"):
        shutil.copy(ROOT / "models" / "ddtree-py-22m" / name, model / name)
    image = "![y](http://host/y.png)"
    at = open_link({"model": str(model), "verify_tree": image, "prompt_source": image, "drafter": image})
    assert at.session_state["live"].settings.model == str(model)
    assert "verify_tree=" in link_notice(at) and "prompt_source=" in link_notice(at)
    assert str(model) in at.sidebar.text_area(key="prompt_box").help.replace("\\", ""), "the tokenizer's path"
    unescaped = [text for text in shown_text(at) if UNESCAPED_LINK.search(text)]
    assert not unescaped, unescaped
    at.sidebar.number_input(key="budget").set_value(7)
    run(at)
    assert not [text for text in shown_text(at) if UNESCAPED_LINK.search(text)]


NATIVE = 16  # the tests' drafter's block size, the shipped drafter's: not DecodeConfig's default
DEFAULT = DecodeConfig().block_size


@pytest.fixture()
def target_with_drafter(tiny_checkpoint, tmp_path):
    """A copy of the tiny fixture with a DFlash drafter trained at block size NATIVE beside it (<target>-dflash/)."""
    target = tmp_path / "tiny.kdtr"
    shutil.copy(FIXTURE, target)
    make_dflash_dir(tmp_path / "tiny-dflash", small_layout(tiny_checkpoint.config, "plain", block_size=NATIVE))
    return target


def block_size(at) -> int:
    shown = at.sidebar.number_input(key="block_size").value
    assert at.session_state["live"].settings.config.block_size == shown, "the decode takes the shown block size"
    return shown


def block_size_warnings(at) -> list[str]:
    return [w.value for w in at.sidebar.warning if "block_size" in w.value]


def test_the_shipped_pair_opens_at_its_drafters_block_size_with_no_warning():
    own = json.loads((dflash_dir_beside(DEFAULT_MODEL) / "config.json").read_text())["block_size"]
    at = start(None)
    assert at.sidebar.selectbox(key="model").value == DEFAULT_MODEL.name
    assert at.sidebar.selectbox(key="drafter").value == "dflash"
    assert block_size(at) == own and not block_size_warnings(at)


def test_the_block_size_follows_the_drafter_unless_set_by_hand(target_with_drafter):
    at = start()
    assert block_size(at) == DEFAULT, "the oracle: DecodeConfig's default"
    at.sidebar.text_input(key="model_path").set_value(str(target_with_drafter))
    run(at)
    assert at.sidebar.selectbox(key="drafter").value == "dflash"
    assert block_size(at) == NATIVE and not block_size_warnings(at), "the drafter's own, as the CLI's default"
    at.sidebar.number_input(key="block_size").set_value(12)
    run(at)
    at.sidebar.number_input(key="budget").set_value(9)
    run(at)
    assert block_size(at) == 12, "set by hand for the same drafter: it stays"
    [warning] = block_size_warnings(at)
    assert f"block_size 12 differs from the checkpoint's {NATIVE}" in warning, "and the mismatch is said"

    at.sidebar.selectbox(key="drafter").set_value("oracle")
    run(at)
    assert block_size(at) == DEFAULT and not block_size_warnings(at)
    at.sidebar.number_input(key="block_size").set_value(5)
    run(at)
    at.sidebar.slider(key="noise").set_value(0.3)
    run(at)
    assert block_size(at) == 5, "the oracle's own settings leave a block size set by hand alone"
    at.sidebar.selectbox(key="drafter").set_value("dflash")
    run(at)
    assert block_size(at) == NATIVE, "the drafter chosen again: its own"

    at.sidebar.selectbox(key="model").set_value(FIXTURE.name)  # another target, no drafter beside it
    run(at)
    assert at.sidebar.selectbox(key="drafter").value == "oracle" and block_size(at) == DEFAULT
    at.sidebar.selectbox(key="model").set_value(str(target_with_drafter))
    run(at)
    assert block_size(at) == NATIVE and not block_size_warnings(at)


def test_a_reload_keeps_a_block_size_set_by_hand(target_with_drafter):
    at = open_link({"model": str(target_with_drafter)})
    assert block_size(at) == NATIVE and not block_size_warnings(at)
    at.sidebar.number_input(key="block_size").set_value(5)
    run(at)
    reopened = open_link(params_of(at))
    assert reopened.sidebar.selectbox(key="drafter").value == "dflash"
    assert block_size(reopened) == 5, "the link's block size, not the drafter's own"
    assert f"block_size 5 differs from the checkpoint's {NATIVE}" in block_size_warnings(reopened)[0]
