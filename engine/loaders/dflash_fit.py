"""Whether a DFlash drafter fits its target: what refuses it (it cannot run) and what only warns (it runs, every
token stays the target's greedy choice, but acceptance is expected to drop).

Refused, naming the field: hidden_size != the target's (the drafter embeds with the target's embedding and its
fc reads the target's hidden states); vocab_size beyond the target's vocabulary (the drafter has no vocabulary
of its own: it embeds and scores with the target's; DFlashConfig already holds mask_token_id below vocab_size,
so the mask is one of the target's tokens); a target_layer_id the target does not
have. Warned: a decode block size other than the checkpoint's (DFlash is trained at one block size, but the
forward runs at any: fewer MASK positions draft less deep, more draft positions it never learned), and
num_target_layers other than the target's depth (the drafter was trained on another target's layers).
"""
from __future__ import annotations

from engine.config import ModelConfig
from engine.loaders.dflash_config import DFlashConfig, DFlashLoadError


def check_fits(cfg: DFlashConfig, target: ModelConfig, where: str) -> None:
    """Raise DFlashLoadError naming the first field that keeps the drafter from running on this target."""
    if cfg.hidden_size != target.hidden_size:
        raise DFlashLoadError(f"{where}: hidden_size={cfg.hidden_size}, but the target's hidden_size is "
                              f"{target.hidden_size}: the drafter reads the target's hidden states and embeds with "
                              "its embedding; pick the drafter trained for this target")
    if cfg.vocab_size > target.vocab_size:
        raise DFlashLoadError(f"{where}: vocab_size={cfg.vocab_size} is beyond the target's vocabulary of "
                              f"{target.vocab_size} tokens; pick the drafter trained for this target")
    bad = [i for i in cfg.target_layer_ids if i >= target.num_hidden_layers]
    if bad:
        raise DFlashLoadError(f"{where}: dflash_config.target_layer_ids={list(cfg.target_layer_ids)} names "
                              f"layer(s) {bad}, but the target has layers 0..{target.num_hidden_layers - 1}; pick "
                              "the drafter trained for this target")


def block_size_note(cfg: DFlashConfig, block_size: int) -> str | None:
    """Why a decode at block_size is expected to accept less than at the checkpoint's, or None if they agree."""
    if block_size == cfg.block_size:
        return None
    return (f"the decode's block_size {block_size} differs from the checkpoint's {cfg.block_size}: DFlash is trained "
            f"at one block size, so acceptance is expected to drop (the tokens stay exact); decode at block size "
            f"{cfg.block_size} to match")


def depth_note(cfg: DFlashConfig, target_layers: int) -> str | None:
    """Why a drafter trained against a target of another depth (target_layers layers) is expected to accept less,
    or None."""
    if cfg.num_target_layers == target_layers:
        return None
    return (f"num_target_layers={cfg.num_target_layers}, but the target has {target_layers} layers: the "
            "drafter was trained on the hidden states of another target, so acceptance is expected to drop")
