"""JSON Schema (draft 2020-12) of report.json. Bump SCHEMA_VERSION on any change a reader would notice.

Fields added within a version are optional, so every earlier report of that version stays valid; the writer
always writes them, and the reader (profiling/report_reader.py) says what it does where they are missing.
"""
from __future__ import annotations

from engine.records import MODES
from profiling.repeats import RANGE_COLUMNS, STAT_FIELDS, STATISTICS

SCHEMA_VERSION = 2  # 2: any set of runs (AR, chain, DDTree), a summary per speculative run

_INT = {"type": "integer"}
_NUM = {"type": "number"}
_OPT_NUM = {"type": ["number", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_STR = {"type": ["string", "null"], "description": "as text (null: the model has no tokenizer)"}
_INTS = {"type": "array", "items": _INT}
_NUMS = {"type": "array", "items": _NUM}
_MODE = {"enum": list(MODES)}
_SPEC_MODE = {"enum": [m for m in MODES if m != "ar"]}


def _object(properties: dict, required: list[str] | None = None, extra: bool = False) -> dict:
    return {"type": "object", "properties": properties, "required": required or list(properties),
            "additionalProperties": extra}


TREE = _object({
    "tokens": _INTS, "parents": _INTS, "depths": _INTS, "ranks": _INTS,
    "scores": {"type": "array", "items": _OPT_NUM, "description": "cumulative draft log-prob; null: padding (-inf)"},
    "visible": {"type": "array", "items": _INTS, "description": "row i: the nodes node i sees (itself, ancestors)"},
})

_STEP_FIELDS = {
    "mode": _MODE, "index": _INT, "prefix_len": _INT, "tree": TREE, "target": _INTS, "logit_gap": _NUMS,
    "path": _INTS, "bonus": _INT, "committed": _INTS, "num_accepted": _INT, "num_committed": _INT,
    "wall_ns": _INT, "committed_text": _OPT_STR,
    "timings_ns": {"type": "object", "additionalProperties": _INT},
    "spans": {"type": ["array", "null"], "description": "[name, start_ns from the step start, dur_ns]; null: "
              "the record has per-name totals only",
              "items": {"type": "array", "prefixItems": [{"type": "string"}, _INT, _INT], "minItems": 3,
                        "maxItems": 3}},
    "probs": {"oneOf": [{"type": "null"}, _object({
        "target": _NUMS, "draft": _NUMS, "move_on": _NUMS, "expected_accepted": _NUM, "draft_expected": _NUM},
    )], "description": "per node: the target's probability of its token given its ancestors, the drafter's "
                       "marginal, the target's mass on its children; per step: the expected accepted drafted "
                       "tokens under the target and the drafter's surrogate (engine/decoding/node_probs.py)"},
}
STEP_EXPERTS = {"oneOf": [{"type": "null"}, _object({
    "touched": {"type": "array", "items": {"type": "integer", "minimum": 0}}, "bytes_per_expert": _INT,
    "bytes_read": _INT})],
    "description": "per MoE layer, the distinct routed experts the verify's nodes chose; one expert's gate/up/down "
                   "bytes in the run's dtype; touched (all layers) x bytes_per_expert. null: no MoE layer"}
_BUDGET_FIELDS = {
    "chosen": _INT, "drafted": {"type": "boolean"}, "buckets": _INTS, "expected": _NUMS, "cost_s": _NUMS,
    "value": _NUMS, "confidence": {"type": "array", "items": _NUMS}}
# built came later: optional (read as the largest bucket), so earlier reports stay valid.
STEP_BUDGET = {"oneOf": [{"type": "null"}, _object({**_BUDGET_FIELDS, "built": _INT}, list(_BUDGET_FIELDS))],
    "description": "--budget auto's decision (engine.records.BudgetChoice): the best bucket, whether the step "
                   "drafted, per bucket the expected accepted drafted tokens, the predicted step seconds and their "
                   "ratio, the confidence correction per depth and rank class, and the nodes the tree was built "
                   "with. null: a fixed budget"}
# experts and budget came later: optional, so earlier reports stay valid.
STEP = _object({**_STEP_FIELDS, "experts": STEP_EXPERTS, "budget": STEP_BUDGET}, list(_STEP_FIELDS))

_COUNT = {"type": "integer", "minimum": 0}
# profiling.repeats.stats(): every field null (n 0) where no repeat had the value
STATS = _object({**{k: _OPT_NUM for k in STAT_FIELDS if k != "n"}, "n": _COUNT})
_KERNEL_FIELDS = {
    "mode": _MODE, "name": {"type": "string"}, "parent": {"type": ["string", "null"]}, "depth": _INT,
    "leaf": {"type": "boolean"}, "count": _INT, "total_ms": _NUM, "mean_ms": _NUM, "p50_ms": _NUM, "p95_ms": _NUM,
    "self_ms": _NUM, "share": _OPT_NUM, "profiler_cpu_ms": _OPT_NUM, "device_ms": _OPT_NUM,
}
# The spread of mean_ms over the repeats came later: optional, so earlier reports stay valid.
KERNEL_ROW = _object({**_KERNEL_FIELDS, **{c: _COUNT if c.endswith("_n") else _OPT_NUM for c in RANGE_COLUMNS}},
                     list(_KERNEL_FIELDS))
REPEATS = _object({
    "count": {"type": "integer", "minimum": 1, "description": "R: the measured repeats (after one warm-up)"},
    "modes": {"type": "object", "propertyNames": _MODE, "additionalProperties": _object({k: STATS for k in STATISTICS}),
              "description": "per mode, each statistic over the R repeats (profiling/repeats.py)"},
})
VOCABULARY = {"oneOf": [{"type": "null"}, {
    "type": "object", "propertyNames": {"pattern": "^(0|[1-9][0-9]{0,9})$"},
    "additionalProperties": _object({"piece": {"type": "string"},
                                     "bytes": {"type": "string", "pattern": "^([0-9a-f]{2})*$"}})}],
    "description": "token id -> its display piece and the bytes it stands for (hex), for every id the report "
                   "mentions; null: the model has no tokenizer"}

DIVERGENCE = _object({
    "position": _INT, "ar_token": _OPT_INT, "token": _OPT_INT, "logit_gap": _OPT_NUM,
    "token_gap": _OPT_NUM, "step": _OPT_INT,
    "kind": {"enum": ["numerics near tie", "real divergence"], "description": "profiling/divergence.py's rule"},
    "score_gap": {**_OPT_NUM, "description": "how far below AR's pick AR scored the token (logit, or sampled score)"},
    "tolerance": {**_OPT_NUM, "description": "the near-tie tolerance at that position"},
})

EXPERT_TRAFFIC = {"oneOf": [{"type": "null"}, _object({
    "touched": _NUMS, "touched_total": _NUM, "bytes_read": _NUM, "bytes_per_token": _NUM})],
    "description": "mean per step of the routed experts the verify touched (per MoE layer, and in all), the weight "
                   "bytes that reads, and those bytes per committed token; null: no MoE layer (metrics.expert_traffic)"}

_SUMMARY_FIELDS = {
    "mode": _SPEC_MODE, "matches_ar": {"type": "boolean"},
    "exactness": {"enum": ["greedy-exact", "seed-matched exact"], "description": "what matches_ar checks"},
    "ar_tokens": _INTS, "tokens": _INTS, "ar_text": _OPT_STR, "text": _OPT_STR, "num_generated": _INT,
    "num_steps": _INT, "ar_num_steps": _INT, "block_size": _INT, "budget": _INT, "tau": _OPT_NUM,
    "per_position_acceptance": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}},
    "acceptance_histogram": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "ar_time_ms": _NUM, "time_ms": _NUM, "ar_prefill_ms": _NUM, "prefill_ms": _NUM,
    "ar_tokens_per_s": _OPT_NUM, "tokens_per_s": _OPT_NUM, "speedup": _OPT_NUM,
    "first_divergence": {"oneOf": [{"type": "null"}, DIVERGENCE]},
}
HONEST_TAU = {
    "new_text_tau": {**_OPT_NUM, "description": "tau over the steps that do not start on repeated text "
                     "(profiling/repeated_text.py's rule); null: every step did"},
    "new_text_steps": {**_COUNT, "description": "how many steps new_text_tau is over"},
    "distinct_4gram_rate": {"type": ["number", "null"], "minimum": 0, "maximum": 1,
                            "description": "distinct 4-grams over all 4-grams of the generated tokens; null: fewer "
                                           "than 4 tokens"},
}
# The expert traffic and the honest-tau fields came later: optional, so earlier reports stay valid.
SUMMARY = _object({**_SUMMARY_FIELDS, "ar_expert_traffic": EXPERT_TRAFFIC, "expert_traffic": EXPERT_TRAFFIC,
                   **HONEST_TAU}, list(_SUMMARY_FIELDS))

_ENVIRONMENT_FIELDS = {
    "torch": {"type": "string"}, "cuda": {"type": ["string", "null"]}, "cuda_available": {"type": "boolean"},
    "device": {"type": "string"}, "device_name": {"type": "string"}, "git_commit": {"type": ["string", "null"]},
    "python": {"type": "string"}, "platform": {"type": "string"},
}
# git_dirty came later: optional, so earlier reports stay valid.
ENVIRONMENT = _object({**_ENVIRONMENT_FIELDS, "git_dirty": {"type": ["boolean", "null"]}}, list(_ENVIRONMENT_FIELDS))

RUN = _object({
    "mode": _MODE, "first_token": _INT, "prefill_ns": _INT, "wall_ns": _INT, "num_steps": _INT, "tokens": _INTS,
    "prompt_text": _OPT_STR, "text": _OPT_STR,
})

CAPTURE_RANGE = _object({"name": {"type": "string"}, "count": _INT, "cpu_ms": _NUM, "device_ms": _NUM})
CAPTURE_OP = _object({"range": {"type": ["string", "null"]}, "name": {"type": "string"}, "count": _INT,
                      "cpu_ms": _NUM, "device_ms": _NUM})
CAPTURE_KERNEL = _object({"name": {"type": "string"}, "stream": _INT, "step": _OPT_INT,
                          "range": {"type": ["string", "null"]}, "start_ns": _INT, "dur_ns": _INT})
CAPTURE_RUN = _object({"ranges": {"type": "array", "items": CAPTURE_RANGE},
                       "ops": {"type": "array", "items": CAPTURE_OP},
                       "kernels": {"type": "array", "items": CAPTURE_KERNEL}})
CAPTURE = _object({"activities": {"type": "array", "items": {"enum": ["cpu", "cuda"]}},
                   "runs": {"type": "object", "propertyNames": _MODE, "additionalProperties": CAPTURE_RUN}})

PARALLEL = _object({"world_size": _INT, "backend": {"type": "string"}, "heads_per_rank": _INT,
                    "experts_per_rank": _INT})  # engine.model.parallel.Shard.layout: the run's tensor/expert layout
_REPORT_FIELDS = {
    "schema_version": {"const": SCHEMA_VERSION},
    "environment": ENVIRONMENT,
    "config": _object({"model": {"type": "object"}, "decode": {"type": "object"},
                       "drafter": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                       "prompt": _INTS, "modes": {"type": "array", "items": _MODE},
                       "parallel": {"oneOf": [{"type": "null"}, PARALLEL]}},
                      ["model", "decode", "drafter", "prompt", "modes"]),  # parallel came later: optional
    "primary": _SPEC_MODE,
    "summaries": {"type": "object", "propertyNames": _SPEC_MODE, "additionalProperties": SUMMARY,
                  "minProperties": 1},
    "runs": {"type": "object", "propertyNames": _MODE, "additionalProperties": RUN, "required": ["ar"]},
    "steps": {"type": "array", "items": STEP},
    "kernels": {"type": "array", "items": KERNEL_ROW},
    "capture": {"oneOf": [{"type": "null"}, CAPTURE]},
}
REPORT_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "DDTree Studio report",
    # repeats and vocabulary came later: optional, so earlier reports stay valid.
    **_object({**_REPORT_FIELDS, "repeats": REPEATS, "vocabulary": VOCABULARY}, list(_REPORT_FIELDS)),
}
