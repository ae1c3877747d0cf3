"""bench_decode's and bench_moe's stage floors: each row's stages (timed with the stage timers on) against the bytes
each must read (profiling/stage_floor.py), counted over a few steps of a fresh decoder with its records on (the
routed experts each verify touched, the prefix length, the tree), at the copy bandwidth measured in the run; the
step's roofline floor, where a verify part's FLOPs (engine/model/step_flops.py) at the measured matmul rate take
longer than its bytes; and the DFlash drafter's forward and context update, timed alone as graph replays, against
the floors of their stages."""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from benchmarks.common import Column
from engine.decoding.decoder import Decoder
from engine.model.step_flops import TargetFlops
from engine.records import StepRecord
from profiling.stage_floor import (
    DRAFTER_STAGES,
    STAGES,
    FloorModel,
    mean_bytes,
    over_floor,
    stage_order,
    stage_times_ms,
)

FLOOR_STAGES = [s for s in stage_order() if s != "verify/embed"]  # the embedding's rows: nothing to see


def floor_model_of(dec: Decoder) -> FloorModel:
    drafter = getattr(dec.drafter, "cfg", None)  # a DFlash drafter's shapes (the oracle has none)
    return FloorModel.of(dec.model.cfg, str(dec.model.dtype).removeprefix("torch."), dec.cfg.block_size, drafter)


def stage_bytes(dec: Decoder, records: Sequence[StepRecord]) -> dict:
    """The mean bytes per stage of `records`, stepped by dec."""
    return {"stage_bytes": mean_bytes(floor_model_of(dec), list(records))}


def verify_flops(dec: Decoder, records: Sequence[StepRecord]) -> dict:
    """The mean FLOPs of the verify's parts over `records`: each node attends the prefix and its visible tree rows."""
    flops = TargetFlops.of(dec.model.cfg)
    per_step = [flops.verify_flops(r.tree.num_nodes, r.tree.num_nodes * r.prefix_len + int(r.tree.visibility.sum()))
                for r in records]
    return {"verify_flops": {part: sum(s[part] for s in per_step) / len(per_step) for part in per_step[0]}}


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


def add_rooflines(rows: list[dict], bytes_per_s: float, flops_per_s: float) -> None:
    """Each row's roofline floor (ms, after add_stage_floors): its stages' bytes floors, each verify part's raised to
    its FLOPs over the matmul rate where that takes longer (a large tree's lm_head and attention)."""
    for row in (r for r in rows if "error" not in r and "verify_flops" in r):
        floor = row["floor_ms"] - (row.get("floor_ms_verify") or 0.0)
        for part, flops in row["verify_flops"].items():
            floor += max(row.get(f"floor_ms_verify/{part}") or 0.0, flops / flops_per_s * 1e3)
        row["roofline_ms"] = floor


def floor_columns(key_columns: Sequence[Column]) -> list[Column]:
    """The row's key columns, then per stage its floor (ms) and its time over it."""
    out = list(key_columns)
    for stage in FLOOR_STAGES:
        name = stage.replace("verify/", "v.")
        out += [Column(f"floor_ms_{stage}", f"{name} floor ms", "{:.4f}"),
                Column(f"over_floor_{stage}", f"{name} x", "{:.2f}")]
    return out


KIMI_K2_LAYERS = 61  # Kimi-K2's depth: one dense layer, then MoE layers


def add_drafter_shares(rows: list[dict], cfg, num_layers: int = KIMI_K2_LAYERS) -> None:
    """Each drafting row's drafter (its forward and its context update, stage-timed) against its own bytes floor,
    as a share of the measured step, and as a share of the step of a num_layers-deep model extrapolated from the
    per-layer stage times (attention per layer, the dense MLP and the MoE layers each at their own mean; the
    rest of the step as measured): beside a shallow target the drafter's share is inflated. The chain row's drafter
    parts timed as graph replays also get their floors (add_drafter_part_floors)."""
    num_dense = cfg.first_k_dense_replace
    num_moe = cfg.num_hidden_layers - num_dense
    for row in rows:
        times = row.get("stage_ms") or {}
        stages = stage_times_ms(times)
        drafter = sum(stages.get(s, 0.0) for s in DRAFTER_STAGES)
        if not drafter or "step" not in times or not row.get("floor_ms_draft"):  # the oracle reads nothing
            continue
        attn = stages.get("verify/attn", 0.0) / cfg.num_hidden_layers
        dense = _layers_ms(times, "mlp") / num_dense if num_dense else 0.0
        moe = _layers_ms(times, "moe") / num_moe if num_moe else 0.0
        measured_layers = attn * cfg.num_hidden_layers + dense * num_dense + moe * num_moe
        full_layers = attn * num_layers + dense * num_dense + moe * (num_layers - num_dense)
        floor = row["floor_ms_draft"] + (row.get("floor_ms_draft_update") or 0.0)
        row.update(drafter_ms=drafter, drafter_floor_ms=floor, drafter_over_floor=over_floor(drafter, floor),
                   drafter_share=drafter / times["step"], full_depth_step_ms=times["step"] - measured_layers
                   + full_layers)
        row["drafter_share_full_depth"] = drafter / row["full_depth_step_ms"]
    add_drafter_part_floors(rows)


DRAFTER_PARTS = {"forward": "draft", "update": "draft_update"}  # a part timed alone -> the stage whose floor it has


def add_drafter_part_floors(rows: list[dict]) -> None:
    """The rows whose drafter parts were timed as CUDA-graph replays (decode_steps.drafter_replays: the chain row;
    None on the CPU): each part against its stage's floor (add_stage_floors), and time / floor."""
    for row in (r for r in rows if "drafter_forward_graph_ms" in r):
        for part, stage in DRAFTER_PARTS.items():
            floor = row.get(f"floor_ms_{stage}")
            row[f"drafter_{part}_floor_ms"] = floor
            row[f"drafter_{part}_over_floor"] = over_floor(row[f"drafter_{part}_graph_ms"], floor)


def _layers_ms(ranges_ms: dict[str, float], part: str) -> float:
    """The time of one part ("mlp", "moe") summed over the layers, per-layer ranges or collapsed ("layer*")."""
    return sum(v for k, v in ranges_ms.items() if re.fullmatch(rf"step/verify/layer(\d+|\*)/{part}", k))


def drafter_columns(key_columns: Sequence[Column]) -> list[Column]:
    """The stage-timed drafter, its parts as graph replays (the chain row), each against its floor, and the shares."""
    parts = [Column(f"drafter_{part}_{key}", f"{part} {header}", fmt) for part in DRAFTER_PARTS
             for key, header, fmt in (("graph_ms", "graph ms", "{:.3f}"), ("floor_ms", "floor ms", "{:.3f}"),
                                      ("over_floor", "x", "{:.2f}"))]
    return [*key_columns, Column("drafter_ms", "drafter ms", "{:.3f}"),
            Column("drafter_floor_ms", "drafter floor ms", "{:.3f}"), Column("drafter_over_floor", "x", "{:.2f}"),
            *parts,
            Column("drafter_share", "share of the step", "{:.1%}"),
            Column("full_depth_step_ms", f"{KIMI_K2_LAYERS}-layer step ms", "{:.2f}"),
            Column("drafter_share_full_depth", f"share at {KIMI_K2_LAYERS} layers", "{:.1%}")]
