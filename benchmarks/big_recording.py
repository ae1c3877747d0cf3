"""A legitimate recording of any size, built in seconds: what the reader's size limits are measured against.

A decode of hundreds of steps at B = 1024 takes the tiny fixture many minutes on a CPU; these records keep every
rule a real one keeps (profiling/report_checks.py: trees in pop order with the ancestor closure as their mask, the
path the target's picks, each step where the last left the cache, the summaries and statistics computed by the
writer) with trees drawn once and reused, so only the writing costs time. The DDTree run accepts every drafted
token (as the oracle drafter without noise does) and AR emits the same tokens.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from engine.config import DecodeConfig
from engine.drafters import DrafterSpec
from engine.model.fixtures import tiny_config
from engine.records import ExpertTraffic, NodeProbs, RunRecord, StepRecord, TreeRecord
from profiling import report_reader
from profiling.export_json import build_report
from profiling.measurement import Measurement

_TREE_SHAPES = 4  # distinct trees the DDTree steps cycle through
_STAGES = ("draft", "tree_build", "verify", "tree_accept", "kv_compact", "commit", "draft_update")


@dataclasses.dataclass(frozen=True, slots=True)
class _Shape:
    """One drafted tree of budget B whose first L nodes are the accepted chain (node j at depth j)."""

    parents: list[int]
    depths: list[int]
    ranks: list[int]
    scores: list[float]
    visibility: np.ndarray  # [B+1, B+1] bool
    side_tokens: list[int]  # the tokens of the nodes off the chain: never the target's pick, so never accepted
    side_targets: list[int]
    logit_gap: list[float]
    probs: NodeProbs


def _shape(rng: np.random.Generator, budget: int, num_draft: int, vocab: int) -> _Shape:
    n = budget + 1
    parents, depths, ranks = [-1], [0], [0]
    children = {0: 0}
    for i in range(1, n):
        parent = i - 1 if i <= num_draft else int(rng.choice([p for p in range(i) if depths[p] < num_draft]))
        parents.append(parent)
        depths.append(depths[parent] + 1)
        ranks.append(children.get(parent, 0))
        children[parent] = ranks[-1] + 1
        children[i] = 0
    visibility = np.eye(n, dtype=bool)
    for i in range(1, n):
        visibility[i] |= visibility[parents[i]]
    scores = [0.0]
    for i in range(1, n):
        scores.append(scores[parents[i]] + float(np.log(rng.uniform(0.05, 1.0))))
    side = n - 1 - num_draft
    probs = NodeProbs(target=[1.0] * (num_draft + 1) + [0.0] * side, draft=rng.uniform(0, 1, n).tolist(),
                      move_on=[1.0] * num_draft + [0.0] * (side + 1), expected_accepted=float(num_draft),
                      draft_expected=float(num_draft) * 0.9)
    return _Shape(parents, depths, ranks, scores, visibility,
                  side_tokens=rng.integers(vocab // 2, vocab, side).tolist(),
                  side_targets=rng.integers(0, vocab, side).tolist(), logit_gap=rng.uniform(0, 5, n).tolist(),
                  probs=probs)


def _timed(mode: str, num_layers: int) -> tuple[dict[str, int], list[tuple[str, int, int]]]:
    """A step's nested ranges: every stage 10 us, each verify layer's attention and MLP 20 us."""
    names = [f"step/{s}" for s in _STAGES if mode != "ar" or not s.startswith("draft")]
    layers = [f"step/verify/layer{i}/{part}" for i in range(num_layers) for part in ("attn", "mlp")]
    timings = {name: 20_000 for name in layers}
    timings.update({name: 10_000 for name in names})
    timings["step/verify"] = 10_000 + 20_000 * len(layers)
    timings["step"] = sum(v for k, v in timings.items() if k.count("/") == 1)
    spans, start = [("step", 0, timings["step"])], 0
    for name in names:
        spans.append((name, start, timings[name]))
        start += timings[name]
    return timings, spans


def _step(mode: str, index: int, prefix_len: int, tree: TreeRecord, target: list[int], gap: list[float],
          path: list[int], probs: NodeProbs | None, experts: ExpertTraffic, timed: tuple) -> StepRecord:
    committed = [target[node] for node in path]
    return StepRecord(index=index, mode=mode, prefix_len=prefix_len, tree=tree, target=target, logit_gap=gap,
                      path=path, bonus=committed[-1], committed=committed, timings_ns=timed[0],
                      wall_ns=timed[0]["step"] + 5_000, spans=timed[1], probs=probs, experts=experts)


def big_measurement(num_steps: int, budget: int = 1024, block_size: int = 8, seed: int = 0) -> Measurement:
    """AR and DDTree runs of num_steps DDTree steps at budget B, each committing block_size tokens."""
    rng = np.random.default_rng(seed)
    model = dataclasses.replace(tiny_config(), max_position_embeddings=2**20)
    num_draft, vocab = block_size - 1, model.vocab_size
    max_new = 1 + num_steps * block_size
    decode = DecodeConfig(budget=budget, block_size=block_size, max_new_tokens=max_new)
    drafter = DrafterSpec(noise=0.0, seed=seed)
    prompt = rng.integers(0, vocab, 8).tolist()
    tokens = rng.integers(0, vocab // 2, max_new).tolist()  # the chain's picks: below vocab / 2, the side tokens above
    shapes = [_shape(rng, budget, num_draft, vocab) for _ in range(_TREE_SHAPES)]
    layers = model.num_hidden_layers - model.first_k_dense_replace
    experts = ExpertTraffic([model.n_routed_experts] * layers, 24_576)
    runs = {}
    for mode in ("ar", "ddtree"):
        timed, steps, done = _timed(mode, model.num_hidden_layers), [], 1
        while done < max_new:
            root = tokens[done - 1]
            if mode == "ar":
                tree = TreeRecord([root], [-1], [0], [0], [0.0], np.ones((1, 1), dtype=bool))
                step = _step(mode, len(steps), len(prompt) + done - 1, tree, [tokens[done]], [1.0], [0],
                             NodeProbs([1.0], [1.0], [0.0], 0.0, 0.0), ExpertTraffic([2] * layers, 24_576), timed)
            else:
                s = shapes[len(steps) % _TREE_SHAPES]
                picks = tokens[done:done + block_size]
                tree = TreeRecord([root, *picks[:-1], *s.side_tokens], s.parents, s.depths, s.ranks, s.scores,
                                  s.visibility)
                step = _step(mode, len(steps), len(prompt) + done - 1, tree, [*picks, *s.side_targets], s.logit_gap,
                             list(range(block_size)), s.probs, experts, timed)
            steps.append(step)
            done += step.num_committed
        runs[mode] = RunRecord(mode=mode, model=model.to_dict(), decode=decode.to_dict(), prompt=prompt,
                               first_token=tokens[0], steps=steps, prefill_ns=100_000, tokens=tokens,
                               wall_ns=100_000 + sum(s.wall_ns for s in steps),
                               drafter={} if mode == "ar" else {"name": drafter.name, **drafter.settings()})
    return Measurement.of(runs)


def big_report(num_steps: int, **kwargs) -> bytes:
    """big_measurement's report.json as compact JSON: the most records per byte a file of that size can hold (the
    writer indents, profiling/export_json.py, which the reader reads the same way)."""
    return _sized(num_steps, **kwargs)[0]


def _sized(num_steps: int, **kwargs) -> tuple[bytes, tuple[int, int, int]]:
    """big_report and its (bytes, JSON values as the reader counts them, visibility mask cells)."""
    measurement = big_measurement(num_steps, **kwargs)
    data = json.dumps(build_report(measurement), allow_nan=False).encode()
    cells = sum(s.tree.num_nodes ** 2 for run in measurement.runs.values() for s in run.steps)
    return data, (len(data), data.count(b",") + 1, cells)


def largest_admitted(**kwargs) -> bytes:
    """The big_report of the most steps that profiling/report_reader.py's limits admit (MAX_BYTES, MAX_VALUES,
    MAX_MASK_CELLS): each measure grows by about the same amount per step."""
    limits = (report_reader.MAX_BYTES, report_reader.MAX_VALUES, report_reader.MAX_MASK_CELLS)
    one, two = _sized(1, **kwargs)[1], _sized(2, **kwargs)[1]
    num_steps = min((limit - a) // (b - a) + 1 for limit, a, b in zip(limits, one, two, strict=True))
    while True:
        data, measures = _sized(num_steps, **kwargs)
        if all(m <= limit for m, limit in zip(measures, limits, strict=True)):
            return data
        num_steps -= 1
