"""Honest tau on hand-built records: tau pooled over runs as total tokens over total steps, the tau of the steps on
new text (profiling/repeated_text.py's rule, on constructed repeating sequences) and the distinct-4-gram rate, and
that the summaries, report.json (schema, read back, an older report without them) and report.html carry them."""
from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
from fake_records import fake_runs

from engine.config import DecodeConfig
from engine.decoding.session import decode_runs
from engine.drafters import DrafterSpec
from engine.records import RunRecord, StepRecord, TreeRecord
from engine.training.ngrams import distinct_ngram_rate
from profiling import metrics, report
from profiling.measurement import Measurement
from profiling.report_reader import read_report
from profiling.schema import REPORT_SCHEMA
from profiling.tau_text import summary_beside_tau

FIELDS = ("new_text_tau", "new_text_steps", "distinct_4gram_rate")


def chain_step(index: int, context: list[int], drafted: list[int], num_accepted: int, bonus: int,
               other_first: int | None = None) -> StepRecord:
    """A chain step rooted at context[-1] that drafted `drafted` (depth 1, 2, ...), accepted its first num_accepted
    and committed them plus `bonus`; other_first adds a depth-1 sibling of rank 1 (a DDTree's second guess)."""
    tokens, parents = [context[-1], *drafted], [-1, *range(len(drafted))]
    depths, ranks = list(range(len(drafted) + 1)), [0] * (len(drafted) + 1)
    if other_first is not None:
        tokens, parents, depths, ranks = tokens + [other_first], parents + [0], depths + [1], ranks + [1]
    n = len(tokens)
    path = list(range(num_accepted + 1))
    target = [*drafted[:num_accepted], bonus] + [0] * (n - num_accepted - 1)
    committed = [*drafted[:num_accepted], bonus]
    visibility = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            visibility[i, j] = True
            j = parents[j]
    tree = TreeRecord(tokens=tokens, parents=parents, depths=depths, ranks=ranks, scores=[0.0] * n,
                      visibility=visibility)
    return StepRecord(index=index, mode="ddtree", prefix_len=len(context) - 1, tree=tree, target=target,
                      logit_gap=[1.0] * n, path=path, bonus=bonus, committed=committed)


def hand_run(prompt: list[int], first_token: int, steps: list[tuple]) -> RunRecord:
    """A DDTree run of chain steps, each (drafted, num_accepted, bonus[, other_first]), rooted where the last ended."""
    context, records = [*prompt, first_token], []
    for spec in steps:
        records.append(chain_step(len(records), context, *spec))
        context += records[-1].committed
    cfg = DecodeConfig(budget=8, block_size=5, max_new_tokens=len(context) - len(prompt))
    return RunRecord(mode="ddtree", model={}, decode=cfg.to_dict(), prompt=prompt, first_token=first_token,
                     steps=records, prefill_ns=1, tokens=context[len(prompt):])


def test_tau_over_several_runs_is_all_their_tokens_over_all_their_steps():
    runs = [fake_runs(seed, max_new=random.randint(6, 40))["ddtree"] for seed in random.sample(range(10_000), 5)]
    tokens = steps = 0
    for run in runs:  # brute force: every step's committed tokens, one by one
        for step in run.steps:
            steps += 1
            for _ in step.committed:
                tokens += 1
    assert metrics.pooled_tau(runs) == pytest.approx(tokens / steps)
    assert metrics.pooled_tau(runs[:1]) == metrics.tau(runs[0])
    assert metrics.pooled_tau([]) is None
    one_long_step = hand_run([1, 2, 3], 4, [([5, 6, 7, 8], 4, 9)])  # 5 tokens in 1 step
    four_short = hand_run([1, 2, 3], 4, [([9], 0, 5)] * 4)  # 4 tokens in 4 steps
    assert metrics.pooled_tau([one_long_step, four_short]) == pytest.approx(9 / 5), "not (5 + 1) / 2"


def test_a_step_whose_first_drafted_token_continues_a_repeat_is_left_out_of_the_new_text_tau():
    # context 10 11 12 13 10; the loop 11 12 13 10 comes round again
    run = hand_run([10, 11, 12, 13], 10, [
        ([11, 12, 13], 3, 10),  # 12 13 10 11 has not occurred yet: new text, 4 tokens
        ([11, 12, 13], 3, 10),  # 12 13 10 11 occurred (positions 2-5): repeated, 4 tokens
        ([7, 8, 9], 0, 5),  # 12 13 10 7: new text, 1 token
        ([11, 12], 1, 6, 13),  # 13 10 5 11: new, 2 tokens
        ([12, 9], 0, 11, 10),  # 5 11 6 12: new (so would its rank-1 guess's 5 11 6 10 be): 1 token
    ])
    assert metrics.repeated_steps(run) == [False, True, False, False, False]
    assert metrics.new_text_tau([run]) == (pytest.approx((4 + 1 + 2 + 1) / 4), 4)
    assert metrics.tau(run) == pytest.approx(12 / 5)
    looping = hand_run([1, 2, 3, 1, 2, 3], 1, [([2, 3], 2, 1)] * 3)  # every step continues the loop
    assert metrics.new_text_tau([looping]) == (None, 0)
    assert metrics.new_text_tau([run, looping]) == (pytest.approx(8 / 4), 4), "pooled over the runs"


def test_only_the_depth_one_top_guess_counts_and_a_step_without_a_draft_is_new_text():
    # rank 1 at depth 1 repeats (1 2 3 4 seen), rank 0 does not
    assert metrics.repeated_steps(hand_run([1, 2, 3, 4, 1, 2], 3, [([7], 0, 4, 4)])) == [False]
    assert metrics.repeated_steps(hand_run([1, 2, 3, 4, 1, 2], 3, [([4], 0, 7, 7)])) == [True]
    assert metrics.repeated_steps(hand_run([1, 2, 3, 4, 1, 2], 3, [([], 0, 4)])) == [False], "nothing drafted"
    assert metrics.repeated_steps(hand_run([], 3, [([3], 0, 3)])) == [False], "fewer than 3 tokens before it"


@pytest.mark.parametrize("filler, repeated", [(25, True), (26, False)])
def test_the_repeat_is_looked_for_among_the_last_32_tokens_only(filler, repeated):
    """1 2 3 4 opens the context; the step drafts 4 after 1 2 3: inside the last 32 tokens while the context holds
    at most 32 (4 + filler + 3)."""
    prompt = [1, 2, 3, 4, *range(100, 100 + filler), 1, 2]
    assert metrics.repeated_steps(hand_run(prompt, 3, [([4], 1, 5)])) == [repeated]


def test_the_distinct_4gram_rate_of_runs_is_the_training_code_s():
    loop = hand_run([1], 2, [([1, 2], 1, 2)] * 9)  # tokens 2 1 2 1 2 ...: two distinct 4-grams
    counting = hand_run([1], 2, [([3, 4, 5], 3, 6), ([7, 8, 9], 2, 10)])
    assert loop.tokens[:4] == [2, 1, 2, 1] and len(loop.tokens) == 19
    assert metrics.distinct_4gram_rate([loop]) == pytest.approx(2 / 16)
    assert metrics.distinct_4gram_rate([counting]) == 1.0
    assert metrics.distinct_4gram_rate([loop, counting]) == pytest.approx((2 / 16 + 1) / 2), "rows of two lengths"
    assert metrics.distinct_4gram_rate([hand_run([1], 2, [([3], 1, 4)])]) is None, "3 tokens: no 4-gram"
    assert distinct_ngram_rate([[1, 2] * 10]) == pytest.approx(2 / 17)
    with pytest.raises(ValueError, match="n=4"):
        distinct_ngram_rate([[1, 2, 3, 4], [1, 2]])


def test_the_summaries_carry_the_new_text_tau_and_the_distinct_rate():
    runs = fake_runs(random.randrange(10_000), max_new=30)
    summary = metrics.summarize_runs(runs)["ddtree"]
    tau, num_steps = metrics.new_text_tau([runs["ddtree"]])
    assert (summary["new_text_tau"], summary["new_text_steps"]) == (tau, num_steps)
    assert summary["distinct_4gram_rate"] == distinct_ngram_rate([runs["ddtree"].tokens])
    assert summary["tau"] == metrics.pooled_tau([runs["ddtree"]])


def test_report_json_and_report_html_carry_them_and_an_older_report_still_reads(tiny_checkpoint):
    cfg = DecodeConfig(budget=random.randint(3, 12), block_size=4, max_new_tokens=24)
    runs = decode_runs(tiny_checkpoint, tiny_checkpoint.prompt.tolist(), cfg, DrafterSpec(noise=0.3),
                       ("chain", "ddtree"))
    measurement = Measurement.of(runs)
    data = report.render(measurement, "report.json")
    doc = json.loads(data)
    jsonschema.validate(doc, REPORT_SCHEMA)
    for mode, run in runs.items():
        if mode == "ar":
            continue
        summary = doc["summaries"][mode]
        assert [summary[f] for f in FIELDS] == [*metrics.new_text_tau([run]), metrics.distinct_4gram_rate([run])]
    read = read_report(data, "report.json").summaries
    assert all(read[m][f] == measurement.summaries[m][f] for m in read for f in ("tau", *FIELDS))

    older = json.loads(data)
    for summary in older["summaries"].values():
        for field in FIELDS:
            del summary[field]
    jsonschema.validate(older, REPORT_SCHEMA)
    read = read_report(json.dumps(older).encode(), "report.json").summaries
    assert all(read[m][f] == measurement.summaries[m][f] for m in read for f in FIELDS), "filled in from the steps"

    page = report.render(measurement, "report.html").decode()
    headline = page[page.index("<h2>Headline</h2>"):page.index("<h2>Text</h2>")]
    assert "tau on new text" in headline and "distinct-4" in headline
    assert all(summary_beside_tau(summary) in headline for summary in measurement.summaries.values())
