"""Sequence-level unlikelihood (Welleck et al., 2020, "Neural Text Generation with Unlikelihood Training"): the target
continues prompts greedily, and every continuation token that completes an n-gram the continuation already holds
is made less likely where it was picked, by -log(1 - p(token)). A small model trained on likelihood alone falls
into loops under greedy decoding; this term is aimed at exactly that, while the likelihood term beside it keeps
the model on the text.

Everything stays on the device: the repeat mask is computed by comparing n-grams, with no host sync."""
from __future__ import annotations

import torch

from engine.training.ngrams import DISTINCT_N


def repeated_ngram_mask(tokens: torch.Tensor, start: int, n: int = DISTINCT_N) -> torch.Tensor:
    """[B, L] int64 -> [B, L] bool: position t (>= start + n - 1) is True when the n-gram tokens[t-n+1 .. t] also
    ends at an earlier position s >= start + n - 1, i.e. it repeats an n-gram lying wholly in tokens[start:]."""
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [B, L], got shape {tuple(tokens.shape)}")
    if not 0 <= start <= tokens.shape[1] or n < 1:
        raise ValueError(f"start={start}, n={n}: expected 0 <= start <= L={tokens.shape[1]} and n >= 1")
    mask = torch.zeros(tokens.shape, dtype=torch.bool, device=tokens.device)
    span = tokens[:, start:]
    if span.shape[1] < n:
        return mask
    grams = span.unfold(1, n, 1)  # [B, G, n]: gram g ends at position start + g + n - 1
    same = (grams[:, :, None, :] == grams[:, None, :, :]).all(-1)  # [B, G, G]
    earlier = torch.ones(same.shape[1:], dtype=torch.bool, device=tokens.device).tril(-1)  # [G, G]: s < t
    mask[:, start + n - 1:] = (same & earlier).any(-1)
    return mask


def unlikelihood_loss(logits: torch.Tensor, targets: torch.Tensor, penalised: torch.Tensor) -> torch.Tensor:
    """Mean over all positions of -log(1 - p(target)) where penalised, 0 elsewhere.

    logits [B, T, V] (any float dtype; computed in float32), targets [B, T] the tokens they predicted, penalised
    [B, T] bool. log(1 - p) is the log-sum-exp of the other logits less that of all of them: exact however sure the
    model was, and its gradient with respect to the penalised logit is p itself, bounded. That difference cancels
    where p is small, so there log1p(-p) is taken instead: each form is used where it keeps float32's precision."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    others = z.scatter(-1, targets[..., None], float("-inf"))
    p = (z.gather(-1, targets[..., None])[..., 0] - lse).exp()
    log_rest = torch.where(p < 0.5, torch.log1p(-p.clamp(max=0.5)), torch.logsumexp(others, dim=-1) - lse)  # [B, T]
    return -(log_rest * penalised).sum() / penalised.numel()
