"""Periodic training checkpoints in the run directory (checkpoints/step-NNNNNNN.pt; run_dir.py has the rest).

A checkpoint holds everything a resumed run needs to continue exactly: the model (router biases included),
the optimizer and scheduler, the step, the RNG states, the recipe and the logged history. It is written to a
temporary file and renamed, so a run killed mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import torch

from engine.training.recipe import TrainError

CHECKPOINT_DIR = "checkpoints"
STATE_KEYS = ("step", "recipe", "optimizer", "scheduler", "rng", "history")  # beside the weights' key
KEEP_CHECKPOINTS = 2
_NAME = re.compile(r"step-(\d{7})\.pt")


def checkpoints(out_dir: Path) -> list[Path]:
    """The run's checkpoints, oldest first."""
    folder = out_dir / CHECKPOINT_DIR
    found = [p for p in folder.glob("step-*.pt") if _NAME.fullmatch(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(_NAME.fullmatch(p.name).group(1)))


def save_checkpoint(out_dir: Path, state: dict) -> Path:
    """Write state as the checkpoint of state["step"]; keep the last KEEP_CHECKPOINTS."""
    folder = out_dir / CHECKPOINT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step-{state['step']:07d}.pt"
    partial = path.with_suffix(".pt.partial")
    torch.save(state, partial)
    os.replace(partial, path)
    for old in checkpoints(out_dir)[:-KEEP_CHECKPOINTS]:
        old.unlink()
    return path


def load_checkpoint(path: Path, weights_key: str, parse_recipe: Callable[[dict], object]) -> dict:
    """A checkpoint of this command (weights under weights_key: "model" for train-target, "drafter" for
    train-drafter), checked for its keys and step, with its recipe parsed by parse_recipe."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a truncated or foreign file
        raise TrainError(f"{path}: not a readable training checkpoint ({exc}); delete it to resume from the one "
                         "before, or start over with --force") from exc
    keys = {weights_key, *STATE_KEYS}
    if not isinstance(state, dict) or set(state) != keys:
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise TrainError(f"{path}: not a checkpoint of this command (keys {found}, expected {sorted(keys)}); "
                         "resume it with the command that wrote it, or start over with --force")
    step = _NAME.fullmatch(path.name)
    if not isinstance(state["step"], int) or (step is not None and int(step.group(1)) != state["step"]):
        raise TrainError(f"{path}: its step {state['step']!r} does not match its name; the file was changed. "
                         "Delete it to resume from the one before, or start over with --force")
    try:
        state["recipe"] = parse_recipe(state["recipe"])
    except (TypeError, ValueError, KeyError) as exc:
        raise TrainError(f"{path}: its recipe is not one of this version ({exc}); start over with --force") from exc
    return state


def restore_checkpoint(trainer, state: dict, path: Path) -> None:
    """trainer.restore(state), a state that does not fit the trainer's model or optimizer reported as such."""
    try:
        trainer.restore(state)
    except (KeyError, TypeError, ValueError, RuntimeError, IndexError) as exc:
        raise TrainError(f"{path}: its state does not fit this run ({str(exc).splitlines()[0]}); the file was "
                         "changed or belongs to another run. Delete it to resume from the one before, or start "
                         "over with --force") from exc


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def remove_checkpoints(out_dir: Path) -> None:
    """Delete the run's checkpoints (and their folder, once empty)."""
    for path in checkpoints(out_dir):
        path.unlink()
    folder = out_dir / CHECKPOINT_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
