"""The shipped text pair, measured: does the target write text, and how much does its trained DFlash drafter buy?

Over the model's held-out prompts (prompts.json: drawn from the corpus' held-out split at training) x new tokens:
the target's validation loss (training.json's; with --corpus-dir, that of its file measured here too) and, per row
(AR, the DFlash chain, DDTree at each budget and under `--budget auto`, at T = 0; then AR, the chain and DDTree at
one budget at T = 0.8, each prompt under its own fixed seed; then AR, the chain and DDTree at that budget on prompts
of everyday Python written for the benchmark, benchmarks/written_prompts.py, at T = 0), tau pooled over the prompts
(all committed tokens over all steps, profiling.metrics.pooled_tau), beside it the tau of the steps on new text with
their count (profiling/repeated_text.py's rule: a looping target makes tau cheap) and the distinct-4-gram rate of
the row's continuations, per-position acceptance (pooled alike), and the wall-clock speedup over the AR row of the
same temperature (CUDA: graph replays). Every speculative run must emit exactly the AR tokens (at T > 0 too: the
noise is keyed by seed and position). Each decode is run once with its records (tau, acceptance, tokens; on CUDA its
steps replayed as graphs after the first, as the timed decodes' are) and timed through the decoder's device path
(Decoder.advance; on CUDA the step captured as a graph after one eager step), so the records' host bookkeeping stays
out of the times: the timed decodes interleave the rows prompt by prompt, in --rounds rounds, each keeping its
fastest (time_rows).

    python -m benchmarks.bench_pair [--model DIR] [--device cuda|cpu] [--quick] [--batch-invariant] [--rounds N]
                                    [--corpus-dir DIR] [--out DIR]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from collections import Counter
from collections.abc import Sequence

import numpy as np
import torch

from benchmarks.common import (
    RESULTS_DIR,
    Column,
    markdown_table,
    ratio,
    resolve_device,
    start_run,
    text_table,
    write_results,
)
from benchmarks.decode_steps import choice_cost_us
from benchmarks.written_prompts import WRITTEN_PROMPTS
from engine.config import DecodeConfig, buckets_up_to
from engine.decoding.auto_budget import AutoBudgetDecoder
from engine.decoding.session import make_decoder, with_text
from engine.drafters import DrafterSpec
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.loading import load_model
from engine.loaders.shipped import DEFAULT_MODEL
from engine.model.target import TargetModel
from engine.records import MODE_LABELS, RunRecord
from engine.training.corpus import CorpusError
from engine.training.recipe import TrainError
from engine.training.saved_validation import saved_validation_loss
from profiling.divergence import NEAR_TIE, classify
from profiling.metrics import distinct_4gram_rate, first_divergence, new_text_tau, per_position_acceptance, pooled_tau
from profiling.repeated_text import RULE

BUDGETS = (16, 32, 64, 128, 256)
SAMPLED = 0.8  # the sampled rows' temperature
SAMPLED_BUDGET = 64  # their DDTree budget (--quick: its one budget)
TIMED_ROUNDS = 2  # on CUDA: timed decodes of every (row, prompt), the fastest kept


def timed_decode(dec, num_steps: int, max_new_tokens: int) -> tuple[float, list[int]]:
    """ms of the decoder's steps through its device path, and every token they committed (the last step's past
    max_new_tokens too, for every row alike). A fixed-budget decoder takes num_steps steps (its recorded run's); an
    auto-budget one steps until it has committed max_new_tokens (its choices, and so its step count, follow the
    measured costs), reading each step's count once that step is done and waiting only near the end. Graph
    captures are left out: the first step's, and an auto-budget decoder's later ones (each part's graph is captured
    the first time it runs)."""
    cuda = dec.model.device.type == "cuda"
    auto = isinstance(dec, AutoBudgetDecoder)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    dec.advance()
    if cuda and num_steps > 1 and not auto:
        torch.cuda.synchronize()
        captured = time.perf_counter()
        dec.capture_graph()  # records the step without running it: its time is left out
        start += time.perf_counter() - captured
    steps = 1
    while not done(dec, max_new_tokens) if auto else steps < num_steps:
        dec.advance()
        steps += 1
    if cuda:
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start - (dec.capture_s if auto else 0.0)) * 1e3
    return ms, dec.generated[: int(dec.num_generated)].tolist()


def done(dec: AutoBudgetDecoder, max_new_tokens: int) -> bool:
    """Whether an auto-budget decode has committed max_new_tokens: from the counts it has read while they cannot
    reach it, then (the last step or two of a decode) after waiting for the steps in flight."""
    if dec.num_generated_at_most >= max_new_tokens:
        dec.settle_timing()
    return dec.num_seen_generated >= max_new_tokens


def timed_near_tie(ar: RunRecord, tokens: list[int]) -> bool:
    """Whether a timed auto-budget decode's tokens are AR's up to a numerics near tie (its choices follow the timed
    run's costs, so its trees, and in the fast mode its last bits, are not the recorded run's)."""
    position = next((i for i, (a, t) in enumerate(zip(ar.tokens, tokens, strict=False)) if a != t), None)
    return position is None or classify(ar, position, tokens[position])[0] == NEAR_TIE


def measure(ckpt, model: TargetModel, prompts: list[list[int]], cfg: DecodeConfig, mode: str, spec: DrafterSpec,
            ar_runs: list[RunRecord] | None) -> dict:
    """One row's recorded runs: the mode over every prompt, prompt i under seed cfg.seed + i, and what they show.
    `matches` counts the prompts whose tokens are AR's; a divergence is a failure unless profiling.divergence rates
    it a numerics near tie (`near_ties`; the others' prompt indices: `real_prompts`). tau, new_text_tau (over
    new_text_steps steps) and per_position_acceptance are pooled over the prompts' steps; distinct_4gram_rate is the
    mean over the prompts' continuations. time_rows adds the row's tokens/s, the prompts its timed decodes left AR
    on, and the == AR column (`exact`)."""
    matches, runs, texts = 0, [], []
    near_ties, real = 0, set()
    for i, prompt in enumerate(prompts):
        run = make_decoder(ckpt, prompt, seeded(cfg, i), mode, spec, model=model, continuation=[],
                           cuda_graph=cfg.device == "cuda").run()
        divergence = first_divergence(ar_runs[i], run) if ar_runs else None
        matches += divergence is None
        near_ties += divergence is not None and divergence["kind"] == NEAR_TIE
        if divergence is not None and divergence["kind"] != NEAR_TIE:
            real.add(i)
        runs.append(run)
        texts.append(with_text(run, ckpt).text)
    chosen = [s.budget.chosen for run in runs for s in run.steps if s.budget is not None]
    budget = (cfg.budget_label if cfg.auto_budget else cfg.budget) if mode == "ddtree" else None
    new_text, new_text_steps = new_text_tau(runs)
    num_steps = sum(r.num_steps for r in runs)
    positions = [per_position_acceptance(run) for run in runs] if mode != "ar" else []
    return {"mode": MODE_LABELS[mode], "temperature": cfg.temperature, "budget": budget,
            "chosen": " ".join(f"{b}:{chosen.count(b)}" for b in sorted(set(chosen))) if chosen else None,
            "tau": pooled_tau(runs), "new_text_tau": new_text, "new_text_steps": new_text_steps,
            "new_text": f"{'-' if new_text is None else f'{new_text:.2f}'} ({new_text_steps} of {num_steps})",
            "distinct_4gram_rate": distinct_4gram_rate(runs),
            "per_position_acceptance": np.average(positions, axis=0, weights=[r.num_steps for r in runs]).tolist()
            if positions else [],
            "matches": matches, "num_prompts": len(prompts), "near_ties": near_ties, "real_prompts": real,
            "runs": runs, "example": texts[0],
            "decode": (cfg, mode, ar_runs)}


def exactness(row: dict) -> str:
    """The == AR column: prompts whose recorded run emitted AR's tokens, of all, then the near ties and the prompts
    that left AR's tokens for real (in the recorded or the timed decode), by their index."""
    notes = [f"{row['near_ties']} near tie{'s' * (row['near_ties'] > 1)}"] if row["near_ties"] else []
    if row["real_prompts"]:
        notes.append(f"REAL divergence at prompt {', '.join(str(i) for i in sorted(row['real_prompts']))}")
    return f"{row['matches']}/{row['num_prompts']}" + (f" ({'; '.join(notes)})" if notes else "")


def seeded(cfg: DecodeConfig, prompt_index: int) -> DecodeConfig:
    return dataclasses.replace(cfg, seed=cfg.seed + prompt_index)


def time_rows(ckpt, model: TargetModel, prompts: list[list[int]], rows: list[dict], spec: DrafterSpec,
              rounds: int) -> None:
    """Each row's tokens/s through the decoder's device path, the rows interleaved prompt by prompt (so that the
    machine's drift over the run hits them alike) in `rounds` rounds, each (row, prompt) keeping its fastest decode;
    a row's tokens/s is the sum of its prompts' committed tokens over the sum of their times (each with its recorded
    run's prefill). The timed decode must commit what the recorded run committed (an auto budget's: AR's tokens up to
    a numerics near tie, its choices following the timed run's costs), or the prompt counts as a real divergence.
    An auto row also gets the tau and the budgets of its kept timed decodes (`timed_tau`, `timed_chosen`): they
    follow the costs the timed decode measured, the recorded runs' theirs."""
    best: list[list[tuple[float, int, Counter] | None]] = [[None] * len(prompts) for _ in rows]
    diverged: list[set[int]] = [set() for _ in rows]
    for _ in range(rounds):
        for i, prompt in enumerate(prompts):
            for r, row in enumerate(rows):
                cfg, mode, ar_runs = row["decode"]
                run = row["runs"][i]
                timed = make_decoder(ckpt, prompt, seeded(cfg, i), mode, spec, model=model, continuation=[],
                                     cuda_graph=cfg.device == "cuda")
                ms, tokens = timed_decode(timed, run.num_steps, cfg.max_new_tokens)
                ms += run.prefill_ns / 1e6
                auto = isinstance(timed, AutoBudgetDecoder)
                if tokens[: cfg.max_new_tokens] != run.tokens and not (auto and timed_near_tie(ar_runs[i], tokens)):
                    diverged[r].add(i)
                if best[r][i] is None or len(tokens) / ms > best[r][i][1] / best[r][i][0]:
                    best[r][i] = (ms, len(tokens), Counter(timed.budget_counts) if auto else Counter())
    for row, times, prompts_diverged in zip(rows, best, diverged, strict=True):
        row["tokens_per_s"] = sum(n for _, n, _ in times) / (sum(ms for ms, _, _ in times) / 1e3)
        row["real_prompts"] |= prompts_diverged
        row["real_divergences"] = len(row["real_prompts"])
        row["exact"] = exactness(row)
        counts = sum((c for _, _, c in times), Counter())
        if counts:
            row["timed_tau"] = sum(n for _, n, _ in times) / sum(counts.values())
            row["timed_chosen"] = " ".join(f"{b}:{counts[b]}" for b in sorted(counts))


def val_loss_text(training: dict, measured: float | None, corpus_dir: pathlib.Path | None) -> str:
    """The target's validation loss: at training (the weights in training), as saved (training.json records it since
    train-target measures its file) and as this run measured the file on corpus_dir, where it did."""
    text = f"validation loss {training['final_val_loss']:.3f} nats/token at training"
    if training.get("saved_val_loss") is not None:
        text += f", {training['saved_val_loss']:.3f} as saved"
    if measured is not None:
        text += f", {measured:.3f} of its file measured here on {corpus_dir.name}'s held-out split"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description="the shipped target + DFlash drafter: text quality, tau, speedup")
    p.add_argument("--model", type=pathlib.Path, default=DEFAULT_MODEL, help="the target's directory")
    p.add_argument("--drafter", type=pathlib.Path, help="its DFlash directory (default: the one beside it)")
    p.add_argument("--device", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="4 prompts x 32 tokens, B = 16 only")
    p.add_argument("--prompts", type=int, help="how many of the model's prompts (default: all of them)")
    p.add_argument("--batch-invariant", action="store_true", help="decode in the batch-invariant mode (every run's "
                                                                  "tokens AR's bit for bit)")
    p.add_argument("--rounds", type=int, choices=range(1, 11), metavar="1..10",
                   help=f"timed decodes of every row and prompt, the fastest kept (default: {TIMED_ROUNDS} on CUDA, "
                        "1 on the CPU and with --quick)")
    p.add_argument("--corpus-dir", type=pathlib.Path,
                   help="the corpus the target was trained on: measure the validation loss of its file as saved "
                        "over its training's held-out windows, in this run's device (default: training.json's)")
    p.add_argument("--out", type=pathlib.Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    device = resolve_device(args.device)
    drafter_dir = args.drafter or dflash_dir_beside(args.model)
    if drafter_dir is None:
        raise SystemExit(f"{args.model}: no DFlash drafter beside it ({args.model}/dflash/); train one with "
                         "python -m engine train-drafter")
    ckpt = load_model(args.model)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    info = start_run("bench_pair", "benchmarks.bench_pair", argv, device, torch.bfloat16 if device.type == "cuda"
                     else torch.float32, args.quick)
    num_prompts, new_tokens, budgets = (4, 32, BUDGETS[:1]) if args.quick else (len(ckpt.prompt_texts), 128, BUDGETS)
    num_prompts = args.prompts or num_prompts
    prompts = [ckpt.tokenizer.encode(t) for t in ckpt.prompt_texts[:num_prompts]]
    model = TargetModel.from_checkpoint(ckpt, device.type, dtype)
    block = json.loads((drafter_dir / "config.json").read_text())["block_size"]
    spec = DrafterSpec("dflash", model=str(drafter_dir))
    training = json.loads((args.model / "training.json").read_text())
    measured_val_loss = None
    if args.corpus_dir is not None:  # first, so that a wrong corpus stops the run before its decodes
        try:
            measured_val_loss = saved_validation_loss(args.model, args.corpus_dir, device.type)
        except (TrainError, CorpusError) as e:
            raise SystemExit(f"bench_pair --corpus-dir: {e}") from e

    def cfg(budget: int = 0, auto: bool = False, temperature: float = 0.0) -> DecodeConfig:
        return DecodeConfig(budget=budget, block_size=block, max_new_tokens=new_tokens, device=device.type,
                            dtype=dtype, batch_invariant=args.batch_invariant, auto_budget=auto,
                            temperature=temperature)

    make_decoder(ckpt, prompts[0], cfg(budgets[-1]), "ddtree", spec, model=model).run()  # warm-up
    ar = measure(ckpt, model, prompts, cfg(), "ar", spec, None)
    chain = measure(ckpt, model, prompts, cfg(), "chain", spec, ar["runs"])
    fixed = [measure(ckpt, model, prompts, cfg(b), "ddtree", spec, ar["runs"]) for b in budgets]
    auto = measure(ckpt, model, prompts, cfg(budgets[-1], auto=True), "ddtree", spec, ar["runs"])
    sampled_budget = SAMPLED_BUDGET if SAMPLED_BUDGET in budgets else budgets[-1]
    sampled_ar = measure(ckpt, model, prompts, cfg(temperature=SAMPLED), "ar", spec, None)
    sampled = [sampled_ar] + [measure(ckpt, model, prompts, cfg(b, temperature=SAMPLED), m, spec, sampled_ar["runs"])
                              for m, b in (("chain", 0), ("ddtree", sampled_budget))]
    written_prompts = [ckpt.tokenizer.encode(t) for t in WRITTEN_PROMPTS[: 2 if args.quick else None]]
    written_ar = measure(ckpt, model, written_prompts, cfg(), "ar", spec, None)
    written = [written_ar] + [measure(ckpt, model, written_prompts, cfg(b), m, spec, written_ar["runs"])
                              for m, b in (("chain", 0), ("ddtree", sampled_budget))]
    for row in (ar, chain, *fixed, auto, *sampled):
        row["prompts"] = "held-out"
    for row in written:
        row["prompts"] = "written"
    rows = [ar, chain, *fixed, auto, *sampled, *written]
    rounds = args.rounds or (TIMED_ROUNDS if device.type == "cuda" and not args.quick else 1)
    for group, group_prompts in (([ar, chain, *fixed, auto], prompts), (sampled, prompts), (written, written_prompts)):
        time_rows(ckpt, model, group_prompts, group, spec, rounds)
        for row in group:
            row["speedup"] = ratio(row["tokens_per_s"], group[0]["tokens_per_s"])
            row["accept_by_depth"] = " ".join(f"{a:.2f}" for a in row["per_position_acceptance"])
            if row["mode"] == "DDTree":
                row["tau_over_chain"] = ratio(row["tau"], group[1]["tau"])
    best = max(fixed, key=lambda r: r["tokens_per_s"])
    verdict = (f"auto ({auto['budget']}): {ratio(auto['tokens_per_s'], best['tokens_per_s']):.3f}x the best fixed "
               f"budget's tokens/s (B = {best['budget']}), {ratio(auto['tokens_per_s'], chain['tokens_per_s']):.3f}x "
               f"the chain's; its timed decodes: tau {auto['timed_tau']:.2f}, budgets verified (B:steps; 0 = AR, no "
               f"draft) {auto['timed_chosen']} (its recorded runs: {auto['chosen']}); the choice is made on "
               "the device, "
               f"{choice_cost_us(device, buckets_up_to(budgets[-1]), block - 1):.1f} us of device time a drafted step")
    distinct = ar["distinct_4gram_rate"]
    val_loss = val_loss_text(training, measured_val_loss, args.corpus_dir)
    setup = (f"{args.model.name} ({training['num_parameters'] / 1e6:.2f} M parameters, {val_loss}) + "
             f"{drafter_dir.name} (block {block}); "
             f"{len(prompts)} held-out prompts x {new_tokens} new tokens, T = 0, then T = {SAMPLED} (prompt i under "
             f"seed i), then {len(written_prompts)} prompts of everyday Python written for the benchmark "
             f"(benchmarks/written_prompts.py) at T = 0; {device.type} {dtype}"
             f"{', batch-invariant' if args.batch_invariant else ''}; "
             f"distinct-4-gram rate of the AR continuations {distinct:.3f}; tau = all committed tokens / all steps; "
             f"new text: {RULE}")
    columns = [Column("prompts", "prompts"), Column("mode", "mode"), Column("temperature", "T", "{:g}"),
               Column("budget", "B", "{}"),
               Column("tau", "tau", "{:.2f}"), Column("new_text", "tau on new text (its steps of all)"),
               Column("distinct_4gram_rate", "distinct-4", "{:.3f}"), Column("tau_over_chain", "tau / chain", "{:.2f}"),
               Column("tokens_per_s", "tokens/s", "{:.1f}"), Column("speedup", "speedup", "{:.2f}"),
               Column("exact", "== AR"), Column("accept_by_depth", "acceptance by depth"),
               Column("chosen", "auto: budgets chosen (B:steps)")]
    print(f"\n{setup}\n\n{text_table(rows, columns)}\n\n{verdict}\n\nexample (AR): {ar['example']!r}\n"
          f"example (AR, T = {SAMPLED}): {sampled_ar['example']!r}\nexample (AR, written): {written_ar['example']!r}\n")
    results = {"setup": setup, "distinct_4gram_rate": distinct, "written_distinct_4gram_rate":
               written_ar["distinct_4gram_rate"], "val_loss": training["final_val_loss"],
               "saved_val_loss": training.get("saved_val_loss"), "measured_val_loss": measured_val_loss,
               "auto": verdict,
               "rows": [{k: sorted(v) if k == "real_prompts" else v for k, v in r.items()
                         if k not in ("runs", "decode")} for r in rows]}
    tables = {"setup": setup, "the pair": markdown_table(rows, columns), "auto budget": verdict}
    json_path, md_path = write_results(args.out, f"pair-{device.type}", info, results, tables)
    failed = [f"{r['mode']} T={r['temperature']:g}" for r in rows if r["real_divergences"]]
    print(f"wrote {json_path} and {md_path}" + (f"; real divergences from AR: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
