"""The run directory of train-target and train-drafter: created by its run, or refused, and never emptied.

A directory holds a run of ours when it has training.json (a finished run) or checkpoints/step-*.pt (an
unfinished one). check_out_dir runs before anything is written and changes nothing; start_out_dir then deletes
only what a run writes (its checkpoints and its own file names), and only where --force asked for it. A folder
that holds other files is refused unless --force, and even then they stay untouched.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from engine.training.checkpointing import CHECKPOINT_DIR, checkpoints, remove_checkpoints, save_checkpoint
from engine.training.recipe import TrainError

TRAINING_FILE = "training.json"


def _check_writable(out_dir: Path) -> None:
    """--out is a directory, or can be created as one: no file at it or above it, and writable."""
    if out_dir.exists() and not out_dir.is_dir():
        raise TrainError(f"--out {out_dir} is a file; pass a directory (it is created if missing)")
    existing = out_dir if out_dir.exists() else next(p for p in out_dir.absolute().parents if p.exists())
    if not existing.is_dir():
        raise TrainError(f"--out {out_dir}: {existing} is a file, so no directory can be created under it; "
                         "pass a path under a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainError(f"--out {out_dir}: {existing} is not writable; choose another --out or fix its permissions")


def holds_run(out_dir: Path) -> bool:
    """Whether out_dir holds a run of ours: training.json or checkpoints."""
    return (out_dir / TRAINING_FILE).is_file() or bool(checkpoints(out_dir))


def check_out_dir(out_dir: Path, resume: bool, force: bool, run_files: tuple[str, ...]) -> Path | None:
    """Check DIR against --resume/--force, changing nothing; returns the checkpoint to resume from (None: a
    fresh run). A fresh run into a DIR that holds a run needs --force (or --resume to continue an unfinished
    one); so does one into a DIR that holds anything else, whose files --force leaves alone except run_files."""
    _check_writable(out_dir)
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
    others = sorted(p.name for p in out_dir.iterdir()) if out_dir.is_dir() and not (finished or found) else []
    if others and not force:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise TrainError(f"--out {out_dir} already holds files no training run wrote ({shown}); choose a new or "
                         f"empty --out (the run creates it), or pass --force to write {', '.join(run_files)} there "
                         "beside them (replacing those names)")
    return None


def start_out_dir(out_dir: Path, run_files: tuple[str, ...]) -> None:
    """Create DIR for a fresh run (check_out_dir passed), deleting only the run's own files: its checkpoints and
    run_files, which an earlier run (or a file of the same name that --force let us replace) left there."""
    with writing(out_dir):
        remove_checkpoints(out_dir)
        for name in run_files:
            if (out_dir / name).is_file() or (out_dir / name).is_symlink():
                (out_dir / name).unlink()
        out_dir.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def writing(out_dir: Path) -> Iterator[None]:
    """A failed write (a full disk, a permission) as a TrainError naming the directory. torch.save reports its
    write errors as RuntimeError, so the block holds writes only."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0]
        raise TrainError(f"writing into {out_dir} failed: {reason}; free space there or choose "
                         "another --out, then start again (or --resume from the last checkpoint)") from exc


def save_run_checkpoint(out_dir: Path, state: dict) -> None:
    """save_checkpoint, a failed write reported with the directory (the trainers' on_checkpoint)."""
    with writing(out_dir):
        save_checkpoint(out_dir, state)
