"""profiling.job and profiling.estimate: a measurement in a background thread that Stop ends at its next decode step,
its progress, its errors, and the estimate of how long one takes."""
from __future__ import annotations

import random
import time

import pytest

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import load_target
from profiling.estimate import duration_text, measure_estimate_s, sweep_estimate_s
from profiling.job import Job, Plan
from profiling.measure import measure_job
from profiling.metrics import run_time_ns
from profiling.sweep import sweep_job


@pytest.fixture(scope="module")
def request_and_model(tiny_checkpoint):
    cfg = DecodeConfig(budget=random.choice([4, 8]), max_new_tokens=8)
    request = DecodeRequest(tiny_checkpoint, tuple(tiny_checkpoint.prompt.tolist()), cfg)
    return request, load_target(tiny_checkpoint, cfg)


def test_a_measurement_job_returns_the_measurement_with_its_progress(request_and_model):
    request, model = request_and_model
    job = measure_job(request, model, 2).start()
    assert job.join(600) and job.error is None and not job.stopped
    assert job.result.repeats.count == 2 and job.units == 2 and job.fraction == 1.0 and job.left_s == 0
    assert job.plan.tokens == 2 * 2 * request.config.max_new_tokens, "two repeats of AR and DDTree"


def test_stop_ends_a_job_at_its_next_step(request_and_model):
    request, model = request_and_model
    for job in (measure_job(request, model, 40), sweep_job(request, model, [1, 2, 4, 8, 16], 10)):
        job.start()
        while job.tokens_done == 0 and job.running:
            time.sleep(0.01)
        job.stop()
        assert job.join(600) and job.stopped and job.result is None and job.error is None
        assert job.units < job.plan.units and not job.stopping


def test_a_failing_job_keeps_its_error_and_a_plan_is_checked():
    def work(job: Job):
        job.step(1)
        raise ValueError("bad input")

    job = Job("fails", Plan(2, 3, "decode"), work).start()
    assert job.join(10) and isinstance(job.error, ValueError) and not job.stopped
    assert job.tokens_done == 1 and job.left_s == pytest.approx(job.elapsed_s * 5)
    with pytest.raises(ValueError, match="at least one decode"):
        Plan(0, 3, "decode")


def test_the_estimates_follow_the_runs_times(request_and_model):
    request, model = request_and_model
    job = measure_job(request, model, 1).start()
    assert job.join(600)
    runs = job.result.runs
    one = sum(run_time_ns(r) for r in runs.values()) / 1e9
    assert one < measure_estimate_s(runs, 1) < measure_estimate_s(runs, 3) <= 3 * one + measure_estimate_s(runs, 1)
    assert sweep_estimate_s(runs, 4, 2) == pytest.approx(9 * run_time_ns(runs["ddtree"]) / 1e9)
    assert duration_text(8.4) == "8 s" and duration_text(125) == "2 min 5 s"
