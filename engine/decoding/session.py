"""Entry points shared by the CLI, the dashboard and the tests: build a decoder, run a decode, run a DecodeRequest
(AR, then the speculative modes side by side: the one loop every measurement wraps), parse a typed prompt."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from engine.config import DecodeConfig
from engine.decoding.auto_budget import AutoBudgetDecoder
from engine.decoding.decoder import ARDecoder, DecodeError, Decoder, check_room, validate_prompt
from engine.decoding.request import ORACLE, DecodeRequest
from engine.drafters import DrafterSpec, DraftTarget, build_drafter
from engine.loaders.checkpoint import Checkpoint
from engine.model.parallel import current_shard
from engine.model.target import TargetModel
from engine.records import MODES, RunRecord, StepRecord
from engine.timers import StepTimer


def parse_prompt(text: str, vocab_size: int) -> list[int]:
    """Token ids typed as "1, 2, 3" or "1 2 3" (ASCII digits only)."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    bad = [p for p in parts if not re.fullmatch(r"-?[0-9]+", p)]
    if bad:
        raise DecodeError(f"prompt entries {bad[:5]} are not integers: type token ids separated by commas or spaces")
    return validate_prompt([int(p) for p in parts], vocab_size)


def load_target(ckpt: Checkpoint, cfg: DecodeConfig) -> TargetModel:
    """The target on cfg's device and dtype: this rank's part of it when a process group is up
    (engine/model/parallel.py)."""
    return TargetModel.from_checkpoint(ckpt, cfg.device, cfg.dtype, shard=current_shard())


def golden_for(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig) -> list[int] | None:
    """The fixture's golden (greedy) continuation, if `prompt` is the fixture's own prompt, the decode is greedy
    and the model runs in float32 (which reproduces the float64 golden tokens; bfloat16 may pick other near-tied
    tokens)."""
    if cfg.dtype != "float32" or cfg.temperature > 0:
        return None
    if ckpt.golden_tokens is not None and ckpt.prompt is not None and list(prompt) == ckpt.prompt.tolist():
        return ckpt.golden_tokens.tolist()
    return None


def continuation_of(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, model: TargetModel,
                    known: Sequence[int] | None = None) -> Callable[[int], list[int]]:
    """n -> the first n tokens the target generates after `prompt` under cfg: `known` (tokens already decoded,
    e.g. an AR run's) or the golden tokens where they are long enough, else an AR decode of n tokens (as many
    as the context holds). Decoded once per n asked for."""
    known = list(known) if known is not None else golden_for(ckpt, prompt, cfg) or []
    memo: dict[int, list[int]] = {}

    def first(n: int) -> list[int]:
        if len(known) >= n:
            return known[:n]
        if n not in memo:
            room = model.cfg.max_position_embeddings - len(prompt) - cfg.block_size
            longer = dataclasses.replace(cfg, max_new_tokens=max(1, min(n, room)))
            memo[n] = ARDecoder(model, prompt, longer).run().tokens
        return memo[n]

    return first


def make_decoder(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, mode: str,
                 drafter: DrafterSpec = ORACLE, timer: StepTimer | None = None, model: TargetModel | None = None,
                 continuation: Sequence[int] | None = None, cuda_graph: bool = False) -> Decoder:
    """A decoder of `mode` (one of MODES), ready to step (the prompt is prefilled). `continuation` is what the
    target is already known to generate (an oracle drafter reads it; computed when needed)."""
    if mode not in MODES:
        raise DecodeError(f"mode={mode!r}: expected one of {MODES}")
    model = model or load_target(ckpt, cfg)
    if mode == "ar":
        return ARDecoder(model, prompt, cfg, timer, cuda_graph)
    prompt = validate_prompt(prompt, model.cfg.vocab_size)
    check_room(len(prompt), cfg, model, 1)  # the prompt's own error before any drafter work
    target = DraftTarget(model, prompt, cfg, continuation_of(ckpt, prompt, cfg, model, continuation))
    built = build_drafter(drafter, target)
    if mode == "ddtree" and cfg.auto_budget:  # the budget chosen every step (engine/decoding/budget.py)
        return AutoBudgetDecoder(model, prompt, cfg, built, timer, cuda_graph)
    return Decoder(model, prompt, cfg, mode, built, timer, cuda_graph)


def decode(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, mode: str, drafter: DrafterSpec = ORACLE,
           timer: StepTimer | None = None, on_step: Callable[[StepRecord], None] | None = None,
           model: TargetModel | None = None) -> RunRecord:
    return with_text(make_decoder(ckpt, prompt, cfg, mode, drafter, timer, model).run(on_step), ckpt)


def with_text(run: RunRecord, ckpt: Checkpoint) -> RunRecord:
    """The run's prompt, generated tokens and each step's committed tokens as text, and the pieces of every token it
    mentions (RunRecord.vocabulary), where the model has a tokenizer."""
    tokenizer = ckpt.tokenizer
    if tokenizer is not None:
        run.prompt_text = tokenizer.decode(run.prompt)
        run.text = tokenizer.decode(run.tokens)
        for step in run.steps:
            step.committed_text = tokenizer.decode(step.committed)
        run.vocabulary = {t: (tokenizer.piece(t), tokenizer.token_bytes(t)) for t in sorted(run.token_ids())}
    return run


def warm_up(request: DecodeRequest, model: TargetModel) -> None:
    """Two untimed steps of AR and each mode, so one-time costs (library handles, first-touch allocations)
    stay out of the numbers of the runs that follow."""
    cfg = request.config
    short = dataclasses.replace(cfg, max_new_tokens=min(cfg.max_new_tokens, 2))
    for mode in ("ar", *request.modes):
        make_decoder(request.checkpoint, request.prompt, short, mode, request.drafter, model=model).run()


Build = Callable[[StepTimer], Decoder]  # a prefilled decoder of one mode, timed by the given timer
Runner = Callable[[str, Build], RunRecord]  # takes one run of a mode: builds its decoder and runs it to the end


def timed_runner(device: str, profile_timers: bool = True,
                 on_step: Callable[[StepRecord], None] | None = None) -> Runner:
    """Each run with its own StepTimer (disabled unless profile_timers); on_step sees every step."""
    return lambda mode, build: build(StepTimer(device, enabled=profile_timers)).run(on_step)


def decode_request(request: DecodeRequest, model: TargetModel | None = None, runner: Runner | None = None,
                   warmup: bool = True, profile_timers: bool = True,
                   on_step: Callable[[StepRecord], None] | None = None) -> dict[str, RunRecord]:
    """AR, then each of the request's speculative modes with its drafter, on one model (`model`, else loaded), after
    warm_up unless warmup=False. `runner` takes each run (default: timed_runner; the profiler capture and the repeats
    wrap this loop through it). Returns the runs by mode, AR first, with their text."""
    ckpt, prompt, cfg = request.checkpoint, request.prompt, request.config
    model = model or load_target(ckpt, cfg)
    if warmup:
        warm_up(request, model)
    runner = runner or timed_runner(model.device, profile_timers, on_step)
    runs = {"ar": runner("ar", lambda timer: ARDecoder(model, prompt, cfg, timer))}
    known = golden_for(ckpt, prompt, cfg) or runs["ar"].tokens
    for mode in request.modes:
        runs[mode] = runner(mode, lambda timer, mode=mode: make_decoder(ckpt, prompt, cfg, mode, request.drafter,
                                                                        timer, model, known))
    return {mode: with_text(run, ckpt) for mode, run in runs.items()}


def decode_runs(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, drafter: DrafterSpec = ORACLE,
                modes: Sequence[str] = ("ddtree",), profile_timers: bool = True,
                on_step: Callable[[StepRecord], None] | None = None, model: TargetModel | None = None,
                warmup: bool = True) -> dict[str, RunRecord]:
    """decode_request of DecodeRequest(ckpt, prompt, cfg, drafter, modes), for callers that hold the parts."""
    return decode_request(DecodeRequest(ckpt, tuple(prompt), cfg, drafter, tuple(modes)), model,
                          warmup=warmup, profile_timers=profile_timers, on_step=on_step)
