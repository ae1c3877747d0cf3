"""The DFlash drafter: z-lab's learned block drafter, reading the target's hidden states, inside the no-sync step.

begin writes the prompt's context rows (positions 0..n-1) into the drafter's cache; propose runs the block
[root, MASK x L] against the valid rows; commit projects the accepted path's rows (gathered by the path, padded
to L + 1 rows with static shapes: the pad rows land past the valid length, masked, and the next commit writes
over them) and advances the valid length by path_len on the device.
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.drafters.base import DraftTarget
from engine.loaders.dflash_checkpoint import load_tensors, read_dflash_dir
from engine.loaders.dflash_config import DFlashConfig
from engine.loaders.dflash_fit import block_size_note, check_fits, depth_note
from engine.model.dflash import DFlashModel, DFlashWeights
from engine.settings import ConfigError, Setting, check_fields, option, options_of

if TYPE_CHECKING:
    from engine.config import DecodeConfig
    from engine.model.target import TargetModel

SUMMARY = ("z-lab's learned DFlash block drafter (a DFlashDraftModel checkpoint directory, --drafter-model DIR): "
           "reads the target's hidden states at its target_layer_ids and drafts the next L positions in one "
           "forward of [root, MASK x L].")


@dataclass(frozen=True, slots=True)
class DFlashSettings:
    model: str | None = option(None, Setting(
        "a DFlash checkpoint directory (config.json + safetensors, z-lab's layout); by default the target's own, "
        "<target dir>/dflash/ or <target>-dflash/, when it has one", "Drafter checkpoint", "--drafter-model",
        "text", metavar="DIR", key="drafter_model"))

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.model:
            setting = options_of(DFlashSettings)[0].setting
            raise ConfigError(f"drafter 'dflash' needs a checkpoint directory ({setting.flag} {setting.metavar})")


@functools.lru_cache(maxsize=2)
def shared_weights(source: str, identity: tuple, device: str, dtype: torch.dtype) -> DFlashWeights:
    """The drafter's weights on device in dtype, read once per checkpoint file identity (name, mtime, size of
    every file: a rewritten checkpoint loads again) and shared by every decoder. Two entries at most."""
    ckpt = read_dflash_dir(source)
    return DFlashWeights.from_tensors(ckpt.config, load_tensors(ckpt, device, dtype))


class DFlashDrafter:
    name = "dflash"

    def __init__(self, cfg: DFlashConfig, weights: DFlashWeights, model: TargetModel, num_draft_positions: int,
                 capacity: int, source: str) -> None:
        self.cfg, self.source = cfg, source
        self.hidden_layers = cfg.target_layer_ids
        self.model = DFlashModel(cfg, weights, model.embed, model.lm_head, num_draft_positions, capacity)

    def begin(self, prompt: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.model.write_context(hidden, 0)
        self.model.length.fill_(hidden.shape[0])

    def propose(self, root: torch.Tensor, num_generated: torch.Tensor) -> torch.Tensor:
        return self.model.block_logprobs(root)

    def commit(self, path: torch.Tensor, path_len: torch.Tensor, hidden: torch.Tensor | None) -> None:
        self.model.write_context(hidden.index_select(0, path.clamp(min=0)), self.model.length)
        self.model.length.add_(path_len)

    def describe(self) -> dict:
        cfg = self.cfg
        return {"name": self.name, "model": self.source, "num_layers": cfg.num_hidden_layers,
                "block_size": cfg.block_size, "target_layer_ids": list(cfg.target_layer_ids),
                "mask_token_id": cfg.mask_token_id, "hidden_size": cfg.hidden_size}


def context_capacity(prompt_len: int, max_new_tokens: int, block_size: int) -> int:
    """Cache rows a decode needs, like the target's: prompt + max_new_tokens + block_size, plus the L + 1 rows a
    commit writes (the last step may commit past max_new_tokens)."""
    return prompt_len + max_new_tokens + 2 * block_size


def drafter_for(cfg: DFlashConfig, source: str, identity: tuple, model: TargetModel, prompt_len: int,
                decode: DecodeConfig) -> DFlashDrafter:
    """A drafter of cfg (the checkpoint's, or a variant of its ids or RoPE: the drafter check) over the shared
    weights of the checkpoint at source, for one decode of a prompt of prompt_len tokens."""
    weights = shared_weights(source, identity, str(model.device), model.dtype)
    capacity = context_capacity(prompt_len, decode.max_new_tokens, decode.block_size)
    return DFlashDrafter(cfg, weights, model, decode.num_draft_positions, capacity, source)


def block_size(settings: DFlashSettings) -> int:
    """The block size the checkpoint was trained at (its config.json's block_size): a decode's default with it."""
    return read_dflash_dir(settings.model).config.block_size


def build(settings: DFlashSettings, target: DraftTarget) -> DFlashDrafter:
    """Load (once) the checkpoint settings.model names, refuse it where it cannot run on target.model (the loader's
    and check_fits' DFlashLoadError), warn where it runs but is expected to accept less."""
    ckpt = read_dflash_dir(settings.model)
    check_fits(ckpt.config, target.model.cfg, ckpt.source)
    notes = (block_size_note(ckpt.config, target.cfg.block_size),
             depth_note(ckpt.config, target.model.cfg.num_hidden_layers))
    for note in notes:
        if note is not None:
            warnings.warn(f"{ckpt.source}: {note}", stacklevel=2)
    return drafter_for(ckpt.config, ckpt.source, ckpt.identity, target.model, len(target.prompt), target.cfg)
