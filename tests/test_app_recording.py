"""A report.json opened in the dashboard (AppTest): every page shows the recording, labelled as one, from its own
records; the controls that need the model are disabled; a bad file changes nothing; closing it brings the live
decode back as it was; a file is read in the background with a progress bar, the page usable meanwhile."""
from __future__ import annotations

import json
import random
import threading

import pytest
from recordings import record
from test_app import TIMEOUT, measure, metric, press, run, shown_tokens, start

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from profiling.metrics import summarize_runs
from ui.safe_text import plain

PAGES = ("app_pages/decode.py", "app_pages/profile.py", "app_pages/compare.py", "app_pages/report.py")


@pytest.fixture(scope="module")
def recorded(tiny_checkpoint, tmp_path_factory):
    cfg = DecodeConfig(budget=random.randint(4, 16), block_size=random.randint(3, 5), max_new_tokens=12)
    return record(tiny_checkpoint, tmp_path_factory.mktemp("recording"), cfg,
                  DrafterSpec(noise=0.3, seed=random.randrange(1000)), ("ddtree",), 2)


def banner(at) -> str:
    return next((i.value for i in at.info if i.value.startswith("**A recording**")), "")


def loaded(at):
    """Wait for the background read of a report (ui/loading.py), then run the page that shows its outcome."""
    loading = at.session_state["report_loading"]
    if loading is not None:
        loading.thread.join(TIMEOUT)
        run(at)
    return at


def open_path(at, path) -> None:
    at.sidebar.text_input(key="report_path").set_value(str(path))
    loaded(run(at))


def upload(at, name: str, data: bytes) -> None:
    at.sidebar.file_uploader(key="report_upload").upload(name, data)
    loaded(run(at))


def test_every_page_shows_the_recording_labelled_as_one(recorded):
    repeated, runs, path = recorded
    doc = json.loads(path.read_bytes())
    env, dd = doc["environment"], runs["ddtree"]
    at = start()
    press(at, "Step")  # a live decode in progress: the recording must not lose it
    open_path(at, path)
    for page in PAGES:
        run(at.switch_page(page))
        text = banner(at)
        assert path.name in text and env["device_name"] in text, page
        assert (env["git_commit"] or "no git commit")[:12] in text and f"B = {dd.decode['budget']}" in text, page
        assert f"{doc['repeats']['count']} repeat(s)" in text and "vocabulary 512" in text, page

    run(at.switch_page("app_pages/decode.py"))
    assert metric(at, "Steps") == "0" and metric(at, "Status") == "ready"
    press(at, "Step")
    step = dd.steps[0]
    assert metric(at, "Steps") == "1", "Step replays the first recorded step"
    assert any(v.startswith(f"Step 0: tree of **{step.tree.num_nodes} nodes**") for v in at.markdown.values)
    assert metric(at, "Tokens committed") == str(step.num_committed)
    press(at, "Run to end")
    assert metric(at, "Status") == "done" and shown_tokens(at) == dd.tokens
    assert metric(at, "Steps") == str(dd.num_steps)

    run(at.switch_page("app_pages/profile.py"))
    assert all(b.disabled for b in at.button if b.label in ("Re-run", "Run sweep"))
    assert any("needs the model" in c.value for c in at.caption)
    shown = next(m for m in at.metric if m.label == "DDTree tokens/s")
    assert shown.value == f"{doc['repeats']['modes']['ddtree']['tokens_per_s']['median']:.1f}"
    assert (at.dataframe[0].value["n"] == len(repeated)).all(), "the recorded statistics, over its repeats"
    assert at.session_state["live"].measurement is None, "nothing was decoded"

    run(at.switch_page("app_pages/compare.py"))
    assert at.success[0].value.startswith("Greedy-exact: DDTree emitted exactly the AR tokens")
    assert list(at.dataframe[0].value["AR"]) == runs["ar"].tokens

    run(at.switch_page("app_pages/report.py"))
    files = at.session_state["recording"].reports
    exported = json.loads(files["report.json"])
    assert exported == doc, "re-exported as recorded: environment, statistics and summaries kept"
    assert files["steps.csv"] == (path.parent / "steps.csv").read_bytes()

    next(b for b in at.sidebar.button if b.label == "Close the recording").click()
    run(at.switch_page("app_pages/decode.py"))
    assert not banner(at) and metric(at, "Steps") == "1", "the live decode is back as it was"
    assert summarize_runs(runs)["ddtree"]["matches_ar"]


def test_an_uploaded_recording_opens_and_bad_files_change_nothing(recorded, tmp_path):
    path = recorded[2]
    at = start()
    press(at, "Step")
    for name, data in (("noise.json", bytes(random.randrange(256) for _ in range(300))),
                       ("cut.json", path.read_bytes()[: random.randrange(10, 5000)])):
        upload(at, name, data)
        error = at.sidebar.error[0].value
        assert error.startswith(f"{name} ") and error.endswith("Still decoding live.")
        assert not banner(at) and metric(at, "Steps") == "1", "the live decode is kept"
    upload(at, "good.json", path.read_bytes())
    assert not at.sidebar.error and "good.json" in banner(at)

    doc = json.loads(path.read_bytes())
    doc["schema_version"] = 1
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    open_path(at, old)
    error = at.sidebar.error[0].value
    assert "schema version 1" in error and error.endswith("Still showing good.json.")
    assert "good.json" in banner(at), "the open recording stays open"
    open_path(at, tmp_path / "missing.json")
    assert "no such file" in at.sidebar.error[0].value


def page_content(at) -> dict:
    """What a page says and shows, less what names its source (banner, captions, the source radio) and the AR
    logit gaps (a recording holds none: they come from its steps' logit_gap, equal to float32 rounding)."""
    frames = [df.value.drop(columns=["AR top-1/top-2 gap"], errors="ignore") for df in at.dataframe]
    return {"verdicts": [e.value for e in (*at.success, *at.warning, *at.error)],
            "metrics": [(m.label, m.value, m.delta) for m in at.metric],
            "markdown": [m.value for m in at.markdown if " bytes" not in m.value], "frames": frames}


def test_a_recording_and_the_live_measurement_it_was_written_from_show_the_same_pages(tmp_path):
    from profiling import report

    at = start()
    at.sidebar.slider(key="noise").set_value(0.4)
    at.session_state["profile_repeats"] = 1
    measure(run(at.switch_page(PAGES[1])))
    live = {}
    for page in PAGES[1:]:
        live[page] = page_content(run(at.switch_page(page)))
    measurement = at.session_state["live"].measurement
    assert measurement.repeats.count == 1
    report.write_all(measurement, tmp_path)
    open_path(at, tmp_path / "report.json")
    assert at.session_state["recording"].recording.runs["ddtree"].tokens == measurement.runs["ddtree"].tokens
    for page in PAGES[1:]:
        shown = page_content(run(at.switch_page(page)))
        assert banner(at), page
        assert {k: v for k, v in shown.items() if k != "frames"} == {k: v for k, v in live[page].items()
                                                                      if k != "frames"}, page
        assert len(shown["frames"]) == len(live[page]["frames"]), page
        for recorded_frame, live_frame in zip(shown["frames"], live[page]["frames"], strict=True):
            assert recorded_frame.equals(live_frame), (page, recorded_frame, live_frame)


@pytest.fixture
def slow_reader(monkeypatch):
    """ui.recorded's readers held at a quarter of the way until the returned gate is set, so a read outlasts
    ui.recorded.GRACE_S and goes on in the background."""
    from ui import recorded as ui_recorded

    gate = threading.Event()
    for name in ("read_report", "read_report_file"):
        real = getattr(ui_recorded, name)

        def held(*args, real=real):
            args[-1](0.25, "checking step 3 of 12")
            assert gate.wait(TIMEOUT)
            return real(*args)

        monkeypatch.setattr(ui_recorded, name, held)
    return gate


def test_a_recording_opens_in_the_background_with_progress_and_the_page_stays_usable(recorded, slow_reader):
    path = recorded[2]
    at = start()
    at.sidebar.text_input(key="report_path").set_value(str(path))
    run(at)
    bar = at.sidebar.get("progress")
    assert bar and bar[0].value == 25, "the sidebar shows how far the read got"
    assert bar[0].text.startswith(plain(f"Opening {path}: checking step 3 of 12 ("))
    press(at, "Step")
    assert metric(at, "Steps") == "1" and not banner(at), "the live decode steps while the file is read"
    assert at.sidebar.get("progress"), "still reading"
    slow_reader.set()
    loaded(at)
    assert path.name in banner(at) and not at.sidebar.get("progress") and not at.sidebar.error
    run(at.switch_page("app_pages/decode.py"))
    assert metric(at, "Steps") == "0", "the recording, not yet stepped"


def test_an_error_in_the_background_is_the_readers_message(recorded, slow_reader, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_bytes((recorded[2].parent / "trace.json").read_bytes())
    at = start()
    press(at, "Step")
    at.sidebar.file_uploader(key="report_upload").upload("trace.json", trace.read_bytes())
    run(at)
    assert at.sidebar.get("progress") and not at.sidebar.error
    slow_reader.set()
    loaded(at)
    error = at.sidebar.error[0].value
    assert error.startswith(plain("trace.json is a trace.json")) and "open the report.json" in error
    assert error.endswith("Still decoding live.") and not at.sidebar.get("progress")
    assert not banner(at) and metric(at, "Steps") == "1", "the live decode is kept"
