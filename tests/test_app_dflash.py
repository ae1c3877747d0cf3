"""The dashboard with the dflash drafter (Streamlit's AppTest): the checkpoint box filled from the directory beside
the target, a bad or misfitting checkpoint shown with the loader's message while decoding waits, a decode with
the drafter, and the Profile page's drafter-health panel against the engine's checks."""
from __future__ import annotations

import shutil

import pytest
from dflash_dirs import small_layout
from test_app import FIXTURE, metric, press, run, shown_tokens, start

from engine.model.dflash_fixtures import make_dflash_dir
from engine.model.target import TargetModel
from profiling.drafter_health import check_drafter


@pytest.fixture()
def target_with_drafter(tiny_checkpoint, tmp_path):
    """A copy of the tiny fixture with a random DFlash drafter beside it (<target>-dflash/)."""
    target = tmp_path / "tiny.kdtr"
    shutil.copy(FIXTURE, target)
    layout = small_layout(tiny_checkpoint.config, "plain", target_layer_ids=(0, 1, 2))
    return target, make_dflash_dir(tmp_path / "tiny-dflash", layout)


def load_target(at, path) -> None:
    at.sidebar.text_input(key="model_path").set_value(str(path))
    run(at)
    assert at.sidebar.selectbox(key="model").value == str(path)


def choose_dflash(at) -> None:
    at.sidebar.selectbox(key="drafter").set_value("dflash")
    run(at)


def test_the_drafter_beside_the_target_is_filled_in_and_decodes(tiny_checkpoint, target_with_drafter):
    target, drafter = target_with_drafter
    at = start()
    load_target(at, target)
    assert at.sidebar.selectbox(key="drafter").value == "dflash", "a target with a drafter beside it: that drafter"
    assert at.sidebar.text_input(key="drafter_model").value == str(drafter)
    assert not at.sidebar.error and not at.sidebar.warning
    press(at, "Step")
    decoder = at.session_state["live"].decoder
    assert decoder.drafter.name == "dflash" and decoder.drafter.source == str(drafter)
    press(at, "Run to end")
    assert shown_tokens(at) == tiny_checkpoint.golden_tokens.tolist(), "greedy-exact with the learned drafter"

    at.sidebar.selectbox(key="model").set_value("model_tiny.kdtr")  # no drafter beside the bundled fixture
    run(at)
    assert at.sidebar.selectbox(key="drafter").value == "oracle", "a target without a drafter beside it: the oracle"
    choose_dflash(at)
    assert at.sidebar.text_input(key="drafter_model").value == "", "the filled-in directory went with its target"
    assert "needs a checkpoint directory" in at.sidebar.error[0].value


def test_a_bad_or_misfitting_checkpoint_shows_the_loaders_message_and_decoding_waits(tiny_checkpoint, tmp_path):
    at = start()
    choose_dflash(at)
    assert "needs a checkpoint directory" in at.sidebar.error[0].value
    at.sidebar.text_input(key="drafter_model").set_value(str(tmp_path / "missing"))
    run(at)
    assert at.sidebar.error[0].value.startswith("Drafter: ") and "no such directory" in at.sidebar.error[0].value
    assert not at.button, "no decode while the drafter is bad"
    wide = make_dflash_dir(tmp_path / "wide", small_layout(tiny_checkpoint.config, hidden_size=32))
    at.sidebar.text_input(key="drafter_model").set_value(str(wide))
    run(at)
    assert "hidden_size=32, but the target's hidden_size is 64" in at.sidebar.error[0].value and not at.button
    good = make_dflash_dir(tmp_path / "good", small_layout(tiny_checkpoint.config, block_size=6))
    at.sidebar.text_input(key="drafter_model").set_value(str(good))
    run(at)
    assert not at.sidebar.error and not at.sidebar.warning, "the block size took the checkpoint's"
    assert at.sidebar.number_input(key="block_size").value == 6
    at.sidebar.number_input(key="block_size").set_value(8)
    run(at)
    assert "block_size 8 differs from the checkpoint's 6" in at.sidebar.warning[0].value
    at.sidebar.number_input(key="block_size").set_value(6)
    run(at)
    assert not at.sidebar.warning
    press(at, "Step")
    assert metric(at, "Steps") == "1"


def test_the_profile_page_checks_the_drafters_health(tiny_checkpoint, target_with_drafter):
    target, drafter = target_with_drafter
    at = start()
    run(at.switch_page("app_pages/profile.py"))
    assert not any(b.label == "Check the drafter" for b in at.button), "the panel is the dflash drafter's"
    load_target(at, target)
    choose_dflash(at)
    press(at, "Check the drafter")
    shown = at.dataframe[-1].value
    settings = at.session_state["live"].settings
    model = TargetModel.from_checkpoint(tiny_checkpoint)
    want = check_drafter(model, list(settings.prompt), settings.config, str(drafter), "ddtree")
    assert list(shown["check"]) == [c.name for c in want] and list(shown["verdict"]) == [c.verdict for c in want]
    assert list(shown["found"]) == [c.found for c in want]
    assert at.success or at.warning
    at.sidebar.number_input(key="budget").set_value(9)
    run(at)
    assert not any(len(df.value) == len(want) and "check" in df.value for df in at.dataframe), \
        "a result of other settings is not shown"
