"""The dashboard under streamlit.testing.v1.AppTest: every page, button and control, asserting on what is shown
against what the engine computes for the same settings."""
from __future__ import annotations

import json
import os
import pathlib
import random
import re
import statistics
import tempfile

import pytest
import torch
from greedy import assert_greedy_equal
from streamlit.testing.v1 import AppTest

from engine.config import DTYPES, DecodeConfig
from engine.decoding.session import decode
from engine.drafters import REGISTRY
from engine.loaders.kdtr import read_kdtr
from profiling.metrics import run_time_ns
from profiling.sweep import QUICK_BUDGETS, verdict

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "models" / "model_tiny.kdtr"
TIMEOUT = 600  # the first run in a fresh checkout builds the kernels


def start(model: str | None = FIXTURE.name) -> AppTest:
    """A fresh tab with `model` chosen in the sidebar before the first run (None: the app's default model)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT)
    if model is not None:
        at.session_state["model"] = model
    at.run()
    assert not at.exception, at.exception
    return at


def run(at: AppTest) -> AppTest:
    at.run()
    assert not at.exception, at.exception
    return at


def metric(at: AppTest, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def press(at: AppTest, label: str) -> AppTest:
    next(b for b in at.button if b.label == label).click()
    return run(at)


def wait_for_job(at: AppTest) -> AppTest:
    """Wait for the Profile page's background measurement or sweep, then draw the page again (which keeps its
    result)."""
    running = at.session_state["profile_job"]
    assert running is not None and running.job.join(TIMEOUT), "a job ran and ended"
    return run(at)


def measure(at: AppTest) -> AppTest:
    """Press the Profile page's Measure (or Measure again) and wait for the measurement."""
    next(b for b in at.button if b.key == "profile_measure").click()
    return wait_for_job(run(at))


def shown_tokens(at: AppTest) -> list[int]:
    """The ids of the committed-token chips (each chip's hover text starts with its id)."""
    return [int(t) for t in re.findall(r'title="id (\d+) ', at.html[0].value)]


def plotly_specs(at: AppTest) -> list[str]:
    return [el.proto.spec for el in at.main.get("plotly_chart")]


def engine_tokens(ckpt, prompt: list[int], cfg: DecodeConfig) -> list[int]:
    return decode(ckpt, prompt, cfg, "ar").tokens


def test_decode_page_steps_shows_trees_and_matches_ar(tiny_checkpoint):
    at = start()
    assert metric(at, "Steps") == "0" and metric(at, "Status") == "ready"
    budget, block_size = random.randint(3, 40), random.randint(3, 5)  # >= 5 steps for 24 tokens
    at.sidebar.number_input(key="budget").set_value(budget)
    at.sidebar.number_input(key="block_size").set_value(block_size)
    run(at)
    specs = []
    for num_steps in (1, 2):
        press(at, "Step")
        assert metric(at, "Steps") == str(num_steps)
        assert any(f"tree of **{budget + 1} nodes**" in v for v in at.markdown.values)
        specs.append(plotly_specs(at))
        assert len(specs[-1]) == 3  # the ladder, the icicle and the mask
    assert specs[0] != specs[1], "the figures follow the newest step"

    at.number_input(key="run_n").set_value(2)
    press(at, "Run N")
    decoder = at.session_state["live"].decoder
    assert metric(at, "Steps") == "4" and len(decoder.steps) == 4

    press(at, "Run to end")
    cfg = DecodeConfig(budget=budget, block_size=block_size)
    prompt = tiny_checkpoint.prompt.tolist()
    expected = engine_tokens(tiny_checkpoint, prompt, cfg)
    assert metric(at, "Status") == "done"
    assert metric(at, "Tokens generated") == f"{cfg.max_new_tokens} / {cfg.max_new_tokens}"
    assert shown_tokens(at) == expected, "the committed tokens are the AR tokens (greedy-exact)"
    assert all(not b.disabled for b in at.button if b.label == "Reset")
    assert all(b.disabled for b in at.button if b.label in ("Step", "Run N", "Run to end"))
    steps = at.session_state["live"].decoder.steps
    tau = sum(s.num_committed for s in steps) / len(steps)
    assert metric(at, "Mean committed per step (tau)") == f"{tau:.2f}"
    assert 1 <= tau <= block_size

    first = 0
    at.selectbox(key="inspect_step").set_value(first)
    run(at)
    assert any(v.startswith(f"Step {first}: tree of") for v in at.markdown.values)
    assert metric(at, "Tokens committed") == str(steps[first].num_committed)
    assert metric(at, "Drafted tokens accepted") == str(steps[first].num_accepted)
    path_table = at.dataframe[0].value
    assert list(path_table[path_table["accepted"]]["node"]) == steps[first].path, "the path, labelled"
    stages = at.dataframe[1].value
    assert {"draft", "tree_build", "verify", "tree_accept", "kv_compact"} <= set(stages["stage"])

    press(at, "Reset")
    assert metric(at, "Steps") == "0" and metric(at, "Status") == "ready"


@pytest.mark.parametrize("key, new_value, field", [
    ("noise", 0.35, "noise"), ("seed", 7, "seed"), ("budget", 9, "budget"), ("block_size", 4, "block_size"),
    ("max_new_tokens", 10, "max_new_tokens"), ("dtype", "bfloat16", "dtype"), ("temperature", 0.5, "temperature")])
def test_changing_a_setting_resets_and_says_so(key, new_value, field):
    at = start()
    press(at, "Step")
    assert metric(at, "Steps") == "1"
    widget = next(w for w in (*at.sidebar.slider, *at.sidebar.number_input, *at.sidebar.selectbox) if w.key == key)
    old = widget.value
    widget.set_value(new_value)
    run(at)
    assert metric(at, "Steps") == "0"
    notice = at.info[0].value
    assert f"{widget.label} {old} -> {new_value}" in notice and "reset" in notice, "named as the sidebar names it"
    press(at, "Run to end")
    assert metric(at, "Status") == "done"
    settings = at.session_state["live"].settings
    assert getattr(settings.drafter if field in ("noise", "seed") else settings.config, field) == new_value
    n = settings.config.max_new_tokens
    assert metric(at, "Tokens generated") == f"{n} / {n}"
    run(at)
    assert not at.info, "the notice is shown once, on the run that reset"


def test_sidebar_offers_cuda_only_when_available_and_every_dtype():
    at = start()
    assert at.sidebar.selectbox(key="device").options == (["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    assert at.sidebar.selectbox(key="dtype").options == list(DTYPES)
    assert at.sidebar.selectbox(key="drafter").options == list(REGISTRY)


def test_typed_prompt_is_validated_and_used(tiny_checkpoint):
    at = start()
    at.sidebar.radio(key="prompt_source").set_value("token ids")
    run(at)
    assert "the prompt is empty" in at.sidebar.error[0].value
    at.sidebar.text_input(key="prompt_text").set_value("3, x, 5")
    run(at)
    assert "'x'" in at.sidebar.error[0].value
    assert "valid prompt" in at.warning[0].value
    assert not at.button, "no decode without a valid prompt"
    vocab = tiny_checkpoint.config.vocab_size
    at.sidebar.text_input(key="prompt_text").set_value(f"1 {vocab}")
    run(at)
    assert f"[0, {vocab})" in at.sidebar.error[0].value
    prompt = [random.randrange(vocab) for _ in range(random.randint(1, 6))]
    at.sidebar.text_input(key="prompt_text").set_value(", ".join(map(str, prompt)))
    run(at)
    assert not at.sidebar.error
    press(at, "Run to end")
    shown = shown_tokens(at)
    assert shown == decode(tiny_checkpoint, prompt, DecodeConfig(), "ddtree").tokens, "the engine's decode"
    ar = decode(tiny_checkpoint, prompt, DecodeConfig(), "ar")
    assert_greedy_equal(ar.tokens, ar.logits, shown)  # a random prompt may meet a near tie


def test_corrupt_upload_shows_the_loaders_error_and_the_app_keeps_working():
    at = start()
    press(at, "Step")
    good = FIXTURE.read_bytes()
    for name, data in (("noise.kdtr", os.urandom(random.randint(0, 4000))),
                       ("truncated.kdtr", good[: random.randint(8, len(good) - 1)])):
        with tempfile.TemporaryDirectory() as tmp:
            path = pathlib.Path(tmp) / "upload.kdtr"
            path.write_bytes(data)
            with pytest.raises(ValueError) as loader_error:
                read_kdtr(path)
        at.sidebar.file_uploader(key="upload").upload(name, data)
        run(at)
        error = at.sidebar.error[0].value
        assert error.startswith(f"{name} was not loaded: ") and "Still using model_tiny.kdtr" in error
        assert str(loader_error.value).replace(str(path), name) in error
        assert at.sidebar.selectbox(key="model").value == "model_tiny.kdtr"
        assert metric(at, "Steps") == "1", "the decode in progress is kept"
        at.sidebar.file_uploader(key="upload").clear()
        run(at)
    press(at, "Step")
    assert metric(at, "Steps") == "2"

    at.sidebar.file_uploader(key="upload").upload("copy.kdtr", good)
    run(at)
    assert not at.sidebar.error
    model = at.sidebar.selectbox(key="model")
    assert model.value.startswith("copy.kdtr (") and "model_tiny.kdtr" in model.options
    assert metric(at, "Steps") == "0" and "Checkpoint model_tiny.kdtr -> copy.kdtr" in at.info[0].value
    press(at, "Step")
    assert metric(at, "Steps") == "1"


def test_two_tabs_do_not_share_state():
    first, second = start(), start()
    press(first, "Step")
    press(first, "Step")
    assert metric(second, "Steps") == "0"
    second.sidebar.number_input(key="budget").set_value(5)
    press(run(second), "Step")
    run(first)
    assert metric(first, "Steps") == "2" and metric(second, "Steps") == "1"
    assert first.session_state["live"].settings.config.budget != second.session_state["live"].settings.config.budget
    assert first.session_state["live"].decoder is not second.session_state["live"].decoder


def test_profile_page_tables_charts_and_sweep():
    at = start()
    measure(run(at.switch_page("app_pages/profile.py")))
    measured = at.session_state["live"].measurement
    assert measured.repeats.count == at.number_input(key="profile_repeats").value == 5, "the default"
    count = random.randint(2, 4)
    at.number_input(key="profile_repeats").set_value(count)
    measure(run(at))
    measured = at.session_state["live"].measurement
    runs, repeated = measured.runs, measured.repeats.modes
    assert measured.repeats.count == count and repeated["ddtree"]["tokens_per_s"]["n"] == count
    assert repeated["ddtree"]["time_ms"]["min"] <= run_time_ns(runs["ddtree"]) / 1e6 <= \
        repeated["ddtree"]["time_ms"]["max"], "the shown run is one of the repeats"
    ar, dd = runs["ar"], runs["ddtree"]
    tau = sum(s.num_committed for s in dd.steps) / dd.num_steps
    shown = next(m for m in at.metric if m.label == "DDTree tokens/s")
    assert shown.value == f"{repeated['ddtree']['tokens_per_s']['median']:.1f}"
    assert shown.delta == f"{repeated['ddtree']['speedup']['median']:.2f}x speedup, tau {tau:.2f}"
    stats = at.dataframe[0].value
    assert (stats["n"] == count).all() and {"tokens/s", "speedup", "TTFT ms", "ITL p95 ms"} <= set(stats["statistic"])
    spreads = stats[stats["statistic"].isin(["tokens/s", "speedup"])]
    large = ((spreads["p90"] - spreads["p10"]) / spreads["median"] > 0.2).sum()
    assert sum(w.value.startswith("Large spread: ") for w in at.warning) == large, "a warning per large spread"
    table = at.dataframe[1].value
    assert table["count"].max() == dd.num_steps and "verify_attn" in " ".join(table["range"])
    # runs timeline, kernel bars, step timeline, the experts touched (the fixture has MoE layers), 3 acceptance charts
    assert len(plotly_specs(at)) == 7
    experts = at.dataframe[3].value  # after the stages against their floor (ui/stage_floor_panel.py)
    assert list(experts["run"]) == ["AR", "DDTree"]
    for row, mode in zip(experts.to_dict("records"), ("ar", "ddtree"), strict=True):
        per_step = [sum(s.experts.touched) for s in runs[mode].steps]
        assert row["experts touched (all layers)"] == pytest.approx(statistics.mean(per_step))

    at.radio(key="profile_run").set_value("AR")
    run(at)
    assert at.dataframe[1].value["count"].max() == ar.num_steps
    last = ar.num_steps - 1
    before = plotly_specs(at)[2]
    at.selectbox(key="timeline_step").set_value(last)
    run(at)
    assert plotly_specs(at)[2] != before, "the timeline shows the chosen step"

    assert at.text_input(key="sweep_budgets").value == ", ".join(map(str, QUICK_BUDGETS))
    at.text_input(key="sweep_budgets").set_value("4, x")
    run(at)
    assert "'x'" in at.error[0].value and next(b for b in at.button if b.label == "Run sweep").disabled
    budgets = sorted(random.sample(range(1, 17), 2))
    at.text_input(key="sweep_budgets").set_value(" ".join(map(str, budgets)))
    at.number_input(key="sweep_repeats").set_value(2)
    wait_for_job(press(run(at), "Run sweep"))  # the edit reruns the page (enabling the button) before the click
    rows = at.dataframe[4].value
    assert list(rows["budget"]) == budgets and (rows["tau"] <= DecodeConfig().block_size).all()
    assert ((rows["ms_p10"] <= rows["ms_per_token"]) & (rows["ms_per_token"] <= rows["ms_p90"])).all()
    sentence = verdict(at.session_state["live"].sweep)
    assert any(m.value == sentence[0].upper() + sentence[1:] + "." for m in at.markdown)
    assert len(plotly_specs(at)) == 8

    measure(at)
    assert at.session_state["live"].measurement.runs["ddtree"] is not dd, "re-measured"


def test_compare_page_verdict_and_diff(tiny_checkpoint):
    at = start()
    at.sidebar.slider(key="noise").set_value(0.5)
    at.sidebar.number_input(key="seed").set_value(random.randrange(1000))
    run(at.switch_page("app_pages/compare.py"))
    assert at.success[0].value.startswith("Greedy-exact: DDTree emitted exactly the AR tokens")
    n = DecodeConfig().max_new_tokens
    assert metric(at, "Positions equal") == f"{n} / {n}"
    table = at.dataframe[0].value
    expected = engine_tokens(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), DecodeConfig())
    assert list(table["AR"]) == expected and list(table["DDTree"]) == expected and table["equal"].all()


def test_report_page_offers_the_five_files():
    at = start()
    run(at.switch_page("app_pages/report.py"))
    labels = [b.label for b in at.download_button]
    assert labels == ["report.html", "report.json", "kernels.csv", "steps.csv", "trace.json"]
    files = at.session_state["live"].reports
    dd = at.session_state["live"].measurement.runs["ddtree"]
    summary = json.loads(files["report.json"])["summaries"]["ddtree"]
    assert summary["matches_ar"] is True and summary["num_steps"] == dd.num_steps
    assert files["steps.csv"].decode().count("\n") >= dd.num_steps
    for button in at.download_button:
        button.click()
        run(at)
        assert at.session_state["live"].reports is files, "downloading does not re-render"
    assert json.loads(files["report.json"])["repeats"]["count"] == 1, "one decode: one repeat"

    at.session_state["profile_repeats"] = 2  # the Profile page measures two repeats; the Report page exports them
    run(measure(run(at.switch_page("app_pages/profile.py"))).switch_page("app_pages/report.py"))
    doc = json.loads(at.session_state["live"].reports["report.json"])
    live = at.session_state["live"].measurement
    assert doc["repeats"]["count"] == 2, "the Profile page's repeats"
    assert doc["runs"]["ddtree"]["wall_ns"] == live.runs["ddtree"].wall_ns, "their median repeat"
    assert doc["repeats"]["modes"]["ddtree"]["tokens_per_s"] == live.repeats.modes["ddtree"]["tokens_per_s"]


def test_a_path_loads_a_hugging_face_directory_and_a_bad_path_keeps_the_model(tiny_checkpoint, tmp_path):
    from safetensors.numpy import save_file

    hf_dir = tmp_path / "tiny-hf"
    hf_dir.mkdir()
    hf_fields = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    config = tiny_checkpoint.config.to_dict() | hf_fields
    (hf_dir / "config.json").write_text(json.dumps(config))
    save_file(tiny_checkpoint.numpy_weights(), str(hf_dir / "model.safetensors"))

    at = start()
    at.sidebar.text_input(key="model_path").set_value(str(tmp_path / "missing")).run()
    assert "no such file or directory" in at.sidebar.error[0].value
    assert at.sidebar.selectbox(key="model").value == "model_tiny.kdtr"

    at.sidebar.text_input(key="model_path").set_value(str(hf_dir)).run()
    assert not at.exception
    assert at.sidebar.selectbox(key="model").value == str(hf_dir)
    assert [e.value for e in at.sidebar.error] == ["Prompt: the prompt is empty: give at least one token id"]
    at.sidebar.text_input(key="prompt_text").set_value(", ".join(map(str, tiny_checkpoint.prompt))).run()
    assert not at.sidebar.error
    press(at, "Run to end")
    golden = tiny_checkpoint.golden_tokens.tolist()
    assert shown_tokens(at)[: len(golden)] == golden, "the Hugging Face copy decodes the fixture's golden tokens"


def test_the_auto_budget_steps_show_their_choice_and_match_ar(tiny_checkpoint):
    """Auto budget on: each step's choice is drawn (expected tokens, predicted ms and their ratio per bucket, the
    calibration), the verified tree is a bucket's truncation, and the text is still AR's."""
    at = start()
    at.sidebar.number_input(key="budget").set_value(32)
    at.sidebar.toggle(key="auto_budget").set_value(True)
    run(at)
    press(at, "Run to end")
    steps = at.session_state["live"].decoder.steps
    assert all(s.budget is not None and s.tree.num_nodes - 1 in (0, *s.budget.buckets) for s in steps)
    assert any(sub.value == "Budget choice (auto)" for sub in at.subheader)
    specs = plotly_specs(at)
    assert any("expected tokens per second" in spec for spec in specs)
    assert shown_tokens(at) == engine_tokens(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), DecodeConfig())
