"""A Measurement: what measuring a DecodeRequest leaves, built once and read by the console summary, every exporter
and every page. A recording (profiling/report_reader.py) is a Measurement read back from a report.json."""
from __future__ import annotations

from dataclasses import dataclass

from engine.records import RunRecord
from profiling.capture_data import Capture
from profiling.environment import environment
from profiling.metrics import primary_mode, summarize_runs
from profiling.repeats import RepeatStats, repeat_stats

Runs = dict[str, RunRecord]  # AR first, then the speculative runs (engine.decoding.session.decode_request)


@dataclass(frozen=True, slots=True)
class Measurement:
    runs: Runs
    summaries: dict[str, dict]  # metrics.summarize_runs(runs); a recording's keep their recorded verdicts
    repeats: RepeatStats  # the statistics of the repeats `runs` is one of
    environment: dict  # where the runs ran (profiling/environment.py's fields)
    capture: Capture | None = None  # the torch.profiler capture of the runs
    ranks: list[Runs] | None = None  # every rank's runs of a parallel run (profiling/ranks.py), else None

    @classmethod
    def of(cls, runs: Runs, capture: Capture | None = None, repeats: RepeatStats | None = None,
           ranks: list[Runs] | None = None) -> Measurement:
        """Live runs measured here and now: summarised once; repeats None: the runs alone, one repeat (every n
        is 1)."""
        device = str(runs[primary_mode(runs)].decode["device"])
        return cls(runs, summarize_runs(runs), repeats or repeat_stats([runs]), environment(device), capture, ranks)

    @property
    def primary(self) -> str:
        """The speculative mode a stepped decode follows: DDTree when it ran, else the chain."""
        return primary_mode(self.runs)
