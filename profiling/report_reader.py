"""Open a report.json that `python -m engine run --report DIR` wrote, here or on another machine (a GPU server),
as the records a live decode leaves: the runs (engine.records), their summaries, the repeat statistics, the
torch.profiler capture and where it all ran. The dashboard's views then read it as they read a live decode.

A report comes from elsewhere, so it is checked whole before anything is built, and the first problem raises
ReportReadError naming what is wrong, where in the file, and what to do:
0. not another file of the report set (profiling/report_kind.py: a trace.json, a CSV or the page is named as such);
1. the limits (MAX_BYTES, MAX_VALUES before parsing, MAX_MASK_CELLS after), UTF-8, strict JSON
   (engine.loaders.strict_json: no duplicate keys, bounded nesting), every number finite and every integer within
   64 bits;
2. schema_version: this reader reads SCHEMA_VERSION;
3. the schema (profiling/schema.py, checked fast by profiling/report_schema_check.py);
4. the records' own rules (profiling/report_checks.py, each tree on whole arrays by profiling/report_trees.py), and
   the summaries and repeat statistics against the steps.
A progress callback hears how far it got (the dashboard reads in a background thread, ui/loading.py).
What a report cannot hold stays out: the AR logits (RunRecord.logits is None), so a first divergence keeps the
verdict recorded with it (near tie or real), which the machine that had the logits computed.
"""
from __future__ import annotations

import hashlib
import math
import os
import pathlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from engine.loaders import strict_json
from engine.loaders.text import TokenizerError
from engine.records import BudgetChoice, ExpertTraffic, NodeProbs, RunRecord, StepRecord, TreeRecord
from profiling import report_checks, report_kind
from profiling.capture_data import Capture, KernelEvent, OpTime, RangeTime, RunCapture
from profiling.measurement import Measurement
from profiling.metrics import range_names, summarize_runs
from profiling.repeats import STATISTICS, RepeatStats, large_spread, repeat_stats, summarize_repeats
from profiling.report_schema_check import Problem, first_problem, out_of_range, schema_error, skeleton
from profiling.schema import SCHEMA_VERSION

# What a recording may hold, so that any file this reader admits opens in seconds with bounded memory (docs/reports.md
# "Limits": the largest opens in about 5 CPU seconds on a 2-core development machine, `python -m
# benchmarks.bench_load --only recording`): bytes to read, JSON values to parse (counted by the commas before
# parsing: a float costs about half a microsecond), and the trees' visibility masks (a step of N nodes keeps N * N
# bytes: 1 MiB at B = 1024).
MAX_BYTES = 128 * 2**20
MAX_VALUES = 6_000_000
MAX_MASK_CELLS = 320 * 2**20
_LIMIT_IN_STEPS = f"about {MAX_MASK_CELLS // 1025**2} steps at B = 1024"
SHORTER = "record fewer steps (a smaller --max-new) or smaller trees (a smaller --budget)"
EXPORT_AGAIN = "export it again with `python -m engine run --report DIR`"
_DIVERGENCE_VERDICT = ("kind", "score_gap", "tolerance", "logit_gap", "token_gap")  # needs the AR logits


class ReportReadError(ValueError):
    """The file is not a report this dashboard can open; the message says why and what to do."""


class RecordedVocabulary:
    """The pieces and bytes of the tokens a report mentions: engine.loaders.text.Tokenizer's piece() and decode()
    for them."""

    def __init__(self, table: dict[int, tuple[str, bytes]]) -> None:
        self._table = table

    def piece(self, token: int) -> str:
        return self._entry(token)[0]

    def decode(self, ids: Iterable[int]) -> str:
        """The text of the ids, as the byte-level tokenizer decodes it (bytes joined, then UTF-8)."""
        return b"".join(self._entry(t)[1] for t in ids).decode("utf-8", errors="replace")

    def _entry(self, token: int) -> tuple[str, bytes]:
        if token not in self._table:
            raise TokenizerError(f"token id {token} is not in the report's vocabulary")
        return self._table[token]


@dataclass(frozen=True, slots=True, kw_only=True)
class Recording(Measurement):
    """A report.json read back: its Measurement (runs, summaries with first divergences as recorded, repeat
    statistics, capture, environment) plus the file's identity; the dashboard shows it as it shows a live one."""

    name: str  # the file's name, as the user gave it
    digest: str  # SHA-256 of its bytes
    size: int  # bytes
    vocabulary: RecordedVocabulary | None  # None: the model had no tokenizer


Progress = Callable[[float, str], None]  # (fraction done, what it is doing), as a progress bar shows it


def read_report_file(path: str | os.PathLike, progress: Progress | None = None) -> Recording:
    """A report.json on this machine."""
    path = pathlib.Path(path)
    try:
        if not path.is_file():
            raise ReportReadError(f"{path}: no such file (a directory, or a path that does not exist); give the path "
                                  "of a report.json.")
        size = path.stat().st_size
        with path.open("rb") as file:
            data = file.read(4096 if size > MAX_BYTES else -1)  # the head alone says what a file too large is
    except OSError as exc:
        raise ReportReadError(f"{path}: cannot be read ({exc.strerror or exc}); check the path and its "
                              "permissions.") from None
    if size > MAX_BYTES:
        _refuse_other_file(data, str(path))
        raise ReportReadError(_too_big(str(path), size))
    return read_report(data, str(path), progress)


def read_report(data: bytes, name: str, progress: Progress | None = None) -> Recording:
    """The report in data (name: what to call it in messages); progress, if given, hears how far it got."""
    tell = progress or (lambda fraction, what: None)
    _refuse_other_file(data, name)
    if len(data) > MAX_BYTES:
        raise ReportReadError(_too_big(name, len(data)))
    values = data.count(b",") + 1  # at least the JSON values it holds (a comma inside a string counts too)
    if values > MAX_VALUES:
        raise ReportReadError(f"{name} holds about {values / 1e6:.1f} million JSON values, more than the "
                              f"{MAX_VALUES / 1e6:.0f} million a recording may hold to open in seconds "
                              f"({_LIMIT_IN_STEPS}): {SHORTER}.")
    tell(0.0, f"parsing {len(data) / 1e6:.1f} MB of JSON")
    doc = _parse(data, name, tell)
    cells = sum(len(step["tree"]["tokens"]) ** 2 for step in doc["steps"])
    if cells > MAX_MASK_CELLS:
        raise ReportReadError(f"{name}'s trees need {cells / 2**20:.0f} MiB of visibility masks (one byte per pair "
                              f"of nodes in each step's tree), more than the {MAX_MASK_CELLS / 2**20:.0f} MiB a "
                              f"recording may take in memory ({_LIMIT_IN_STEPS}): {SHORTER}.")
    steps = len(doc["steps"])
    try:
        cfg = report_checks.check_config(doc)
        masks = report_checks.check_steps_and_runs(
            doc, cfg, lambda i: tell(0.5 + 0.3 * i / steps, f"checking step {i + 1} of {steps}"))
        report_checks.check_capture(doc, cfg)
        tell(0.8, "building the records")
        runs = {mode: _run(doc, mode, masks) for mode in cfg.modes}
        table = report_checks.check_vocabulary(doc, cfg, set().union(*(r.token_ids() for r in runs.values())))
        if table is not None:
            for run in runs.values():
                run.vocabulary = {t: table[t] for t in sorted(run.token_ids())}
        tell(0.9, "checking the summaries and statistics against the steps")
        summaries = _summaries(doc, runs)
        repeats = _repeats(doc, runs)
    except report_checks.ReportCheckError as exc:
        raise ReportReadError(f"{name} does not hold together at {exc}. The file was damaged or edited: "
                              f"{EXPORT_AGAIN}.") from None
    tell(1.0, "done")
    return Recording(name=name, digest=hashlib.sha256(data).hexdigest(), size=len(data), runs=runs,
                     summaries=summaries, repeats=repeats, capture=_capture(doc["capture"]),
                     environment=dict(doc["environment"]), vocabulary=None if table is None else
                     RecordedVocabulary(table))


def _refuse_other_file(data: bytes, name: str, doc: object = None) -> None:
    kind = report_kind.other_file(data, doc)
    if kind is not None:
        raise ReportReadError(report_kind.not_a_report(name, kind))


def _too_big(name: str, size: int) -> str:
    return (f"{name} is {size / 2**20:.0f} MiB, more than the {MAX_BYTES / 2**20:.0f} MiB a report may be "
            f"({_LIMIT_IN_STEPS}): it is not a report.json, or {SHORTER}.")


def _parse(data: bytes, name: str, tell: Progress) -> dict:
    """Steps 1-3 of the module docstring: the document, matching the schema."""
    try:
        doc = strict_json.loads(data)
    except strict_json.StrictJSONError as exc:
        raise ReportReadError(f"{name} {exc}: it is not a report.json, or it was cut short or damaged on the way; "
                              f"copy it again, or {EXPORT_AGAIN}.") from None
    _refuse_other_file(data, name, doc)
    if not isinstance(doc, dict):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(doc), "number")
        raise ReportReadError(f"{name} holds a JSON {kind}, not an object: it is not a report.json "
                              "(open the report.json that `python -m engine run --report DIR` wrote).")
    tell(0.4, "checking it against the report schema")
    problem = first_problem(doc)
    if problem is not None:
        _explain(doc, name, problem)
    return doc


def _explain(doc: dict, name: str, problem: Problem) -> None:
    """Raise the message for a document that does not match the schema: its out-of-range number, its schema version,
    or jsonschema's verdict and place (on the skeleton, profiling/report_schema_check.py); problem (the compiled
    check's) only where jsonschema accepts what this reader does not, such as 1.0 for an integer."""
    cut = skeleton(doc)  # the big plain arrays checked and cut to one element
    bad = _out_of_range_number(cut)
    if bad is not None:
        where, value = bad
        raise ReportReadError(f"{name}: {where} is {value}, which a report never holds (its writer writes strict JSON: "
                              f"finite numbers, 64-bit integers); the file was edited or damaged: {EXPORT_AGAIN}.")
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        found = "has no schema_version" if "schema_version" not in doc else f"has schema version {version!r}"
        raise ReportReadError(f"{name} {found}; this dashboard reads report.json schema version {SCHEMA_VERSION} "
                              f"(profiling/schema.py): {EXPORT_AGAIN} from a checkout of this version.")
    error = schema_error(cut)
    where, what = (error.absolute_path, _short(error.message)) if error is not None else (problem[0], problem[1])
    raise ReportReadError(f"{name} does not match the report schema (version {SCHEMA_VERSION}) at {_place(where)}: "
                          f"{what if error is not None else f'it {what}'}. A field is missing, misnamed or of the "
                          f"wrong type: the file was damaged or edited; {EXPORT_AGAIN}.")


def _out_of_range_number(doc: object) -> tuple[str, object] | None:
    """(place, value) of a non-finite float (NaN, Infinity, 1e999) or an integer beyond 64 bits, else None."""
    bad = out_of_range(doc)
    return None if bad is None else (_place(bad[0]), _short(repr(bad[1])))


def _place(path: Iterable) -> str:
    """A place in the document: steps[3].tree.parents[5] ("the top level" for the root)."""
    out = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    return out or "the top level"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit] + " ..."


def _tree(t: dict, mask: np.ndarray) -> TreeRecord:
    scores = np.array(t["scores"], dtype=np.float64)  # null (padding) becomes NaN: the schema admits no other NaN
    return TreeRecord(tokens=t["tokens"], parents=t["parents"], depths=t["depths"], ranks=t["ranks"],
                      scores=np.where(np.isnan(scores), -np.inf, scores).tolist(), visibility=mask)


def _floats(values: list) -> list[float]:
    return list(map(float, values))


def _step(s: dict, mask: np.ndarray) -> StepRecord:
    probs, experts, budget = s["probs"], s.get("experts"), s.get("budget")
    return StepRecord(
        index=s["index"], mode=s["mode"], prefix_len=s["prefix_len"], tree=_tree(s["tree"], mask), target=s["target"],
        logit_gap=_floats(s["logit_gap"]), path=s["path"], bonus=s["bonus"], committed=s["committed"],
        timings_ns=dict(s["timings_ns"]), wall_ns=s["wall_ns"], spans=[tuple(span) for span in s["spans"] or []],
        committed_text=s["committed_text"],
        probs=None if probs is None else NodeProbs(
            target=_floats(probs["target"]), draft=_floats(probs["draft"]), move_on=_floats(probs["move_on"]),
            expected_accepted=float(probs["expected_accepted"]), draft_expected=float(probs["draft_expected"])),
        experts=None if experts is None else ExpertTraffic(list(experts["touched"]), experts["bytes_per_expert"]),
        budget=None if budget is None else BudgetChoice(**{"built": max(budget["buckets"]), **budget}))


def _run(doc: dict, mode: str, masks: list[np.ndarray]) -> RunRecord:
    """The run of mode; masks: every step's visibility mask, in the file's order (report_checks built them)."""
    config, run = doc["config"], doc["runs"][mode]
    steps = [_step(s, mask) for s, mask in zip(doc["steps"], masks, strict=True) if s["mode"] == mode]
    return RunRecord(mode=mode, model=config["model"], decode=config["decode"], prompt=list(config["prompt"]),
                     first_token=run["first_token"], steps=steps, prefill_ns=run["prefill_ns"],
                     tokens=list(run["tokens"]), logits=None, wall_ns=run["wall_ns"],
                     drafter={} if mode == "ar" else config["drafter"],  # AR drafts nothing
                     prompt_text=run["prompt_text"], text=run["text"], parallel=config.get("parallel"))


def _capture(capture: dict | None) -> Capture | None:
    if capture is None:
        return None
    return Capture(list(capture["activities"]), {
        mode: RunCapture([RangeTime(**r) for r in run["ranges"]], [OpTime(**o) for o in run["ops"]],
                         [KernelEvent(**k) for k in run["kernels"]]) for mode, run in capture["runs"].items()})


def _same(a: object, b: object) -> bool:
    """Equal as JSON values, floats to 1e-9 relative (a report may come from another numpy)."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and math.isclose(a, b, rel_tol=1e-9)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


def _summaries(doc: dict, runs: dict[str, RunRecord]) -> dict[str, dict]:
    """summarize_runs of the rebuilt runs, each checked against the recorded one; the first divergence's verdict is
    the recorded one (it needs the AR logits, which a report does not hold)."""
    out = summarize_runs(runs)
    for mode, recorded in doc["summaries"].items():
        computed = out[mode]
        for key, value in recorded.items():
            if key == "first_divergence" and value is not None and computed[key] is not None:
                where = {k: v for k, v in value.items() if k not in _DIVERGENCE_VERDICT}
                if _same(where, {k: computed[key][k] for k in where}):
                    computed[key] = dict(value)
                    continue
            report_checks.require(_same(value, computed[key]), f"summaries.{mode}.{key}",
                                  f"{_short(repr(value), 60)} is not what the {mode} steps give "
                                  f"({_short(repr(computed[key]), 60)})")
    return out


def _repeats(doc: dict, runs: dict[str, RunRecord]) -> RepeatStats:
    """The recorded repeat statistics, checked (each ordered, and the runs' own values within their min-max); a
    report from before they were recorded: the runs alone, one repeat."""
    recorded = doc.get("repeats")
    if recorded is None:
        return repeat_stats([runs])
    count, modes = recorded["count"], recorded["modes"]
    report_checks.require(set(modes) == set(runs), "repeats.modes", f"holds {sorted(modes)}, the runs {list(runs)}")
    own = summarize_repeats([runs])
    for mode in runs:
        for key in STATISTICS:
            s, value = modes[mode][key], own[mode][key]["median"]
            report_checks.check_stats(s, count, f"repeats.modes.{mode}.{key}")
            report_checks.require(s["n"] == 0 or value is None or s["min"] <= value <= s["max"] or
                                  math.isclose(value, s["min"] if value < s["min"] else s["max"], rel_tol=1e-9),
                                  f"repeats.modes.{mode}.{key}", f"the runs' own {value:.6g} lies outside the "
                                                                 f"repeats' min-max {s['min']:.6g}-{s['max']:.6g}")
    rows = {mode: {k: dict(modes[mode][k]) for k in STATISTICS} for mode in runs}
    for row in rows.values():
        row["large_spread"] = large_spread(row)
    ranges = report_checks.range_stat_rows(doc, count, list(runs))
    for mode, run in runs.items():
        missing = [name for name in range_names(run.steps) if name not in ranges[mode]]
        report_checks.require(not missing, "kernels", f"has no {mode} row for the range(s) {missing[:4]} that its "
                                                      "steps time")
    return RepeatStats(count, rows, ranges)
