"""What the five exports are rendered from: the runs, and what is known about them beside their records."""
from __future__ import annotations

from dataclasses import dataclass

from engine.records import RunRecord
from profiling.capture_data import Capture
from profiling.metrics import summarize_runs
from profiling.repeats import RepeatStats, repeat_stats


@dataclass(frozen=True, slots=True)
class ReportData:
    runs: dict[str, RunRecord]  # AR first, then the speculative runs (decode_runs)
    summaries: dict[str, dict]  # metrics.summarize_runs(runs); a recording's keep their recorded verdicts
    repeats: RepeatStats  # the statistics of the repeats `runs` is one of
    capture: Capture | None = None  # the torch.profiler capture of the runs
    environment: dict | None = None  # where the runs ran (None: this machine, now)


def report_data(runs: dict[str, RunRecord], capture: Capture | None = None,
                repeats: RepeatStats | None = None) -> ReportData:
    """Live runs, summarised here; repeats None: the runs alone, one repeat (every n is 1)."""
    return ReportData(runs, summarize_runs(runs), repeats or repeat_stats([runs]), capture)
