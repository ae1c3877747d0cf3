"""The drafter's training loop: the frozen target computes each batch's features, the drafter trains every
block of random anchors at once (AdamW, warm-up + cosine, clipping, bf16 autocast on CUDA), with periodic
validation (loss and chain acceptance on fixed held-out blocks) and checkpoints. One host sync per logged
interval."""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import torch

from engine.training.checkpointing import restore_rng_states, rng_states
from engine.training.drafter_model import DrafterLM, block_loss
from engine.training.drafter_recipe import DrafterRecipe
from engine.training.loop import History, autocast_for, lr_factor
from engine.training.progress import Progress
from engine.training.recipe import TrainError
from engine.training.target_model import TargetLM


class DrafterTrainer:
    def __init__(self, drafter: DrafterLM, target: TargetLM, recipe: DrafterRecipe, train: torch.Tensor,
                 held_out: torch.Tensor) -> None:
        self.drafter, self.target, self.recipe = drafter, target, recipe
        self.train_seqs, self.held_out = train, held_out
        params = list(drafter.parameters())
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas, fused=recipe.device == "cuda")
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: lr_factor(s, recipe))
        self.autocast = autocast_for(recipe.device)
        self.step = 0
        self.history = History()
        first, last = recipe.prompt_len, recipe.seq_len - recipe.block_size  # anchors lie in the continuation
        self.eval_anchors = torch.arange(first, last + 1, recipe.block_size, device=recipe.device)

    def state(self) -> dict:
        return {"step": self.step, "recipe": self.recipe.to_dict(), "drafter": self.drafter.state_dict(),
                "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "rng": rng_states(), "history": dataclasses.asdict(self.history)}

    def restore(self, state: dict) -> None:
        self.drafter.load_state_dict(state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_states(state["rng"])
        self.step = state["step"]
        self.history = History(**state["history"])
        self.history.resumed_at.append(self.step)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's sequences [B, T] and sorted anchors [B, A], a function of (seed, step) alone."""
        r = self.recipe
        gen = torch.Generator().manual_seed(r.seed * 1_000_003 + step)
        rows = torch.randint(self.train_seqs.shape[0], (r.batch_size,), generator=gen)
        span = r.seq_len - r.block_size - r.prompt_len + 1
        anchors = r.prompt_len + torch.rand(r.batch_size, span, generator=gen).argsort(-1)[:, :r.anchors]
        return self.train_seqs[rows.to(r.device)], anchors.sort(-1).values.to(r.device)

    def _logits(self, tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self.autocast:
            hidden = self.target(tokens, hidden_layers=self.drafter.cfg.target_layer_ids, logits_from=None).hidden
        with self.autocast:
            return self.drafter(torch.cat(hidden, -1), tokens, anchors, self.target.model.embed_tokens.weight,
                                self.target.output_weight)

    def train_step(self) -> torch.Tensor:
        tokens, anchors = self.batch(self.step)
        loss = block_loss(self._logits(tokens, anchors), tokens, anchors, self.recipe.gamma)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.recipe.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return loss.detach()

    @torch.no_grad()
    def validate(self) -> tuple[float, float]:
        """(the weighted loss, the mean accepted length of the chain: leading block rows whose top-1 is the
        target's token) over every held-out block at a stride of block_size."""
        r = self.recipe
        self.drafter.eval()
        loss, accepted, n = 0.0, 0.0, 0
        for tokens in self.held_out.split(r.batch_size):
            anchors = self.eval_anchors.expand(tokens.shape[0], -1)
            logits = self._logits(tokens, anchors)
            loss += block_loss(logits, tokens, anchors, r.gamma).item() * tokens.shape[0]
            k = torch.arange(1, r.block_size, device=tokens.device)
            labels = tokens.gather(1, (anchors[:, :, None] + k).flatten(1)).view_as(logits[..., 0])
            accepted += (logits.argmax(-1) == labels).long().cumprod(-1).sum(-1).float().mean().item() * tokens.shape[0]
            n += tokens.shape[0]
        self.drafter.train()
        return loss / n, accepted / n

    def run(self, stop_at: int, progress: Progress, on_checkpoint: Callable[[dict], None]) -> None:
        r = self.recipe
        self.drafter.train()
        loss_sum = torch.zeros((), device=r.device)
        started, steps = time.perf_counter(), 0
        while self.step < stop_at:
            loss_sum += self.train_step()
            steps += 1
            if self.step % r.log_every and self.step != r.steps:
                continue
            train_loss = loss_sum.item() / steps
            if not math.isfinite(train_loss):
                raise TrainError(f"the drafter's loss became {train_loss} by step {self.step}; lower --lr")
            seconds = time.perf_counter() - started
            entry = {"step": self.step, "lr": self.scheduler.get_last_lr()[0], "train_loss": train_loss,
                     "tokens_per_s": steps * r.tokens_per_step / seconds}
            if self.step % r.eval_every == 0 or self.step == r.steps:
                entry["val_loss"], entry["val_accepted"] = self.validate()
            self.history.wall_s += time.perf_counter() - started
            self.history.intervals.append(entry)
            progress.update(self.step, entry["tokens_per_s"], train_loss, entry.get("val_loss"))
            if self.step < r.steps and (self.step % r.checkpoint_every == 0 or self.step == stop_at):
                on_checkpoint(self.state())
            loss_sum.zero_()
            started, steps = time.perf_counter(), 0
