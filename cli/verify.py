"""`python -m engine verify`: the moment of truth. AR and the speculative modes against the golden tokens (or,
without golden tokens or in bfloat16, the speculative modes against AR)."""
from __future__ import annotations

import argparse

import numpy as np

from cli import options as opts
from cli.request import request_from_args
from engine.decoding.session import decode_request, golden_for
from engine.records import MODE_LABELS
from profiling.divergence import REAL, verdict
from profiling.metrics import summarize

NAMES = {"ar": "AR", "chain": "CHAIN", "ddtree": "DDTREE"}


def first_mismatch(expected: list[int], got: list[int]) -> int | None:
    for i, (a, b) in enumerate(zip(expected, got, strict=False)):
        if a != b:
            return i
    return None if len(expected) == len(got) else min(len(expected), len(got))


def verify(args: argparse.Namespace) -> int:
    request = request_from_args(args)
    ckpt, prompt, cfg = request.checkpoint, list(request.prompt), request.config
    own = ckpt.golden_tokens is not None and ckpt.prompt is not None and prompt == ckpt.prompt.tolist() \
        and cfg.temperature == 0.0  # golden tokens are greedy
    shown = ckpt.golden_tokens.tolist()[: cfg.max_new_tokens] if own else None
    golden = golden_for(ckpt, prompt, cfg) and shown  # checked against in float32 only
    runs = decode_request(request, warmup=False, profile_timers=False)
    ar = runs["ar"]
    if shown is not None:
        print("golden :", " ".join(map(str, shown)))
    for mode, run in runs.items():
        print(f"{mode:<7}:", " ".join(map(str, run.tokens)))
    for mode, run in runs.items():
        if mode != "ar":
            drafted = run.num_committed - 1  # the prefill's token is not a step's
            print(f"{NAMES[mode].title() if mode == 'chain' else 'DDTree'} stats: steps={run.num_steps} "
                  f"committed={run.num_committed} avg_accept={drafted / max(run.num_steps, 1):.2f} tokens/step "
                  f"(block_size={cfg.block_size})")
    if shown is not None:
        diverged = first_mismatch(shown, ar.tokens)
        shared = len(shown) if diverged is None else diverged + 1  # positions whose logits saw the same prefix
        max_diff = float(np.abs(ar.logits[:shared] - ckpt.golden_logits[:shared]).max())
        scope = "" if diverged is None else f" (positions 0..{shared - 1}, before AR's tokens leave golden's)"
        print(f"max |AR logit - golden logit| = {max_diff:.3e}{scope}")
    # float32 reproduces the float64 golden tokens, so there AR itself must match them; every speculative mode
    # must match AR: exactly, or (in the fast mode) parting from it only at a numerics near tie.
    if golden is not None:
        pos = first_mismatch(golden, ar.tokens)
        if pos is not None:
            got = ar.tokens[pos] if pos < len(ar.tokens) else None
            want = golden[pos] if pos < len(golden) else None
            print(f"FAIL AR differs from golden at position {pos}: golden {want}, ar {got}")
            return 1
    summaries = {mode: summarize(ar, run) for mode, run in runs.items() if mode != "ar"}
    for mode, s in summaries.items():
        if s["first_divergence"] is not None:
            print(verdict(s, MODE_LABELS[mode]))
    failed = [NAMES[m] for m, s in summaries.items() if s["first_divergence"] and s["first_divergence"]["kind"] == REAL]
    if failed:
        print(f"FAIL {' and '.join(failed)} left the AR tokens with a real divergence")
        return 1
    expected = "golden" if golden is not None else "AR"
    joined = " and ".join(f"{NAMES[m]}=={expected}" for m in ((["ar"] if golden is not None else []) + list(summaries)))
    note = "; no golden tokens: checked against AR" if shown is None and cfg.temperature == 0.0 else ""
    if golden is None and shown is not None:
        pos = first_mismatch(shown, ar.tokens[: len(shown)])
        note = "" if pos is None else f"; {cfg.dtype} AR leaves the float64 golden tokens at position {pos}"
    where = "" if cfg.dtype == "float32" else f" in {cfg.dtype}"
    near = [MODE_LABELS[m] for m, s in summaries.items() if s["first_divergence"]]
    term = "greedy-exact" if cfg.temperature == 0.0 else f"seed-matched exact ({cfg.sampling})"
    if near:
        print(f"PASS model_ddtree{where} ({len(ar.tokens)} tokens): {' and '.join(near)} parted from AR at a "
              f"numerics near tie, the rest {term}{note}")
    else:
        print(f"PASS model_ddtree {joined}{where} ({len(ar.tokens)} tokens), {term}{note}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("verify", help="AR and DDTree vs the fixture's golden tokens (or DDTree vs AR); "
                                             "exit 0 on PASS")
    opts.add_model_args(p)
    opts.add_prompt_args(p)
    opts.add_drafter_args(p)
    opts.add_decode_args(p)
    opts.add_tree_arg(p)
    p.set_defaults(func=verify)
