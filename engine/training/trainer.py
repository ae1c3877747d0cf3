"""What the target's and the drafter's training loops share: AdamW with linear warm-up and cosine decay, gradient
clipping, bf16 autocast on CUDA, the resumable state, and the logged loop with periodic validation and checkpoints.

A step never waits for the device: losses accumulate in a device tensor and are read once per logged interval
(log_every steps), the only host sync of the loop. A subclass says how one step trains (train_step) and what a
validation measures (validation).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.training.checkpointing import restore_rng_states, rng_states
from engine.training.progress import Progress
from engine.training.recipe import TrainError


def lr_factor(step: int, recipe) -> float:
    """The learning rate of step (0-based) over the peak: linear warm-up, then cosine to min_lr_share."""
    warmup = recipe.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(recipe.steps - warmup, 1)
    return recipe.min_lr_share + (1 - recipe.min_lr_share) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(module: torch.nn.Module, recipe) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices and the embedding only (not on norms)."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, fused=recipe.device == "cuda")


def autocast_for(device: str) -> contextlib.AbstractContextManager:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


@dataclass
class History:
    """What the run logged: one entry per interval, the commands that ran it (the first, then each resume),
    the steps it was resumed at, the wall time spent training, where its tokenizer came from, and the record of
    the model its weights started from (train-target --init-from), read when the run began."""

    intervals: list[dict] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    tokenizer_source: str = ""
    initial_model: dict | None = None


class TrainerBase:
    """Trains `module` under `recipe` (a Recipe or DrafterRecipe: lr, betas, weight_decay, warmup_steps, steps,
    min_lr_share, grad_clip, log_every, eval_every, checkpoint_every, tokens_per_step, device)."""

    state_key = "model"  # the module's entry in a checkpoint's state
    loss_name = "the training loss"  # for the message when the loss stops being finite

    def __init__(self, module: torch.nn.Module, recipe) -> None:
        self.module, self.recipe = module, recipe
        self.optimizer = make_optimizer(module, recipe)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, recipe))
        self.autocast = autocast_for(recipe.device)
        self.step = 0
        self.history = History()

    def train_step(self) -> torch.Tensor:
        """One optimizer step on the next batch; returns the loss (a device scalar, not read)."""
        raise NotImplementedError

    def validation(self) -> dict[str, float]:
        """The held-out measurements logged at an evaluation step (val_loss first)."""
        raise NotImplementedError

    def interval_fields(self) -> dict[str, float]:
        """Extra fields of a logged interval (e.g. the epoch)."""
        return {}

    def optimizer_step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.recipe.grad_clip)
        self.optimizer.step()
        self.scheduler.step()

    def state(self) -> dict:
        return {"step": self.step, "recipe": self.recipe.to_dict(), self.state_key: self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_states(), "history": dataclasses.asdict(self.history)}

    def restore(self, state: dict) -> None:
        """Continue from a checkpoint's state; the step it resumes at is logged in the history."""
        self.module.load_state_dict(state[self.state_key])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_states(state["rng"])
        self.step = state["step"]
        self.history = History(**state["history"])
        self.history.resumed_at.append(self.step)

    def run(self, stop_at: int, progress: Progress, on_checkpoint: Callable[[dict], None]) -> None:
        """Train until step stop_at, logging every log_every steps, validating and checkpointing on schedule."""
        r = self.recipe
        self.module.train()
        loss_sum = torch.zeros((), device=r.device)
        interval_start, interval_steps = time.perf_counter(), 0
        while self.step < stop_at:
            loss_sum += self.train_step()
            interval_steps += 1
            if self.step % r.log_every and self.step != r.steps:
                continue
            train_loss = loss_sum.item() / interval_steps  # the interval's one host sync
            if not math.isfinite(train_loss):
                raise TrainError(f"{self.loss_name} became {train_loss} by step {self.step}; lower --lr")
            seconds = time.perf_counter() - interval_start
            entry = {"step": self.step, **self.interval_fields(), "lr": self.scheduler.get_last_lr()[0],
                     "train_loss": train_loss, "tokens_per_s": interval_steps * r.tokens_per_step / seconds}
            if self.step % r.eval_every == 0 or self.step == r.steps:
                self.module.eval()
                with torch.no_grad():
                    entry |= self.validation()
                self.module.train()
            self.history.wall_s += time.perf_counter() - interval_start
            self.history.intervals.append(entry)
            progress.update(self.step, entry["tokens_per_s"], train_loss, entry.get("val_loss"))
            if self.step < r.steps and (self.step % r.checkpoint_every == 0 or self.step == stop_at):
                on_checkpoint(self.state())
            loss_sum.zero_()
            interval_start, interval_steps = time.perf_counter(), 0
