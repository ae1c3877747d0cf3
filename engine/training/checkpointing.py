"""The run directory: periodic training checkpoints (checkpoints/step-NNNNNNN.pt) and the finished model.

A checkpoint holds everything a resumed run needs to continue exactly: the model (router biases included),
the optimizer and scheduler, the step, the RNG states, the recipe and the logged history. It is written to a
temporary file and renamed, so a run killed mid-write leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from engine.loaders.hf_layout import SINGLE_FILE
from engine.loaders.loading import PROMPTS_FILE
from engine.loaders.text import TOKENIZER_FILE
from engine.training.recipe import TrainError

CHECKPOINT_DIR = "checkpoints"
TRAINING_FILE = "training.json"
RUN_FILES = ("config.json", SINGLE_FILE, TOKENIZER_FILE, TRAINING_FILE, PROMPTS_FILE)  # a finished run's files
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


def load_checkpoint(path: Path) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a truncated or foreign file
        raise TrainError(f"{path}: not a readable training checkpoint ({exc}); delete it to resume from the one "
                         "before, or start over with --force") from exc


def rng_states() -> dict:
    states = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def check_out_dir(out_dir: Path, resume: bool, force: bool) -> Path | None:
    """Check DIR against --resume/--force, changing nothing; returns the checkpoint to resume from (None: a
    fresh run). A fresh run into a DIR that holds a finished run needs --force, as does one into a DIR with
    checkpoints of an unfinished run (or continue that one with --resume)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainError(f"--out {out_dir} is a file; pass a directory (it is created if missing)")
    finished = (out_dir / TRAINING_FILE).is_file()
    found = checkpoints(out_dir)
    if resume:
        if force:
            raise TrainError("--resume and --force contradict each other: --resume continues the run in --out, "
                             "--force starts it over")
        if finished:
            raise TrainError(f"{out_dir} holds a finished run ({TRAINING_FILE}); there is nothing to resume. "
                             "Pass --force (without --resume) to train it again, or choose another --out")
        if not found:
            raise TrainError(f"--resume: {out_dir / CHECKPOINT_DIR} holds no checkpoint; start the run without "
                             "--resume")
        return found[-1]
    if (finished or found) and not force:
        what = f"a finished run ({TRAINING_FILE})" if finished else f"checkpoints of an unfinished run ({found[-1]})"
        raise TrainError(f"{out_dir} holds {what}; pass --resume to continue an unfinished run, --force to start "
                         "over, or choose another --out")
    return None


def remove_checkpoints(out_dir: Path) -> None:
    """Delete the run's checkpoints (and their folder, once empty)."""
    for path in checkpoints(out_dir):
        path.unlink()
    folder = out_dir / CHECKPOINT_DIR
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()


def start_out_dir(out_dir: Path) -> None:
    """Create DIR for a fresh run, deleting only what an earlier run wrote there (its checkpoints and files)."""
    remove_checkpoints(out_dir)
    for name in RUN_FILES:
        (out_dir / name).unlink(missing_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
