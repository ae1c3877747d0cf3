"""The training loop: AdamW with linear warm-up and cosine decay, gradient clipping, bf16 autocast on CUDA,
DeepSeek-V3's bias balancing, periodic validation and checkpoints.

A step never waits for the device: losses accumulate in a device tensor and are read once per logged
interval (log_every steps), the only host sync of the loop.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.training.checkpointing import restore_rng_states, rng_states
from engine.training.data import WindowSampler
from engine.training.progress import Progress
from engine.training.recipe import Recipe, TrainError
from engine.training.target_model import TargetLM, update_router_biases


def lr_factor(step: int, recipe: Recipe) -> float:
    """The learning rate of step (0-based) over the peak: linear warm-up, then cosine to min_lr_share."""
    warmup = recipe.warmup_steps
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(recipe.steps - warmup, 1)
    return recipe.min_lr_share + (1 - recipe.min_lr_share) * 0.5 * (1 + math.cos(math.pi * progress))


def make_optimizer(model: TargetLM, recipe: Recipe) -> torch.optim.AdamW:
    """AdamW, weight decay on matrices and the embedding only (not on norms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, fused=recipe.device == "cuda")


def autocast_for(device: str) -> contextlib.AbstractContextManager:
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


@dataclass
class History:
    """What the run logged: one entry per interval, the commands that ran it (the first, then each resume),
    the steps it was resumed at, the wall time spent training, and where its tokenizer came from."""

    intervals: list[dict] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    tokenizer_source: str = ""


class Trainer:
    def __init__(self, model: TargetLM, recipe: Recipe, sampler: WindowSampler, eval_windows: torch.Tensor) -> None:
        self.model, self.recipe, self.sampler = model, recipe, sampler
        self.eval_windows = eval_windows.to(recipe.device)
        self.optimizer = make_optimizer(model, recipe)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, recipe))
        self.autocast = autocast_for(recipe.device)
        self.step = 0
        self.history = History()

    def state(self) -> dict:
        return {"step": self.step, "recipe": self.recipe.to_dict(), "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_states(), "history": dataclasses.asdict(self.history)}

    def restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_states(state["rng"])
        self.step = state["step"]
        self.history = History(**state["history"])

    def train_step(self) -> torch.Tensor:
        """One optimizer step on the next batch; returns the loss (a device scalar, not read)."""
        batch = self.sampler.batch(self.step)  # [B, T + 1]
        with self.autocast:
            out = self.model(batch[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.recipe.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        if out.expert_loads is not None:
            update_router_biases(self.model, out.expert_loads, self.recipe.bias_update_speed)
        self.step += 1
        return loss.detach()

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean next-token cross-entropy over the held-out windows."""
        self.model.eval()
        total = torch.zeros((), device=self.recipe.device)
        for chunk in self.eval_windows.split(self.recipe.batch_size):
            with self.autocast:
                logits = self.model(chunk[:, :-1]).logits
            total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        self.model.train()
        return total.item() / (self.eval_windows.shape[0] * (self.eval_windows.shape[1] - 1))

    def run(self, stop_at: int, progress: Progress, on_checkpoint: Callable[[dict], None]) -> None:
        """Train until step stop_at, logging every log_every steps, validating and checkpointing on schedule."""
        r = self.recipe
        self.model.train()
        loss_sum = torch.zeros((), device=r.device)
        interval_start, interval_steps = time.perf_counter(), 0
        while self.step < stop_at:
            loss_sum += self.train_step()
            interval_steps += 1
            if self.step % r.log_every and self.step != r.steps:
                continue
            train_loss = loss_sum.item() / interval_steps  # the interval's one host sync
            if not math.isfinite(train_loss):
                raise TrainError(f"the training loss became {train_loss} by step {self.step}; lower --lr")
            seconds = time.perf_counter() - interval_start
            entry = {"step": self.step, "epoch": round(self.sampler.epochs_at(self.step), 3),
                     "lr": self.scheduler.get_last_lr()[0], "train_loss": train_loss,
                     "tokens_per_s": interval_steps * r.tokens_per_step / seconds}
            if self.step % r.eval_every == 0 or self.step == r.steps:
                entry["val_loss"] = self.validation_loss()
            self.history.wall_s += time.perf_counter() - interval_start
            self.history.intervals.append(entry)
            progress.update(self.step, entry["tokens_per_s"], train_loss, entry.get("val_loss"))
            if self.step < r.steps and (self.step % r.checkpoint_every == 0 or self.step == stop_at):
                on_checkpoint(self.state())
            loss_sum.zero_()
            interval_start, interval_steps = time.perf_counter(), 0
