"""bench_decode's and bench_moe's stage floors: each row's stages (timed with the stage timers on) against the bytes
each must read (profiling/stage_floor.py), counted over a few steps of a fresh decoder with its records on (the
routed experts each verify touched, the prefix length, the tree), at the copy bandwidth measured in the run."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from benchmarks.common import Column
from engine.decoding.decoder import Decoder
from engine.records import StepRecord
from profiling.stage_floor import STAGES, FloorModel, mean_bytes, over_floor, stage_order, stage_times_ms

FLOOR_STAGES = [s for s in stage_order() if s != "verify/embed"]  # the embedding's rows: nothing to see


def floor_model_of(dec: Decoder) -> FloorModel:
    drafter = getattr(dec.drafter, "cfg", None)  # a DFlash drafter's shapes (the oracle has none)
    return FloorModel.of(dec.model.cfg, str(dec.model.dtype).removeprefix("torch."), dec.cfg.block_size, drafter)


def stage_bytes(dec: Decoder, records: Sequence[StepRecord]) -> dict:
    """The mean bytes per stage of `records`, stepped by dec."""
    return {"stage_bytes": mean_bytes(floor_model_of(dec), list(records))}


def recorded_stage_bytes(make: Callable[[bool], Decoder], num_steps: int) -> dict:
    """stage_bytes over num_steps steps of a fresh eager decoder."""
    dec = make(False)
    return stage_bytes(dec, [dec.step() for _ in range(num_steps)])


def add_stage_floors(rows: list[dict], bytes_per_s: float) -> None:
    """Each row's floor per stage (ms), its stage time over it, and the step's floor: the sum of its stages'."""
    for row in (r for r in rows if "error" not in r and "stage_bytes" in r):
        times = stage_times_ms(row.get("stage_ms", {}))
        for stage, num_bytes in row["stage_bytes"].items():
            floor = None if num_bytes is None else num_bytes / bytes_per_s * 1e3
            row[f"floor_ms_{stage}"] = floor
            row[f"over_floor_{stage}"] = over_floor(times.get(stage), floor)
        row["floor_ms"] = sum(row[f"floor_ms_{s}"] or 0.0 for s in STAGES if f"floor_ms_{s}" in row)


def floor_columns(key_columns: Sequence[Column]) -> list[Column]:
    """The row's key columns, then per stage its floor (ms) and its time over it."""
    out = list(key_columns)
    for stage in FLOOR_STAGES:
        name = stage.replace("verify/", "v.")
        out += [Column(f"floor_ms_{stage}", f"{name} floor ms", "{:.4f}"),
                Column(f"over_floor_{stage}", f"{name} x", "{:.2f}")]
    return out
