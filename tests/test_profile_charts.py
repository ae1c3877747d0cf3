"""The Profile page's charts read whole: the acceptance row's titles fit a third of the page, and a timeline's axis
is in the unit its length needs (never µs in millions)."""
from __future__ import annotations

import dataclasses
import random
import re

import pytest

from engine.config import DecodeConfig
from engine.decoding.session import decode_runs
from engine.records import MODE_LABELS
from profiling.charts import acceptance_figure, position_figure, time_unit, timeline_figure
from profiling.metrics import summarize_runs
from ui import charts

TITLE_LINE = 40  # characters a title line holds in a third of a wide page (the acceptance row's columns)


@pytest.fixture(scope="module")
def runs(tiny_checkpoint):
    cfg = DecodeConfig(budget=random.choice([4, 16]), max_new_tokens=8)
    return decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, modes=("chain", "ddtree"))


def title_lines(fig) -> list[str]:
    return [re.sub(r"<[^>]+>", "", line) for line in fig.layout.title.text.split("<br>")]


def test_the_acceptance_rows_titles_fit_their_column(runs):
    for mode, summary in summarize_runs(runs).items():
        for fig in (acceptance_figure(summary), position_figure(summary),
                    charts.rank_figure(runs[mode], MODE_LABELS[mode])):
            lines = title_lines(fig)
            assert all(len(line) <= TITLE_LINE for line in lines), lines
            assert fig.layout.margin.t >= 50 + 20 * (len(lines) - 1), "room for every line"


@pytest.mark.parametrize(("span_ns", "unit"), [(0, "µs"), (1.5e6, "µs"), (3e6, "ms"), (1.9e9, "ms"), (5e9, "s"),
                                               (4e11, "s")])
def test_time_unit_follows_the_span(span_ns, unit):
    name, size = time_unit(span_ns)
    assert name == unit and span_ns / size < 2000


def test_a_long_step_timeline_reads_in_seconds_and_a_short_one_in_microseconds(runs):
    step = runs["ddtree"].steps[0]
    scale = 5e9 / max(start + dur for _, start, dur in step.spans)  # a 5 s step (a large tree on a slow machine)
    long = dataclasses.replace(step, spans=[(n, round(start * scale), round(dur * scale)) for n, start, dur in
                                            step.spans])
    for record, unit in ((step, time_unit(max(s + d for _, s, d in step.spans))[0]), (long, "s")):
        fig = charts.step_timeline(record)
        assert fig.layout.xaxis.title.text == f"{unit} since the step started"
        assert max(b + x for b, x in zip(fig.data[0].base, fig.data[0].x, strict=True)) < 2000
    assert charts.step_timeline(long).layout.xaxis.title.text.startswith("s ")
    fig = timeline_figure(runs["ddtree"])
    assert fig.layout.xaxis.title.text.split()[0] in ("µs", "ms", "s")
