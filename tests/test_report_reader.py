"""profiling.report_reader: report.json written by the engine and read back record for record, the committed H200
report, and every kind of bad file (each a ReportReadError naming what is wrong and what to do)."""
from __future__ import annotations

import copy
import json
import pathlib
import random

import numpy as np
import pytest
from recordings import as_json, assert_same_run, record

from engine.config import DecodeConfig
from engine.decoding.request import DecodeRequest
from engine.decoding.session import decode_runs
from engine.drafters import DrafterSpec
from engine.loaders.loading import load_model
from engine.loaders.text import TokenizerError
from profiling import report, report_reader
from profiling.capture import capture_runs
from profiling.measurement import Measurement
from profiling.metrics import summarize_runs, tokens_per_s, top2_gaps
from profiling.repeats import repeat_stats
from profiling.replay import Replay
from profiling.report_reader import ReportReadError, read_report, read_report_file
from profiling.schema import HONEST_TAU

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPORT_AGAIN = "export it again"


@pytest.fixture(scope="module")
def recorded(tiny_checkpoint, tmp_path_factory):
    """Three repeats of AR, the chain and DDTree, written as `run --repeats 3 --report DIR` writes them; sampled,
    so the steps carry their node probabilities."""
    cfg = DecodeConfig(budget=random.randint(3, 12), block_size=random.randint(3, 5), max_new_tokens=10,
                       temperature=0.8, seed=random.randrange(100))
    drafter = DrafterSpec(noise=0.3, seed=random.randrange(1000))
    return record(tiny_checkpoint, tmp_path_factory.mktemp("recording"), cfg, drafter, ("chain", "ddtree"), 3)


@pytest.fixture(scope="module")
def doc(recorded) -> dict:
    return json.loads(recorded[2].read_bytes())


def test_a_report_reads_back_as_the_records_it_was_written_from(recorded):
    repeated, runs, path = recorded
    rec = read_report_file(path)
    assert list(rec.runs) == ["ar", "chain", "ddtree"] and rec.primary == "ddtree"
    for mode in runs:
        assert_same_run(runs[mode], rec.runs[mode])
    assert any(s.probs is not None for s in rec.runs["ddtree"].steps), "T > 0: node probabilities round-trip"
    assert as_json(rec.summaries) == as_json(summarize_runs(runs)), "the summaries, divergence verdicts included"
    assert rec.repeats.count == 3 and rec.capture is None and rec.vocabulary is None
    live = repeat_stats(repeated)
    assert as_json(rec.repeats.modes) == as_json(live.modes) and as_json(rec.repeats.ranges) == as_json(live.ranges)
    speeds = [tokens_per_s(r["ddtree"]) for r in repeated]
    assert rec.repeats.modes["ddtree"]["tokens_per_s"]["median"] == pytest.approx(np.median(speeds))
    assert rec.environment == json.loads(path.read_bytes())["environment"]
    for name in report.FORMATS:  # re-exported from the recording: the files as written
        if name != "report.html":  # its plotly divs carry fresh random ids
            assert report.render(rec, name) == (path.parent / name).read_bytes(), name


def test_a_recordings_logit_gaps_come_from_its_steps(recorded):
    """A report holds no logits; the top-1/top-2 gap of each generated token comes from the steps' logit_gap at
    the path's nodes, which is the gap of the same logits rows (the prefill's token has none)."""
    runs, rec = recorded[1], read_report_file(recorded[2])
    for mode in runs:
        live, read = top2_gaps(runs[mode]), top2_gaps(rec.runs[mode])
        assert len(live) == len(read) == len(runs[mode].tokens) and read[0] is None
        assert read[1:] == pytest.approx(live[1:], abs=1e-5)


def test_a_capture_and_a_vocabulary_read_back(tiny_checkpoint, tmp_path):
    cfg = DecodeConfig(budget=6, block_size=3, max_new_tokens=6)
    runs, capture = capture_runs(DecodeRequest(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg,
                                               DrafterSpec(noise=0.2)))
    report.write_all(Measurement.of(runs, capture), tmp_path)
    rec = read_report_file(tmp_path / "report.json")
    assert as_json(rec.capture.to_dict()) == as_json(capture.to_dict())
    assert rec.repeats.count == 1 and all(s["n"] == 1 for s in rec.repeats.modes["ddtree"].values()
                                          if isinstance(s, dict))
    doc = json.loads((tmp_path / "report.json").read_bytes())
    run = doc["capture"]["runs"]["ddtree"]
    if run["kernels"]:  # a CPU capture may record no device kernels
        fails(edited(doc, lambda d: d["capture"]["runs"]["ddtree"]["kernels"][0].__setitem__("step", 10**6)),
              "does not hold together at capture.runs.ddtree.kernels[0].step", EXPORT_AGAIN)
    fails(edited(doc, lambda d: d["capture"]["runs"]["ddtree"]["ranges"][0].__setitem__("cpu_ms", -1.0)),
          "does not hold together at capture.runs.ddtree.ranges[0]")


def test_a_text_model_report_carries_its_tokens_pieces_and_text(tmp_path):
    ckpt = load_model(ROOT / "models" / "ddtree-py-22m")
    cfg = DecodeConfig(budget=8, block_size=4, max_new_tokens=6)
    runs = decode_runs(ckpt, ckpt.prompt.tolist(), cfg, DrafterSpec(noise=0.2), ("ddtree",))
    report.write_all(Measurement.of(runs), tmp_path)
    rec = read_report_file(tmp_path / "report.json")
    for mode, run in runs.items():
        assert_same_run(run, rec.runs[mode])
        assert rec.vocabulary.decode(run.tokens) == ckpt.tokenizer.decode(run.tokens) == run.text
        assert rec.vocabulary.decode(run.prompt) == run.prompt_text
        for t in run.token_ids():
            assert rec.vocabulary.piece(t) == ckpt.tokenizer.piece(t)
    unknown = next(t for t in range(ckpt.config.vocab_size) if all(t not in r.token_ids() for r in runs.values()))
    with pytest.raises(TokenizerError, match="not in the report's vocabulary"):
        rec.vocabulary.piece(unknown)


def test_the_committed_h200_report_opens(h200_report_dir):
    rec = read_report_file(h200_report_dir / "report.json")
    doc = json.loads((h200_report_dir / "report.json").read_bytes())
    assert rec.environment["device_name"] == "NVIDIA H200" and rec.capture is not None
    assert [r.num_steps for r in rec.runs.values()] == [doc["runs"][m]["num_steps"] for m in doc["runs"]]
    assert rec.repeats.count == 1, "written before the repeat statistics: the runs alone, one repeat"
    for mode, summary in doc["summaries"].items():
        read = as_json(rec.summaries[mode])
        assert {k: read[k] for k in summary} == summary and set(read) - set(summary) <= set(HONEST_TAU), \
            "as recorded, the fields it predates filled in from its steps"


def test_replay_steps_through_the_recorded_run(recorded):
    run = read_report_file(recorded[2]).runs["ddtree"]
    replay = Replay(run)
    assert replay.steps == [] and not replay.done and replay.first_token == run.first_token
    for i in range(run.num_steps):
        assert replay.step() is run.steps[i]
        partial = replay.record()
        generated = [run.first_token] + [t for s in run.steps[:i + 1] for t in s.committed]
        assert partial.tokens == generated[:run.decode["max_new_tokens"]] and partial.num_steps == i + 1
    assert replay.done and replay.record() is run
    with pytest.raises(ValueError, match="no step after its last"):
        replay.step()


# -- bad files -------------------------------------------------------------------------------------------------


def fails(data: bytes | dict, *needles: str) -> str:
    raw = data if isinstance(data, bytes) else json.dumps(data).encode()
    with pytest.raises(ReportReadError) as error:
        read_report(raw, "bad.json")
    message = str(error.value)
    assert message.startswith("bad.json"), message
    for needle in needles:
        assert needle in message, (needle, message)
    return message


def edited(doc: dict, change) -> dict:
    out = copy.deepcopy(doc)
    change(out)
    return out


def test_not_json_truncated_or_hostile_bytes_are_refused(recorded):
    good = recorded[2].read_bytes()
    fails(b"", "is not valid JSON", "copy it again")
    fails(bytes(random.randrange(256) for _ in range(random.randint(1, 400))) + b"\xff", "not")
    fails(good[:random.randrange(1, len(good) - 2)], "is not valid JSON", "cut short")
    fails(b'{"schema_version": 2, "schema_version": 2}', "duplicate key")
    fails(b"[" * 100_000 + b"]" * 100_000, "nested too deeply")
    fails(b"[1, 2]", "holds a JSON array, not an object")
    fails(b"null", "holds a JSON null, not an object")


def test_non_finite_numbers_and_huge_integers_are_refused_with_their_place(doc):
    step = random.randrange(len(doc["steps"]))
    text = json.dumps(edited(doc, lambda d: d["steps"][step]["logit_gap"].__setitem__(0, float("nan"))))
    fails(text.encode(), f"steps[{step}].logit_gap[0] is nan")
    text = json.dumps(doc).replace('"prefill_ns": ', '"prefill_ns": 1e999, "was": ', 1)  # 1e999 parses as inf
    fails(text.encode(), "runs.ar.prefill_ns is inf")
    fails(edited(doc, lambda d: d["runs"]["ar"]["tokens"].__setitem__(0, 2**70)), "runs.ar.tokens[0]", "64-bit")


@pytest.mark.parametrize("version", [1, 3, "2", None])
def test_a_wrong_schema_version_says_which_this_reads(doc, version):
    bad = edited(doc, lambda d: d.__setitem__("schema_version", version) if version is not None else
                 d.pop("schema_version"))
    found = "has no schema_version" if version is None else f"has schema version {version!r}"
    fails(bad, found, "reads report.json schema version 2", EXPORT_AGAIN)


@pytest.mark.parametrize("path, key", [
    ("environment", "torch"), ("runs.ar", "tokens"), ("summaries.ddtree", "tau"), ("steps.0.tree", "parents"),
    ("steps.-1", "committed"), ("config", "prompt"), ("", "steps")])
def test_a_missing_field_is_named(doc, path, key):
    def drop(d):
        node = d
        for part in filter(None, path.split(".")):
            node = node[int(part)] if isinstance(node, list) else node[part]
        del node[key]
    message = fails(edited(doc, drop), "does not match the report schema", f"'{key}' is a required property",
                    EXPORT_AGAIN)
    assert path.split(".")[0] in message


def test_a_wrong_type_is_named_with_its_place(doc):
    i = random.randrange(len(doc["steps"]))
    fails(edited(doc, lambda d: d["steps"][i].__setitem__("path", "0")), f"at steps[{i}].path", "not of type")


def _step(doc: dict, mode: str) -> tuple[int, dict]:
    i = random.choice([i for i, s in enumerate(doc["steps"]) if s["mode"] == mode])
    return i, doc["steps"][i]


def test_out_of_range_ids_are_named(doc):
    vocab = doc["config"]["model"]["vocab_size"]
    i, step = _step(doc, "ddtree")
    n = len(step["tree"]["tokens"])
    cases = [
        (lambda d: d["steps"][i]["path"].append(n + 3), f"steps[{i}].path"),
        (lambda d: d["steps"][i]["tree"]["parents"].__setitem__(n - 1, n - 1), f"steps[{i}].tree.parents[{n - 1}]"),
        (lambda d: d["steps"][i]["tree"]["visible"].__setitem__(1, [0, 1, n + 5]), f"steps[{i}].tree.visible[1]"),
        (lambda d: d["steps"][i]["tree"]["tokens"].__setitem__(n - 1, vocab), f"steps[{i}].tree.tokens[{n - 1}]"),
        (lambda d: d["config"]["prompt"].__setitem__(0, vocab + 7), "config.prompt[0]"),
        (lambda d: d["runs"]["chain"].__setitem__("first_token", -1), "runs.chain.first_token"),
        (lambda d: d["steps"][i].__setitem__("mode", "ar") or d["steps"][i].__setitem__("index", 10**6),
         "steps"),
    ]
    for change, where in cases:
        fails(edited(doc, change), f"does not hold together at {where}", EXPORT_AGAIN)


def test_records_that_contradict_each_other_are_refused(doc):
    i, step = _step(doc, "ddtree")
    cases = [
        (lambda d: d["runs"]["ddtree"]["tokens"].reverse(), "runs.ddtree.tokens"),
        (lambda d: d["summaries"]["ddtree"].__setitem__("tau", 0.5), "summaries.ddtree.tau"),
        (lambda d: d["steps"][i].__setitem__("bonus", (step["bonus"] + 1) % 10), f"steps[{i}]"),
        (lambda d: d["steps"][i].__setitem__("prefix_len", step["prefix_len"] + 1), f"steps[{i}].prefix_len"),
        (lambda d: d["runs"]["ar"].__setitem__("num_steps", d["runs"]["ar"]["num_steps"] + 1), "runs.ar.num_steps"),
        (lambda d: d["repeats"]["modes"]["ddtree"]["tokens_per_s"].__setitem__("min", 1e9),
         "repeats.modes.ddtree.tokens_per_s"),
        (lambda d: d["repeats"]["modes"]["ar"]["ttft_ms"].__setitem__("n", 4), "repeats.modes.ar.ttft_ms.n"),
        (lambda d: d["kernels"][0].pop("mean_ms_p90"), "kernels[0]"),
        (lambda d: d["config"].__setitem__("modes", ["ddtree", "ar", "chain"]), "config.modes"),
        (lambda d: d["config"]["decode"].__setitem__("budget", 5000), "config.decode"),
        (lambda d: d["config"]["drafter"].__setitem__("name", "psychic"), "config.drafter.name"),
        (lambda d: d.__setitem__("vocabulary", {"0": {"piece": "a", "bytes": "61"}}), "vocabulary"),
    ]
    for change, where in cases:
        fails(edited(doc, change), f"does not hold together at {where}", EXPORT_AGAIN)


def test_a_file_too_large_or_missing_is_refused(recorded, tmp_path, monkeypatch):
    path = recorded[2]
    monkeypatch.setattr(report_reader, "MAX_BYTES", path.stat().st_size - 1)
    with pytest.raises(ReportReadError, match="more than the"):
        read_report_file(path)
    with pytest.raises(ReportReadError, match="more than the"):
        read_report(path.read_bytes(), "big.json")
    with pytest.raises(ReportReadError, match="no such file"):
        read_report_file(tmp_path / "missing.json")
    with pytest.raises(ReportReadError, match="no such file"):
        read_report_file(tmp_path)


def _mutate(doc: dict, rng: random.Random) -> dict:
    """One value somewhere in the document replaced by a value of another kind or size."""
    out = copy.deepcopy(doc)
    node = out
    while True:
        key, child = rng.choice(list(node.items()) if isinstance(node, dict) else list(enumerate(node)))
        if isinstance(child, (dict, list)) and child and rng.random() < 0.8:
            node = child
            continue
        node[key] = rng.choice([None, -1, 0, 1, 2**40, 0.5, -1e300, "x", [], {}, [7], {"a": 1}, True])
        return out


def test_fuzz_every_damaged_report_is_an_error_or_a_recording(doc, recorded):
    """200 damaged copies (a value replaced anywhere, bytes flipped, cut short): each opens or raises
    ReportReadError, never another exception."""
    rng = random.Random(random.randrange(2**31))
    good = recorded[2].read_bytes()
    opened = 0
    for case in range(200):
        if case % 4 == 0:
            raw = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            data = bytes(raw)
        elif case % 4 == 1:
            data = good[:rng.randrange(len(good))]
        else:
            data = json.dumps(_mutate(doc, rng)).encode()
        try:
            read_report(data, "fuzz.json")
            opened += 1
        except ReportReadError as exc:
            assert str(exc).startswith("fuzz.json") and len(str(exc)) < 2000
    assert opened < 200


def _full_schema_error(doc: dict):
    import jsonschema

    from profiling.schema import REPORT_SCHEMA

    return jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(REPORT_SCHEMA).iter_errors(doc))


def test_the_fast_schema_check_gives_jsonschemas_verdict_and_place(doc):
    """The skeleton check (profiling/report_schema_check.py) against jsonschema on the whole document: the same
    error, at the same place, for damage in the big arrays, in small fields, and none for the intact file."""
    from profiling.report_schema_check import schema_error, skeleton
    from profiling.schema import REPORT_SCHEMA

    assert schema_error(skeleton(doc)) is None and _full_schema_error(doc) is None
    cut = skeleton(doc, REPORT_SCHEMA)
    step = next(i for i, s in enumerate(doc["steps"]) if len(s["tree"]["tokens"]) > 2)
    assert len(cut["steps"][step]["tree"]["tokens"]) == 1 and len(cut["steps"][step]["tree"]["visible"]) == 1
    rng = random.Random(0)
    damages = [("tokens", "7"), ("tokens", True), ("tokens", 1.0), ("scores", "x"), ("parents", None),
               ("visible", [1, "a"]), ("visible", 3), ("depths", 2.5)]
    for field, bad in damages:
        damaged = copy.deepcopy(doc)
        values = damaged["steps"][step]["tree"][field]
        values[rng.randrange(len(values))] = bad
        fast, full = schema_error(skeleton(damaged)), _full_schema_error(damaged)
        assert (fast is None) == (full is None), (field, bad)
        if full is not None:
            assert list(fast.absolute_path) == list(full.absolute_path) and fast.message == full.message, (field, bad)
    damaged = copy.deepcopy(doc)
    damaged["steps"][step]["spans"] = [["verify", 1]]
    assert list(schema_error(skeleton(damaged)).absolute_path) == list(_full_schema_error(damaged).absolute_path)
    for field, bad in (("scores", float("nan")), ("tokens", 2**64), ("scores", float("inf")), ("tokens", -2**63 - 1)):
        damaged = copy.deepcopy(doc)
        values = damaged["steps"][step]["tree"][field]
        index = rng.randrange(len(values))
        values[index] = bad
        assert report_reader._out_of_range_number(skeleton(damaged)) == report_reader._out_of_range_number(damaged)
        assert report_reader._out_of_range_number(damaged)[0] == f"steps[{step}].tree.{field}[{index}]"
