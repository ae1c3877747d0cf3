"""The dashboard's sampling and exactness controls (Streamlit's AppTest): temperature, top-k, top-p, seed and the
batch-invariant toggle reach the DecodeConfig; at T > 0 the Decode page shows each node's probabilities and each
step's expected acceptance; Profile, Compare and Report warn when the runs' texts differ; Profile and Compare measure
the decode stepped on the Decode page when asked."""
from __future__ import annotations

import random

import pytest
from test_app import measure, metric, press, run, shown_tokens, start
from test_app_query import open_link

from engine.config import DecodeConfig, batch_invariant_default
from engine.decoding.session import decode
from profiling.divergence import verdict
from profiling.measurement import Measurement
from profiling.metrics import summarize_runs
from ui.source import FRESH, STEPPED


def set_sampling(at, **values) -> DecodeConfig:
    """Set the temperature first: the other sampling fields are enabled only at T > 0."""
    for key, value in sorted(values.items(), key=lambda kv: kv[0] != "temperature"):
        at.sidebar.number_input(key=key).set_value(value)
        run(at)
    return at.session_state["live"].settings.config


def test_sampled_decode_shows_probabilities_and_matches_seeded_ar(tiny_checkpoint):
    at = start()
    seed = random.randrange(1000)
    cfg = set_sampling(at, temperature=0.8, top_k=random.randint(5, 40), top_p=0.9, sample_seed=seed)
    assert (cfg.temperature, cfg.top_p, cfg.seed) == (0.8, 0.9, seed) and cfg.top_k > 0
    press(at, "Step")
    press(at, "Step")
    step = at.session_state["live"].decoder.steps[-1]
    assert metric(at, "Expected accepted (target)") == f"{step.probs.expected_accepted:.2f}"
    assert metric(at, "Drafter's surrogate") == f"{step.probs.draft_expected:.2f}"
    assert metric(at, "Accepted (realised)") == str(step.num_accepted)
    table = next(df.value for df in at.dataframe if "target p" in df.value)
    drafted = [n for n in range(1, step.tree.num_nodes) if step.tree.parents[n] >= 0]
    assert list(table["node"]) == drafted
    assert list(table["target p"]) == [step.probs.target[n] for n in drafted]
    assert list(table["drafter marginal"]) == [step.probs.draft[n] for n in drafted]
    assert list(table["moves on"]) == [step.probs.move_on[n] for n in drafted]

    press(at, "Run to end")
    prompt = tiny_checkpoint.prompt.tolist()
    assert shown_tokens(at) == decode(tiny_checkpoint, prompt, cfg, "ar").tokens, "seed-matched: the AR samples"
    run(at.switch_page("app_pages/compare.py"))
    assert at.success[0].value.startswith("Seed-matched exact: DDTree emitted exactly the AR tokens")


def test_greedy_hides_the_probabilities_and_the_toggle_reaches_the_config():
    at = start()
    press(at, "Step")
    assert not any(m.label == "Expected accepted (target)" for m in at.metric), "greedy: p is 0 or 1"
    assert at.sidebar.number_input(key="top_k").disabled, "top-k only matters when sampling"
    toggle = at.sidebar.toggle(key="batch_invariant")
    assert toggle.value is batch_invariant_default("cpu") is True, "on the CPU the mode opens on"
    toggle.set_value(False)
    run(at)
    assert at.session_state["live"].settings.config.batch_invariant is False
    assert "Batch-invariant on -> off" in at.info[0].value
    run(at)
    assert at.sidebar.toggle(key="batch_invariant").value is False, "set by hand, it stays while the device does"


def test_a_link_gives_the_batch_invariant_toggle():
    at = open_link({"batch_invariant": "false"})
    assert at.sidebar.toggle(key="batch_invariant").value is False, "the link's, not the CPU's default"
    press(at, "Step")
    assert at.session_state["live"].settings.config.batch_invariant is False
    assert open_link({"batch_invariant": "true"}).sidebar.toggle(key="batch_invariant").value is True


def differ_warnings(at) -> list[str]:
    """The texts-differ warnings shown (a loaded machine may add large-spread warnings beside them)."""
    return [w.value for w in at.warning if "texts differ" in w.value]


def test_every_page_warns_when_the_texts_differ():
    at = start()
    measure(run(at.switch_page("app_pages/profile.py")))
    assert not differ_warnings(at)
    live = at.session_state["live"]
    runs = live.measurement.runs
    dd = runs["ddtree"]
    position = random.randrange(1, len(dd.tokens))
    dd.tokens[position] = (dd.tokens[position] + 1) % runs["ar"].model["vocab_size"]
    live.measurement = Measurement.of(runs, repeats=live.measurement.repeats)  # as if measured so: summarised once
    summary = summarize_runs(runs)["ddtree"]
    sentence = verdict(summary, "DDTree")
    run(at)
    assert len(differ_warnings(at)) == 1 and sentence in differ_warnings(at)[0]
    assert "(over different outputs) speedup" in next(m for m in at.metric if m.label == "DDTree tokens/s").delta
    run(at.switch_page("app_pages/compare.py"))
    shown = (at.error or at.warning)[0].value
    assert sentence in shown and "different outputs" in shown
    run(at.switch_page("app_pages/report.py"))
    assert sentence in differ_warnings(at)[0]
    assert any("(over different outputs) over AR" in v for v in at.markdown.values)


def test_profile_and_compare_measure_the_decode_you_stepped():
    at = start()
    run(at.switch_page("app_pages/compare.py"))
    assert at.radio(key="compare_source").options == [FRESH], "offered once the stepped decode is done"
    run(at.switch_page("app_pages/decode.py"))
    press(at, "Run to end")
    stepped = at.session_state["live"].decoder
    run(at.switch_page("app_pages/compare.py"))
    at.radio(key="compare_source").set_value(STEPPED)
    run(at)
    assert any("decode you stepped" in c.value for c in at.caption)
    assert list(at.dataframe[0].value["DDTree"]) == stepped.record().tokens
    run(at.switch_page("app_pages/profile.py"))
    at.radio(key="profile_source").set_value(STEPPED)
    run(at)
    assert not any(w.key == "profile_repeats" for w in at.number_input), "one decode: no repeats"
    table = at.dataframe[1].value
    step_row = table[table["range"] == "step"].iloc[0]
    assert step_row["count"] == len(stepped.steps)
    assert step_row["total_ms"] == pytest.approx(sum(s.timings_ns["step"] for s in stepped.steps) / 1e6)
    assert (at.dataframe[0].value["n"] == 1).all()
