"""The dashboard shows beside tau the tau of the steps on new text and the distinct-4-gram rate (Streamlit's
AppTest): the Decode page's tau metric as the decode goes, the Report page's sentence per run."""
from __future__ import annotations

from test_app import press, run, start

from profiling import metrics
from profiling.tau_text import beside_tau, summary_beside_tau


def tau_metric(at):
    return next(m for m in at.metric if m.label == "Mean committed per step (tau)")


def test_the_decode_and_report_pages_show_the_new_text_tau_and_the_distinct_rate():
    at = start()
    assert not tau_metric(at).delta, "nothing before the first step"
    press(at, "Run to end")
    record = at.session_state["live"].decoder.record()
    shown = tau_metric(at)
    assert shown.value == f"{metrics.tau(record):.2f}"
    assert shown.delta == beside_tau(*metrics.new_text_tau([record]), record.num_steps,
                                     metrics.distinct_4gram_rate([record]))
    assert "on new text (" in shown.delta and "distinct-4 " in shown.delta

    run(at.switch_page("app_pages/report.py"))
    for summary in at.session_state["live"].measurement.summaries.values():
        assert any(summary_beside_tau(summary) in v and f"tau {summary['tau']:.2f}" in v for v in at.markdown.values)
