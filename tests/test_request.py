"""engine.decoding.request.DecodeRequest: checked once, with a message that says what is wrong; and one
`run --report` summarises its runs once (profiling.measurement.Measurement is built once and read by all)."""
from __future__ import annotations

import json
import pathlib
import random

import pytest

from cli.__main__ import main
from engine.config import DecodeConfig
from engine.decoding.decoder import DecodeError
from engine.decoding.request import DecodeRequest
from engine.drafters import DrafterSpec
from profiling import metrics

FIXTURE = pathlib.Path(__file__).resolve().parent.parent / "models" / "model_tiny.kdtr"


def test_a_request_is_checked_once_and_normalised(tiny_checkpoint):
    prompt = tiny_checkpoint.prompt.tolist()
    request = DecodeRequest(tiny_checkpoint, prompt, DecodeConfig(), DrafterSpec(noise=0.2), ("ddtree", "chain"))
    assert request.prompt == tuple(prompt) and request.modes == ("chain", "ddtree") and request.primary == "ddtree"
    with pytest.raises(AttributeError):
        request.modes = ("chain",)  # frozen


def test_a_request_refuses_an_out_of_range_prompt_id(tiny_checkpoint):
    vocab = tiny_checkpoint.config.vocab_size
    bad = vocab + random.randrange(1000)
    with pytest.raises(DecodeError, match=rf"id\(s\) \[{bad}\] out of range: ids must be in \[0, {vocab}\)"):
        DecodeRequest(tiny_checkpoint, (1, bad, 2), DecodeConfig())
    with pytest.raises(DecodeError, match=r"\[-1\] out of range"):
        DecodeRequest(tiny_checkpoint, (-1,), DecodeConfig())
    with pytest.raises(DecodeError, match="the prompt is empty"):
        DecodeRequest(tiny_checkpoint, (), DecodeConfig())


def test_a_request_refuses_a_prompt_longer_than_the_cache(tiny_checkpoint):
    limit = tiny_checkpoint.config.max_position_embeddings
    cfg = DecodeConfig(max_new_tokens=random.randint(1, 20), block_size=4)
    room = limit - cfg.max_new_tokens - cfg.block_size
    DecodeRequest(tiny_checkpoint, (1,) * room, cfg)  # exactly fits
    with pytest.raises(DecodeError, match=rf"prompt of {room + 1} tokens .* needs {limit + 1} positions, more than "
                                          rf"the cache's {limit} .*shorten the prompt or lower max_new_tokens"):
        DecodeRequest(tiny_checkpoint, (1,) * (room + 1), cfg)


@pytest.mark.parametrize("modes", [("tree",), ("ar",), (), ("ddtree", "beam")])
def test_a_request_refuses_an_unknown_mode(tiny_checkpoint, modes):
    with pytest.raises(DecodeError, match=r"expected one or more of \('chain', 'ddtree'\) beside AR"):
        DecodeRequest(tiny_checkpoint, (1, 2), DecodeConfig(), modes=modes)


def test_run_report_summarises_its_runs_once(tmp_path, monkeypatch, capsys):
    """The console table, the exit status and the five exports all read one Measurement's summaries."""
    calls = []
    summarize = metrics.summarize
    monkeypatch.setattr(metrics, "summarize", lambda ar, run: calls.append(run.mode) or summarize(ar, run))
    out = tmp_path / "out"
    assert main(["run", "--model", str(FIXTURE), "--tree", "both", "--max-new", "6",
                 "--report", str(out)]) == 0
    assert sorted(calls) == ["chain", "ddtree"], "one summary per speculative run, computed once"
    doc = json.loads((out / "report.json").read_bytes())
    assert doc["summaries"]["ddtree"]["matches_ar"] and "DDTree acceptance histogram" in capsys.readouterr().out
