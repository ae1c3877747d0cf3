"""Which speculative steps start on repeated text: the rule behind profiling.metrics.new_text_tau.

A target that loops makes its drafter's guesses easy, so a headline tau can be mostly the target repeating
itself. The rule: a step starts on repeated text when the REPEAT_N-gram formed by the last REPEAT_N - 1 tokens
before it and its first drafted token (the tree's depth-1 node of rank 0: the drafter's top guess) occurs among the
last REPEAT_WINDOW tokens before it. The tokens before a step are its context: the prompt, the prefill's token, then
every token the steps before it committed. A step that drafted nothing (an auto budget's back-off AR step), or one
whose context is shorter than REPEAT_N - 1 tokens, is on new text.
"""
from __future__ import annotations

from collections.abc import Sequence

from engine.records import RunRecord, StepRecord

REPEAT_N = 4  # the n-gram: the last REPEAT_N - 1 tokens before a step and its first drafted token
REPEAT_WINDOW = 32  # looked for among this many last tokens before the step
RULE = (f"a step is on repeated text when the {REPEAT_N}-gram of the {REPEAT_N - 1} tokens before it and its first "
        f"drafted token (depth 1, rank 0) occurs among the last {REPEAT_WINDOW} tokens before it")


def first_drafted_token(step: StepRecord) -> int | None:
    """The drafter's top guess at depth 1: the token of the tree's depth-1 node of rank 0 (None: nothing drafted)."""
    tree = step.tree
    return next((token for token, parent, depth, rank in zip(tree.tokens, tree.parents, tree.depths, tree.ranks,
                                                             strict=True) if parent == 0 and depth == 1 and rank == 0),
                None)


def repeats_context(context: Sequence[int], token: int | None) -> bool:
    """Whether the REPEAT_N-gram of context's last REPEAT_N - 1 tokens and `token` occurs among context's last
    REPEAT_WINDOW tokens (False for no token, or a context shorter than REPEAT_N - 1)."""
    if token is None or len(context) < REPEAT_N - 1:
        return False
    window = list(context[-REPEAT_WINDOW:])
    gram = [*context[len(context) - (REPEAT_N - 1):], token]
    return any(window[i:i + REPEAT_N] == gram for i in range(len(window) - REPEAT_N + 1))


def repeated_steps(run: RunRecord) -> list[bool]:
    """Per step, whether it starts on repeated text: its first drafted token repeats the context before it
    (repeats_context over the prompt, the prefill's token and the committed tokens of the steps before it)."""
    context = [*run.prompt, run.first_token]
    out = []
    for step in run.steps:
        out.append(repeats_context(context, first_drafted_token(step)))
        context += step.committed
    return out
