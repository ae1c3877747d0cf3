"""The command-line options train-target and train-drafter share: one definition of each."""
from __future__ import annotations

import argparse

from engine.training.export import SAVE_DTYPE_CHOICES


def add_optimizer_options(p: argparse.ArgumentParser) -> None:
    """--lr, --device, --save-dtype and the logging / validation / checkpoint intervals."""
    p.add_argument("--lr", type=float, help="peak learning rate")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda where torch sees a GPU")
    p.add_argument("--save-dtype", choices=SAVE_DTYPE_CHOICES, help="dtype of model.safetensors (fp8: the matrices "
                   "block-wise FP8 as DeepSeek-V3 ships them, the rest bfloat16)")
    p.add_argument("--log-every", type=int, help="steps per logged interval")
    p.add_argument("--eval-every", type=int, help="steps between validations (a multiple of --log-every)")
    p.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (a multiple of --log-every)")


def add_run_dir_options(p: argparse.ArgumentParser) -> None:
    """--pause-at, --resume and --force: how a run treats its directory (engine/training/checkpointing.py)."""
    p.add_argument("--pause-at", type=int, help="stop after this step with a checkpoint (continue: --resume)")
    p.add_argument("--resume", action="store_true", help="continue the unfinished run in --out")
    p.add_argument("--force", action="store_true", help="start over in an --out that holds a run, or "
                   "write into one that holds other files (leaving them alone)")
