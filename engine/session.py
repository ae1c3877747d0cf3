"""Convenience entry points shared by the CLI, the dashboard and the tests: build a decoder, run a
decode, run AR and DDTree side by side, parse a typed prompt."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from profiling.timers import StepTimer

from .checkpoint import Checkpoint
from .config import DecodeConfig
from .decode import ARDecoder, DDTreeDecoder, DecodeError, Decoder, validate_prompt
from .drafters import OracleDrafter
from .model import TargetModel
from .records import RunRecord, StepRecord


def parse_prompt(text: str, vocab_size: int) -> list[int]:
    """Token ids typed as "1, 2, 3" or "1 2 3"."""
    parts = [p for p in re.split(r"[,\s]+", text.strip()) if p]
    bad = [p for p in parts if not re.fullmatch(r"-?\d+", p)]
    if bad:
        raise DecodeError(f"prompt entries {bad[:5]} are not integers: type token ids separated by commas or spaces")
    return validate_prompt([int(p) for p in parts], vocab_size)


def load_target(ckpt: Checkpoint, cfg: DecodeConfig) -> TargetModel:
    return TargetModel.from_checkpoint(ckpt, cfg.device, cfg.dtype)


def golden_for(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig) -> list[int] | None:
    """The fixture's golden continuation, if `prompt` is the fixture's own prompt and the model runs in
    float32 (which reproduces the float64 golden tokens; bfloat16 may pick other near-tied tokens)."""
    if cfg.dtype != "float32":
        return None
    if ckpt.golden_tokens is not None and ckpt.prompt is not None and list(prompt) == ckpt.prompt.tolist():
        return ckpt.golden_tokens.tolist()
    return None


def oracle_continuation(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, model: TargetModel) -> list[int]:
    """The greedy continuation the oracle knows: the golden tokens where there are some, else an AR run's."""
    return golden_for(ckpt, prompt, cfg) or ARDecoder(model, prompt, cfg).run().tokens


def make_decoder(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, mode: str, noise: float = 0.0,
                 drafter_seed: int = 0, timer: StepTimer | None = None, model: TargetModel | None = None,
                 continuation: Sequence[int] | None = None, cuda_graph: bool = False) -> Decoder:
    """An AR or DDTree decoder, ready to step (the prompt is prefilled)."""
    model = model or load_target(ckpt, cfg)
    if mode == "ar":
        return ARDecoder(model, prompt, cfg, timer, cuda_graph)
    if mode != "ddtree":
        raise ValueError(f"mode={mode!r}: expected 'ar' or 'ddtree'")
    truth = continuation if continuation is not None else oracle_continuation(ckpt, prompt, cfg, model)
    drafter = OracleDrafter(truth, ckpt.config.vocab_size, noise=noise, seed=drafter_seed,
                            num_positions=cfg.max_new_tokens + cfg.block_size, device=model.device)
    return DDTreeDecoder(model, prompt, cfg, drafter, timer, cuda_graph)


def decode(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, mode: str, noise: float = 0.0,
           drafter_seed: int = 0, timer: StepTimer | None = None,
           on_step: Callable[[StepRecord], None] | None = None, model: TargetModel | None = None) -> RunRecord:
    return make_decoder(ckpt, prompt, cfg, mode, noise, drafter_seed, timer, model).run(on_step)


def warm_up(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, model: TargetModel) -> None:
    """Two untimed steps of each mode, so one-time costs (library handles, first-touch allocations) stay out
    of the numbers of the runs that follow."""
    short = dataclasses.replace(cfg, max_new_tokens=min(cfg.max_new_tokens, 2))
    for mode in ("ar", "ddtree"):
        make_decoder(ckpt, prompt, short, mode, model=model, continuation=golden_for(ckpt, prompt, cfg) or []).run()


def decode_pair(ckpt: Checkpoint, prompt: Sequence[int], cfg: DecodeConfig, noise: float = 0.0,
                drafter_seed: int = 0, profile_timers: bool = True,
                on_step: Callable[[StepRecord], None] | None = None,
                model: TargetModel | None = None, warmup: bool = True) -> tuple[RunRecord, RunRecord]:
    """AR, then DDTree, on the same prompt, config and model (after warm_up, unless warmup=False).
    on_step sees both runs' steps in turn."""
    model = model or load_target(ckpt, cfg)
    continuation = golden_for(ckpt, prompt, cfg)
    if warmup:
        warm_up(ckpt, prompt, cfg, model)

    def timer() -> StepTimer:
        return StepTimer(model.device, enabled=profile_timers)

    ar = ARDecoder(model, prompt, cfg, timer()).run(on_step)
    dd = make_decoder(ckpt, prompt, cfg, "ddtree", noise, drafter_seed, timer(), model,
                      continuation or ar.tokens).run(on_step)
    return ar, dd
