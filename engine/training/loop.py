"""The target's training loop (engine/training/trainer.py holds what it shares with the drafter's): next-token
cross-entropy over sampled windows, with the recipe's unlikelihood_weight times the sequence-level unlikelihood of
the model's own greedy continuations (engine/training/unlikelihood.py) added, DeepSeek-V3's bias balancing after
each step, validation on held-out windows."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from engine.training.data import WindowSampler
from engine.training.generate import generation_dtype, greedy_generate
from engine.training.recipe import Recipe
from engine.training.target_model import TargetLM, update_router_biases
from engine.training.trainer import TrainerBase
from engine.training.unlikelihood import repeated_ngram_mask, unlikelihood_loss


@torch.no_grad()
def held_out_loss(model: TargetLM, windows: torch.Tensor, batch_size: int,
                  autocast: contextlib.AbstractContextManager) -> float:
    """Mean next-token cross-entropy (nats/token) over held-out windows [n, T + 1], batch_size windows at a time."""
    total = torch.zeros((), device=windows.device)
    for chunk in windows.split(batch_size):
        with autocast:
            logits = model(chunk[:, :-1]).logits
        total += F.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
    return total.item() / (windows.shape[0] * (windows.shape[1] - 1))


def next_token_loss(model: TargetLM, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The mean cross-entropy of each window's next tokens [B, T + 1] and the MoE layers' expert loads: the part of
    a step that --compile hands to torch.compile whole (the forward, the float32 logits and the loss fuse)."""
    out = model(batch[:, :-1])
    return F.cross_entropy(out.logits.flatten(0, 1), batch[:, 1:].flatten()), out.expert_loads


class Trainer(TrainerBase):
    def __init__(self, model: TargetLM, recipe: Recipe, sampler: WindowSampler, eval_windows: torch.Tensor) -> None:
        super().__init__(model, recipe)
        self.model, self.sampler = model, sampler
        self.next_token_loss = torch.compile(next_token_loss) if recipe.compile else next_token_loss
        self.eval_windows = eval_windows.to(recipe.device)
        # the unlikelihood term, the share of continuation tokens it penalised and the steps that added it, summed
        # over the logged interval
        self.unlikelihood_sums = torch.zeros(3, device=recipe.device)

    def train_step(self) -> torch.Tensor:
        batch = self.sampler.batch(self.step)  # [B, T + 1]
        with self.autocast:
            loss, expert_loads = self.next_token_loss(self.model, batch)
        total = loss
        if self.recipe.unlikelihood_weight and self.step % self.recipe.unlikelihood_every == 0:
            total = loss + self.recipe.unlikelihood_weight * self.unlikelihood(batch)
        self.optimizer_step(total)
        if expert_loads is not None:
            update_router_biases(self.model, expert_loads, self.recipe.bias_update_speed)
        self.step += 1
        return loss.detach()

    def unlikelihood(self, batch: torch.Tensor) -> torch.Tensor:
        """The unlikelihood term of this step: unlikelihood_batch prompts of sample_prompt_len tokens cut from the
        batch's windows (each window's first piece, then each one's second, ...) continued greedily by the model as it
        is now (dropout off), then scored with grad."""
        r = self.recipe
        per_window = -(-r.unlikelihood_batch // batch.shape[0])  # ceil
        pieces = batch[:, :per_window * r.sample_prompt_len].view(batch.shape[0], per_window, r.sample_prompt_len)
        prompts = pieces.transpose(0, 1).reshape(-1, r.sample_prompt_len)[:r.unlikelihood_batch]
        continuations = greedy_generate(self.model, prompts, r.sample_new_tokens, dtype=generation_dtype(r.device))
        sequences = torch.cat([prompts, continuations], 1)
        penalised = repeated_ngram_mask(sequences, r.sample_prompt_len)[:, r.sample_prompt_len:]  # [U, new]
        with self.autocast:
            logits = self.model(sequences[:, :-1], logits_from=r.sample_prompt_len - 1).logits  # predict the new
        term = unlikelihood_loss(logits, sequences[:, r.sample_prompt_len:], penalised)
        self.unlikelihood_sums += torch.stack([term.detach(), penalised.float().mean(), torch.ones_like(term)])
        return term

    def interval_fields(self) -> dict[str, float]:
        fields = {"epoch": round(self.sampler.epochs_at(self.step), 3)}
        if self.recipe.unlikelihood_weight:
            term, share, steps = self.unlikelihood_sums.tolist()
            term, share = term / steps, share / steps
            fields |= {"unlikelihood": term, "repeated_share": share}
            self.unlikelihood_sums.zero_()
        return fields

    def validation(self) -> dict[str, float]:
        return {"val_loss": self.validation_loss()}

    def validation_loss(self) -> float:
        """Mean next-token cross-entropy over the held-out windows."""
        return held_out_loss(self.model, self.eval_windows, self.recipe.batch_size, self.autocast)
