"""The target's training loop (engine/training/trainer.py holds what it shares with the drafter's): next-token
cross-entropy over sampled windows, DeepSeek-V3's bias balancing after each step, validation on held-out windows."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.training.data import WindowSampler
from engine.training.recipe import Recipe
from engine.training.target_model import TargetLM, update_router_biases
from engine.training.trainer import TrainerBase


class Trainer(TrainerBase):
    def __init__(self, model: TargetLM, recipe: Recipe, sampler: WindowSampler, eval_windows: torch.Tensor) -> None:
        super().__init__(model, recipe)
        self.model, self.sampler = model, sampler
        self.eval_windows = eval_windows.to(recipe.device)

    def train_step(self) -> torch.Tensor:
        batch = self.sampler.batch(self.step)  # [B, T + 1]
        with self.autocast:
            out = self.model(batch[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten())
        self.optimizer_step(loss)
        if out.expert_loads is not None:
            update_router_biases(self.model, out.expert_loads, self.recipe.bias_update_speed)
        self.step += 1
        return loss.detach()

    def interval_fields(self) -> dict[str, float]:
        return {"epoch": round(self.sampler.epochs_at(self.step), 3)}

    def validation(self) -> dict[str, float]:
        return {"val_loss": self.validation_loss()}

    @torch.no_grad()
    def validation_loss(self) -> float:
        """Mean next-token cross-entropy over the held-out windows."""
        total = torch.zeros((), device=self.recipe.device)
        for chunk in self.eval_windows.split(self.recipe.batch_size):
            with self.autocast:
                logits = self.model(chunk[:, :-1]).logits
            total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        return total.item() / (self.eval_windows.shape[0] * (self.eval_windows.shape[1] - 1))
