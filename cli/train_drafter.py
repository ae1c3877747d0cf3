"""`python -m engine train-drafter`: train a DFlash drafter on a trained target, the way SpecForge and NVIDIA
ModelOpt train DFlash, and write a DFlash checkpoint directory (engine/dflash) beside the target.

The target is frozen (its embedding and lm_head too, lent to the drafter). The data is the target's own greedy
continuations of corpus prompts (engine/training/drafter_data.py); each step draws random anchors in them and
trains every block at once (engine/training/drafter_model.py). DIR ends up holding config.json,
model.safetensors and training.json; while the run goes on, checkpoints/ and the generated sequences.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch

from cli.training_options import add_optimizer_options, add_run_dir_options
from engine.loaders.dflash_checkpoint import save_dflash_dir
from engine.loaders.hf_layout import SINGLE_FILE
from engine.loaders.text import END_OF_TEXT
from engine.training.checkpointing import load_checkpoint, remove_checkpoints, restore_checkpoint
from engine.training.drafter_data import (
    SEQUENCES_FILE,
    generate_sequences,
    load_sequences,
    save_sequences,
    sequence_tensors,
)
from engine.training.drafter_loop import DrafterTrainer
from engine.training.drafter_model import DrafterLM
from engine.training.drafter_recipe import DRAFTER_PRESETS, DrafterRecipe
from engine.training.export import SAVE_DTYPES
from engine.training.progress import Progress
from engine.training.recipe import TrainError
from engine.training.run_dir import TRAINING_FILE, check_out_dir, save_run_checkpoint, start_out_dir, writing
from engine.training.target_dir import load_frozen_target

RECIPE_OPTIONS = ("steps", "batch_size", "anchors", "lr", "seed", "device", "num_sequences", "save_dtype",
                  "log_every", "eval_every", "checkpoint_every", "corpus_dir", "sampled_share")
MODEL_FILES = ("config.json", SINGLE_FILE)  # what save_dflash_dir writes (one shard)
RUN_FILES = (*MODEL_FILES, TRAINING_FILE, SEQUENCES_FILE)


def recipe_from_args(args: argparse.Namespace, checkpoint: dict | None) -> DrafterRecipe:
    given = {k: getattr(args, k) for k in RECIPE_OPTIONS if getattr(args, k) is not None}
    if "corpus_dir" in given:
        given["corpus_dir"] = str(Path(given["corpus_dir"]).resolve())
    if checkpoint is not None:
        recipe = checkpoint["recipe"]
        changed = {k: v for k, v in given.items() if getattr(recipe, k) != v}
        if changed or (args.preset is not None and args.preset != recipe.preset):
            raise TrainError(f"--resume continues the checkpoint's recipe; these options differ from it: "
                             f"{changed or {'preset': args.preset}}")
        return recipe
    given.setdefault("device", "cuda" if torch.cuda.is_available() else "cpu")
    try:
        return dataclasses.replace(DRAFTER_PRESETS[args.preset or "tiny"], **given)
    except TypeError as exc:
        raise TrainError(str(exc)) from exc


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "-m", "engine", "train-drafter", "--target", str(args.target), "--out", str(args.out)]
    for opt in ("preset", *RECIPE_OPTIONS, "pause_at"):
        if getattr(args, opt) is not None:
            parts += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    return shlex.join(parts + [f"--{flag}" for flag in ("resume", "force") if getattr(args, flag)])


def _save_drafter(out: Path, cfg, tensors: dict, save_dtype: str) -> None:
    """The DFlash directory's files into out, beside whatever else it holds: written whole into a fresh sibling
    folder by save_dflash_dir, then each renamed into out. fp8: the matrices quantized from float32, the norms
    bfloat16."""
    fp8, stored = save_dtype == "fp8", SAVE_DTYPES.get(save_dtype, torch.bfloat16)
    tensors = {n: t.detach().to("cpu", torch.float32 if fp8 and t.dim() == 2 else stored) for n, t in tensors.items()}
    staging = out.with_name(f".{out.name}.drafter-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_dflash_dir(staging, cfg, tensors, fp8=fp8)
        for name in MODEL_FILES:
            os.replace(staging / name, out / name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def train_drafter(args: argparse.Namespace) -> int:
    out = Path(args.out) if args.out is not None else Path(args.target) / "dflash"
    args.out = out
    if args.pause_at is not None and args.pause_at < 1:
        raise TrainError(f"--pause-at {args.pause_at}: expected a step >= 1")
    target, tokenizer = load_frozen_target(args.target, "cpu")  # checks the target before DIR is touched
    resume_from = check_out_dir(out, args.resume, args.force, RUN_FILES)
    state = load_checkpoint(resume_from, "drafter", DrafterRecipe.from_dict) if resume_from is not None else None
    recipe = recipe_from_args(args, state)
    if recipe.device == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    if args.pause_at is not None and (args.pause_at % recipe.log_every or args.pause_at >= recipe.steps):
        raise TrainError(f"--pause-at {args.pause_at}: expected a multiple of log_every={recipe.log_every} below "
                         f"steps={recipe.steps}")
    mask_id = tokenizer.end_of_text_id
    if mask_id is None:
        raise TrainError(f"{args.target}: its tokenizer has no {END_OF_TEXT} token, which the drafter's blocks "
                         "use as their mask token; train the target with a tokenizer that has one")
    cfg = recipe.drafter_config(target.cfg, mask_id)
    started = time.perf_counter()
    target = target.to(recipe.device)
    if state is None:  # the corpus read and the sequences generated before DIR is touched
        sequences = generate_sequences(target, tokenizer, recipe)
        start_out_dir(out, RUN_FILES)
        with writing(out):
            save_sequences(out, sequences)
    else:
        sequences = load_sequences(out, recipe)
    train, held_out, data_info = sequence_tensors(sequences, recipe)
    torch.manual_seed(recipe.seed)
    drafter = DrafterLM(cfg).to(recipe.device)
    trainer = DrafterTrainer(drafter, target, recipe, train, held_out)
    if state is not None:
        restore_checkpoint(trainer, state, resume_from)
    trainer.history.commands.append(command_line(args))
    setup_s = time.perf_counter() - started
    progress = Progress(recipe.steps, trainer.step)
    try:
        trainer.run(args.pause_at or recipe.steps, progress, lambda s: save_run_checkpoint(out, s))
    finally:
        progress.close()
    if trainer.step < recipe.steps:
        print(f"paused at step {trainer.step}: continue with --resume --out {out}", file=sys.stderr)
        return 0
    final = trainer.history.intervals[-1]
    with writing(out):
        _save_drafter(out, cfg, drafter.tensors(), recipe.save_dtype)
    report = {"commands": trainer.history.commands, "recipe": recipe.to_dict(), "config": cfg.to_dict(),
              "target": str(args.target), "num_parameters": sum(p.numel() for p in drafter.parameters()),
              "device": torch.cuda.get_device_name() if recipe.device == "cuda" else "cpu", "torch": torch.__version__,
              "data": data_info, "steps": trainer.step, "wall_time_s": trainer.history.wall_s, "setup_time_s": setup_s,
              "final_train_loss": final["train_loss"], "final_val_loss": final["val_loss"],
              "final_val_accepted": final["val_accepted"], "intervals": trainer.history.intervals}
    with writing(out):
        (out / TRAINING_FILE).write_text(json.dumps(report, indent=2) + "\n")
        remove_checkpoints(out)
        (out / SEQUENCES_FILE).unlink(missing_ok=True)
    print(f"wrote {out}: {report['num_parameters'] / 1e6:.2f} M parameters, {trainer.step} steps, val loss "
          f"{final['val_loss']:.3f}, chain acceptance on held-out blocks {final['val_accepted']:.2f} tokens",
          file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train-drafter", help="train a DFlash drafter on a trained target; write a DFlash checkpoint directory",
        description="Train a DFlash block drafter against a frozen target (a directory train-target wrote) on the "
                    "target's own continuations of corpus prompts, and write config.json, model.safetensors and "
                    "training.json into --out (default TARGET/dflash, where the dashboard and --drafter dflash "
                    "find it). docs/training.md has the presets.")
    p.add_argument("--target", required=True, type=Path, help="the trained target's directory (with tokenizer.json)")
    p.add_argument("--out", type=Path, help="the drafter's directory (default: TARGET/dflash)")
    p.add_argument("--preset", choices=sorted(DRAFTER_PRESETS), help="the recipe to start from (default tiny)")
    p.add_argument("--steps", type=int, help="optimizer steps")
    p.add_argument("--batch-size", type=int, help="sequences per step")
    p.add_argument("--anchors", type=int, help="blocks per sequence per step")
    p.add_argument("--num-sequences", type=int, help="training sequences to generate with the target")
    p.add_argument("--sampled-share", type=float, help="the share of them whose continuation the target samples at "
                                                       "T = 0.8 instead of its greedy one (default 0)")
    p.add_argument("--seed", type=int, help="seed of the prompts, the initial weights and the anchors")
    add_optimizer_options(p)
    p.add_argument("--corpus-dir", type=Path, help="draw prompts from this folder instead of the standard library")
    add_run_dir_options(p)
    p.set_defaults(func=train_drafter)
