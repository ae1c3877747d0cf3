"""The drafter's training loop: the frozen target computes each batch's features, the drafter trains every
block of random anchors at once (AdamW, warm-up + cosine, clipping, bf16 autocast on CUDA), with periodic
validation (loss and chain acceptance on fixed held-out blocks) and checkpoints (engine/training/trainer.py holds
what it shares with the target's loop)."""
from __future__ import annotations

import torch

from engine.training.drafter_model import DrafterLM, block_loss
from engine.training.drafter_recipe import DrafterRecipe
from engine.training.target_model import TargetLM
from engine.training.trainer import TrainerBase


class DrafterTrainer(TrainerBase):
    state_key = "drafter"
    loss_name = "the drafter's loss"

    def __init__(self, drafter: DrafterLM, target: TargetLM, recipe: DrafterRecipe, train: torch.Tensor,
                 held_out: torch.Tensor) -> None:
        super().__init__(drafter, recipe)
        self.drafter, self.target = drafter, target
        self.train_seqs, self.held_out = train, held_out
        first, last = recipe.prompt_len, recipe.seq_len - recipe.block_size  # anchors lie in the continuation
        self.eval_anchors = torch.arange(first, last + 1, recipe.block_size, device=recipe.device)

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
        self.optimizer_step(loss)
        self.step += 1
        return loss.detach()

    def validation(self) -> dict[str, float]:
        val_loss, val_accepted = self.validate()
        return {"val_loss": val_loss, "val_accepted": val_accepted}

    @torch.no_grad()
    def validate(self) -> tuple[float, float]:
        """(the weighted loss, the mean accepted length of the chain: leading block rows whose top-1 is the
        target's token) over every held-out block at a stride of block_size."""
        r = self.recipe
        loss, accepted, n = 0.0, 0.0, 0
        for tokens in self.held_out.split(r.batch_size):
            anchors = self.eval_anchors.expand(tokens.shape[0], -1)
            logits = self._logits(tokens, anchors)
            loss += block_loss(logits, tokens, anchors, r.gamma).item() * tokens.shape[0]
            k = torch.arange(1, r.block_size, device=tokens.device)
            labels = tokens.gather(1, (anchors[:, :, None] + k).flatten(1)).view_as(logits[..., 0])
            accepted += (logits.argmax(-1) == labels).long().cumprod(-1).sum(-1).float().mean().item() * tokens.shape[0]
            n += tokens.shape[0]
        return loss / n, accepted / n
