"""Every stage of a step against its own bytes floor (DESIGN.md, "Cost against the floor"): the bytes the stage must
read (engine/model/read_bytes.py: weights once, the routed experts as the step touched them, the embedding's rows,
the cache rows it attends over) over the copy bandwidth measured in the same process (profiling/bandwidth.py), and
the stage's time over that floor. `run --profile`, the Profile page and the benchmarks read it.

The verify also splits into its ranges (embed, attn over all layers with verify_attn's cache rows, ffn over all
layers, lm_head), so the part of the verify that is off its floor shows as well.
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass

from engine.config import ModelConfig
from engine.loaders.dflash_checkpoint import read_dflash_dir
from engine.loaders.dflash_config import DFlashConfig
from engine.model.read_bytes import DrafterBytes, TargetBytes, commit_bytes, tree_accept_bytes
from engine.records import RunRecord, StepRecord
from profiling.bandwidth import Bandwidth

STAGES = ("draft", "draft_update", "tree_build", "verify", "tree_accept", "kv_compact", "commit")
VERIFY_PARTS = ("embed", "attn", "ffn", "lm_head")  # shown as "verify/<part>"
DRAFTER_STAGES = ("draft", "draft_update")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
_PART_RANGES = {  # verify part -> regular expression of the timer ranges whose times add up to it
    "embed": r"step/verify/embed", "attn": r"step/verify/layer(\d+|\*)/attn",
    "ffn": r"step/verify/layer(\d+|\*)/(mlp|moe)",
    "lm_head": r"step/verify/lm_head"}


@dataclass(frozen=True, slots=True)
class FloorModel:
    """What a run's steps read, by stage: the target's bytes, the drafter's (None: none to read, the oracle; or
    unknown: drafter_known False, its stages get no floor)."""

    target: TargetBytes
    num_draft_positions: int  # L
    drafter: DrafterBytes | None = None
    drafter_known: bool = True

    @classmethod
    def of(cls, cfg: ModelConfig, dtype: str, block_size: int, drafter: DFlashConfig | None = None,
           drafter_known: bool = True) -> FloorModel:
        if dtype not in ITEMSIZE:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(ITEMSIZE)}")
        itemsize = ITEMSIZE[dtype]
        return cls(TargetBytes.of(cfg, itemsize), block_size - 1,
                   None if drafter is None else DrafterBytes.of(drafter, itemsize), drafter_known)

    @classmethod
    def of_run(cls, run: RunRecord) -> FloorModel:
        """The run's model and dtype; a DFlash drafter's shapes read from the checkpoint its record names (not
        readable here, a recording from elsewhere: its stages get no floor). Counted once per model, dtype, block
        and drafter (the Profile page asks on every rerun)."""
        dflash_dir = str(run.drafter.get("model", "")) if run.drafter.get("name") == "dflash" else None
        return _floor_model(json.dumps(run.model, sort_keys=True), str(run.decode["dtype"]),
                            int(run.decode["block_size"]), dflash_dir)

    def step_bytes(self, step: StepRecord) -> dict[str, float | None]:
        """Bytes per stage the step ran ("verify/<part>" beside "verify"; None: unknown). The stages come from the
        step's timings where it has them, else from its mode (an auto budget's draft-free steps skip the draft)."""
        t = self.target
        n = step.tree.num_nodes
        moe_layers = sum(1 for la in t.layers if la.expert)
        touched = step.experts.touched if step.experts is not None else (None if moe_layers else [])
        parts = t.verify_bytes(n, step.prefix_len, touched)
        drafted = step.mode != "ar" and (step.budget is None or step.budget.drafted)
        out: dict[str, float | None] = {}
        if drafted:
            out["draft"] = self._drafter(lambda d: d.propose_bytes(t, self.num_draft_positions + 1, step.prefix_len))
            out["tree_build"] = t.tree_build_bytes(self.num_draft_positions)
        if step.mode != "ar":
            out["draft_update"] = self._drafter(lambda d: d.update_bytes())
        out["verify"] = sum(parts.values())
        out |= {f"verify/{k}": v for k, v in parts.items()}
        out["tree_accept"] = tree_accept_bytes(n)
        out["kv_compact"] = t.kv_compact_bytes(len(step.path))
        out["commit"] = commit_bytes(step.num_committed)
        if step.timings_ns:
            ran = {name.removeprefix("step/") for name in step.timings_ns}
            out = {k: v for k, v in out.items() if k in ran or k.startswith("verify/")}
        return out

    def _drafter(self, count) -> float | None:
        if self.drafter is not None:
            return count(self.drafter)
        return 0.0 if self.drafter_known else None


@functools.lru_cache(maxsize=16)
def _floor_model(model_json: str, dtype: str, block_size: int, dflash_dir: str | None) -> FloorModel:
    drafter, known = None, True
    if dflash_dir is not None:
        try:
            drafter = read_dflash_dir(dflash_dir).config
        except (OSError, ValueError, KeyError, TypeError):
            known = False
    return FloorModel.of(ModelConfig.from_dict(json.loads(model_json)), dtype, block_size, drafter, known)


def stage_times_ms(ranges_ms: dict[str, float]) -> dict[str, float]:
    """Timer ranges (ms; "layer3" or collapsed "layer*") -> the stages' times, the verify's parts summed over the
    layers."""
    out = {s: ranges_ms[f"step/{s}"] for s in STAGES if f"step/{s}" in ranges_ms}
    for part, pattern in _PART_RANGES.items():
        matched = [v for k, v in ranges_ms.items() if re.fullmatch(pattern, k)]
        if matched:
            out[f"verify/{part}"] = sum(matched)
    return out


def step_times_ms(step: StepRecord) -> dict[str, float]:
    return stage_times_ms({k: ns / 1e6 for k, ns in step.timings_ns.items()})


def stage_order() -> list[str]:
    return [name for s in STAGES for name in ([s, *(f"verify/{p}" for p in VERIFY_PARTS)] if s == "verify" else [s])]


# A stage whose bytes take less than this to read (tree_accept, kv_compact, the commit: a few KB) is bound by its
# kernels' launch latency, not by bytes: time over such a floor says nothing, so it is not given.
LATENCY_BOUND_MS = 0.005


def over_floor(time_ms: float | None, floor_ms: float | None) -> float | None:
    """time / floor, None where either is unknown or the floor is under LATENCY_BOUND_MS."""
    if time_ms is None or floor_ms is None or floor_ms < LATENCY_BOUND_MS:
        return None
    return time_ms / floor_ms


@dataclass(frozen=True, slots=True)
class StageFloor:
    """One stage over a run's steps: mean time and bytes per step that ran it, the floor of those bytes at the
    bandwidth, and time / floor (over_floor: None where the floor is unknown or latency-bound)."""

    stage: str
    num_steps: int
    time_ms: float | None  # None: the run's steps were not stage-timed
    num_bytes: float | None
    floor_ms: float | None
    over_floor: float | None

    def to_dict(self) -> dict:
        return {"stage": self.stage, "steps": self.num_steps, "time_ms": self.time_ms, "bytes": self.num_bytes,
                "floor_ms": self.floor_ms, "over_floor": self.over_floor}


def mean_bytes(model: FloorModel, steps: list[StepRecord]) -> dict[str, float | None]:
    """Mean bytes per stage over all the steps, 0 in a step that did not run it (an auto budget's draft-free AR
    step has no draft), as the benchmarks' stage times are means over all their profiled steps (None: unknown in
    one of them)."""
    sums: dict[str, list] = {}
    for step in steps:
        for stage, b in model.step_bytes(step).items():
            sums.setdefault(stage, []).append(b)
    return {s: None if any(b is None for b in v) else sum(v) / len(steps) for s, v in sums.items()}


def stage_floors(model: FloorModel, steps: list[StepRecord], bandwidth: Bandwidth) -> list[StageFloor]:
    """Each stage the steps ran, in step order, against its floor at `bandwidth`."""
    per_step = [(model.step_bytes(s), step_times_ms(s)) for s in steps]
    out = []
    for stage in stage_order():
        ran = [(b[stage], t.get(stage)) for b, t in per_step if stage in b]
        if not ran:
            continue
        num_bytes = None if any(b is None for b, _ in ran) else sum(b for b, _ in ran) / len(ran)
        times = [t for _, t in ran if t is not None]
        time_ms = sum(times) / len(times) if times else None
        floor = None if num_bytes is None else bandwidth.floor_ms(num_bytes)
        out.append(StageFloor(stage, len(ran), time_ms, num_bytes, floor, over_floor(time_ms, floor)))
    return out


def run_floors(runs: dict[str, RunRecord], bandwidth: Bandwidth) -> dict[str, list[StageFloor]]:
    return {mode: stage_floors(FloorModel.of_run(run), run.steps, bandwidth) for mode, run in runs.items()}


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def floor_table(floors: dict[str, list[StageFloor]], labels: dict[str, str], bandwidth: Bandwidth) -> str:
    """The console's table: per run and stage, mean ms per step, MB read, the floor and time / floor."""
    lines = [f"stages against their bytes floor (weights read once, routed experts as touched, the embedding's rows, "
             f"the cache rows attended; at the {bandwidth.text()}, measured in this run):",
             f"{'run':<8}{'stage':<16}{'steps':>6}{'ms/step':>11}{'MB read':>11}{'floor ms':>11}{'time/floor':>12}"]
    for mode, rows in floors.items():
        for r in rows:
            name = ("  " + r.stage.removeprefix("verify/")) if r.stage.startswith("verify/") else r.stage
            mb = None if r.num_bytes is None else r.num_bytes / 1e6
            over = "-" if r.over_floor is None else f"{r.over_floor:.1f}x"
            lines.append(f"{labels.get(mode, mode):<8}{name:<16}{r.num_steps:>6}{_num(r.time_ms, '.3f'):>11}"
                         f"{_num(mb, '.4g'):>11}{_num(r.floor_ms, '.4f'):>11}{over:>12}")
    unknown = [labels.get(m, m) for m, rows in floors.items() if any(r.num_bytes is None for r in rows)]
    if unknown:
        lines.append(f"'-' floors in {', '.join(unknown)}: the drafter's checkpoint named in the record is not "
                     "readable here, so its bytes are unknown")
    return "\n".join(lines)
