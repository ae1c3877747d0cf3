"""`python -m engine train-target`: train the target model on text and write a Hugging Face model directory.

DIR ends up holding config.json, model.safetensors, tokenizer.json and training.json (the recipe, the
command, the losses); while the run goes on it also holds checkpoints/ (see checkpointing.py). docs/training.md
describes the corpus, the presets and the files.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from cli.training_options import add_optimizer_options, add_run_dir_options
from engine.loaders.hf_layout import SINGLE_FILE
from engine.loaders.loading import PROMPTS_FILE
from engine.loaders.text import TOKENIZER_FILE, Tokenizer, train_bpe
from engine.training.checkpointing import load_checkpoint, remove_checkpoints, restore_checkpoint
from engine.training.corpus import draw_prompts, load_corpus
from engine.training.data import WindowSampler, eval_windows, token_stream
from engine.training.export import save_hf_dir
from engine.training.generate import distinct_ngram_rate, generation_dtype, greedy_generate
from engine.training.loop import Trainer, held_out_loss
from engine.training.progress import Progress
from engine.training.recipe import PRESETS, Recipe, TrainError
from engine.training.run_dir import TRAINING_FILE, check_out_dir, save_run_checkpoint, start_out_dir, writing
from engine.training.target_dir import load_frozen_target, load_target
from engine.training.target_model import TargetLM

RUN_FILES = ("config.json", SINGLE_FILE, TOKENIZER_FILE, TRAINING_FILE, PROMPTS_FILE)  # a finished run's files

# CLI option -> Recipe field, for the options that override the preset
RECIPE_OPTIONS = {"steps": "steps", "batch_size": "batch_size", "seq_len": "seq_len", "lr": "lr",
                  "seed": "seed", "device": "device", "save_dtype": "save_dtype", "dropout": "dropout",
                  "log_every": "log_every", "eval_every": "eval_every", "checkpoint_every": "checkpoint_every",
                  "corpus_dir": "corpus_dir", "init_from": "init_from",
                  "unlikelihood_weight": "unlikelihood_weight", "unlikelihood_batch": "unlikelihood_batch",
                  "unlikelihood_every": "unlikelihood_every", "compile": "compile"}


def _given(args: argparse.Namespace) -> dict:
    """The recipe fields the command line sets (options left out are None)."""
    given = {field: getattr(args, opt) for opt, field in RECIPE_OPTIONS.items() if getattr(args, opt) is not None}
    for path in ("corpus_dir", "init_from"):
        if path in given:
            given[path] = str(Path(given[path]).resolve())
    return given


def recipe_from_args(args: argparse.Namespace, checkpoint: dict | None) -> Recipe:
    """The preset with the command line's overrides; with --resume, the checkpoint's recipe, which the command
    line may repeat but not change."""
    given = _given(args)
    if checkpoint is not None:
        recipe = checkpoint["recipe"]
        changed = {k: v for k, v in given.items() if getattr(recipe, k) != v}
        if changed or (args.preset is not None and args.preset != recipe.preset):
            raise TrainError(f"--resume continues the recipe of the checkpoint; these options differ from it: "
                             f"{changed or {'preset': args.preset}}. Drop them, or start a new run in another --out")
        return recipe
    base = PRESETS[args.preset or "tiny"]
    if "device" not in given:
        given["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return dataclasses.replace(base, **given)
    except TypeError as exc:  # a wrong type for a field
        raise TrainError(str(exc)) from exc


def _check_same_shape(recipe: Recipe, initial: TargetLM) -> None:
    """--init-from's model must be the recipe's (a preset's shape with the directory's vocabulary)."""
    wanted = recipe.model_config(initial.cfg.vocab_size)
    if initial.cfg != wanted:
        diff = {k: (v, getattr(initial.cfg, k)) for k, v in wanted.to_dict().items() if getattr(initial.cfg, k) != v}
        raise TrainError(f"--init-from {recipe.init_from}: its model is not the {recipe.preset} preset's "
                         f"(field: (preset, directory)) {diff}; pick the preset it was trained with")


def _initial_model(init_from: str) -> dict:
    """Where --init-from's weights came from: its directory and its own training.json (None if it has none), so
    the record of a fine-tuned model reaches back to the run that made its starting point."""
    record = Path(init_from) / TRAINING_FILE
    try:
        training = json.loads(record.read_text())
    except (OSError, ValueError):
        training = None
    return {"directory": init_from, "training": training}


def _check_device(device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():
        raise TrainError(f"--device cuda: torch {torch.__version__} sees no CUDA GPU here; use --device cpu")


def _check_compile(recipe: Recipe) -> None:
    """--compile needs what torch.compile generates code with: triton on a GPU, a C++ compiler on the CPU."""
    if not recipe.compile:
        return
    if recipe.device == "cuda":
        if importlib.util.find_spec("triton") is None:
            raise TrainError("--compile on cuda needs triton (torch.compile's GPU code generator), which this Python "
                             "lacks: pip install triton, or drop --compile")
        return
    from torch._inductor.cpp_builder import get_cpp_compiler
    try:
        get_cpp_compiler()
    except Exception as exc:  # inductor's own compiler search found none (InvalidCxxCompiler)
        raise TrainError(f"--compile on the CPU needs a C++ compiler (g++) and torch.compile found none "
                         f"({type(exc).__name__}); install g++ (apt-get install g++), or drop --compile") from exc


def _device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def command_line(args: argparse.Namespace) -> str:
    """The command, options in a fixed order, as a shell line."""
    parts = ["python", "-m", "engine", "train-target", "--out", str(args.out)]
    for opt in ("preset", *RECIPE_OPTIONS, "tokenizer", "pause_at"):
        value = getattr(args, opt)
        if isinstance(value, bool):  # --compile / --no-compile
            parts.append(f"--{'' if value else 'no-'}{opt.replace('_', '-')}")
        elif value is not None:
            parts += [f"--{opt.replace('_', '-')}", str(value)]
    parts += [f"--{flag}" for flag in ("resume", "force") if getattr(args, flag)]
    return shlex.join(parts)


def _sample(model: TargetLM, recipe: Recipe, prompts: torch.Tensor, tokenizer: Tokenizer) -> tuple[dict, list[int]]:
    """Greedy continuations of the held-out prompts: their distinct-4-gram rate, the order prompts.json lists the
    prompts in (first the one whose continuation repeats itself least, the default prompt, then the rest as drawn),
    and that first one as text."""
    prompts = prompts.to(recipe.device)
    tokens = greedy_generate(model, prompts, recipe.sample_new_tokens, dtype=generation_dtype(recipe.device)).tolist()
    rates = [distinct_ngram_rate([row], 4) for row in tokens]
    best = max(range(len(rates)), key=lambda i: (rates[i], -i))
    order = [best] + [i for i in range(len(rates)) if i != best]
    return {"prompts": recipe.sample_prompts, "prompt_tokens": recipe.sample_prompt_len,
            "new_tokens": recipe.sample_new_tokens, "distinct_4gram_rate": sum(rates) / len(rates),
            "example": {"prompt": tokenizer.decode(prompts[best].tolist()),
                        "continuation": tokenizer.decode(tokens[best]), "distinct_4gram_rate": rates[best]}}, order


def train_target(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.resume and args.tokenizer is not None:
        raise TrainError(f"--resume uses {out / TOKENIZER_FILE}, the run's own tokenizer; drop --tokenizer")
    if args.init_from is not None and args.tokenizer is not None:
        raise TrainError(f"--init-from uses {Path(args.init_from) / TOKENIZER_FILE}, the tokenizer its weights were "
                         "trained with; drop --tokenizer")
    if args.pause_at is not None and args.pause_at < 1:
        raise TrainError(f"--pause-at {args.pause_at}: expected a step >= 1")
    given_tokenizer = Tokenizer.load(args.tokenizer) if args.tokenizer is not None else None
    resume_from = check_out_dir(out, args.resume, args.force, RUN_FILES)
    state = load_checkpoint(resume_from, "model", Recipe.from_dict) if resume_from is not None else None
    recipe = recipe_from_args(args, state)
    _check_device(recipe.device)
    _check_compile(recipe)
    initial, initial_record = None, None
    if state is None and recipe.init_from is not None:  # read and checked before DIR is touched
        initial, given_tokenizer = load_target(recipe.init_from, "cpu", recipe.dropout)
        _check_same_shape(recipe, initial)
        initial_record = _initial_model(recipe.init_from)
    if args.pause_at is not None and (args.pause_at % recipe.log_every or args.pause_at >= recipe.steps):
        raise TrainError(f"--pause-at {args.pause_at}: expected a multiple of log_every={recipe.log_every} below "
                         f"steps={recipe.steps}")
    if recipe.device == "cuda":  # repeatable runs: a fixed cuBLAS workspace, attention's deterministic backward
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    started = time.perf_counter()
    corpus = load_corpus(recipe.corpus_dir)
    tokenizer = given_tokenizer
    if state is not None:
        tokenizer = Tokenizer.load(out)
    elif tokenizer is None:
        print(f"training a {recipe.vocab_size}-token BPE tokenizer on {corpus.name}'s train split", file=sys.stderr)
        tokenizer = train_bpe(corpus.texts("train"), recipe.vocab_size)
    cfg = recipe.model_config(tokenizer.vocab_size)
    # Every file read, both splits big enough, the held-out prompts drawn: all before DIR is touched.
    train_stream = token_stream(corpus, tokenizer, "train").to(recipe.device)
    held_out = token_stream(corpus, tokenizer, "held-out")
    sampler = WindowSampler(train_stream, recipe.seq_len, recipe.batch_size, recipe.seed)
    windows = eval_windows(held_out, recipe.seq_len, recipe.eval_windows)
    prompts = torch.from_numpy(draw_prompts(corpus, tokenizer, recipe.sample_prompts, recipe.sample_prompt_len,
                                            recipe.seed))
    if state is None:
        start_out_dir(out, RUN_FILES)
        with writing(out):
            tokenizer.save(out)
    torch.manual_seed(recipe.seed)
    if initial is None:
        initial = TargetLM(cfg, dropout=recipe.dropout)  # initialised on the CPU: the same on any device
    model = initial.to(recipe.device)
    trainer = Trainer(model, recipe, sampler, windows)
    if state is None:
        trainer.history.tokenizer_source = str(args.tokenizer or args.init_from or "train_bpe on the train split")
        trainer.history.initial_model = initial_record
    else:
        restore_checkpoint(trainer, state, resume_from)  # logs the step it resumes at
    trainer.history.commands.append(command_line(args))
    setup_s = time.perf_counter() - started
    stop_at = args.pause_at or recipe.steps
    progress = Progress(recipe.steps, trainer.step)
    try:
        trainer.run(stop_at, progress, lambda s: save_run_checkpoint(out, s))
    finally:
        progress.close()
    if trainer.step < recipe.steps:
        print(f"paused at step {trainer.step}: continue with --resume --out {out}", file=sys.stderr)
        return 0
    last = trainer.history.intervals[-1]
    with writing(out):
        save_hf_dir(model, out, recipe.save_dtype, tokenizer.end_of_text_id)
    # The validation loss and the greedy sample of the model as saved (its dtype's rounding included): what a user
    # gets.
    saved = load_frozen_target(out, recipe.device)[0]
    saved_val_loss = held_out_loss(saved, trainer.eval_windows, recipe.batch_size, trainer.autocast)
    sample, order = _sample(saved, recipe, prompts, tokenizer)
    report = {
        "commands": trainer.history.commands, "recipe": recipe.to_dict(), "model_config": cfg.to_dict(),
        "num_parameters": sum(p.numel() for p in model.parameters()), "device": _device_name(recipe.device),
        "torch": torch.__version__, "corpus": corpus.describe(),
        "tokenizer": {"vocab_size": tokenizer.vocab_size, "source": trainer.history.tokenizer_source,
                      "train_tokens": train_stream.numel(), "held_out_tokens": held_out.numel()},
        "steps": trainer.step, "tokens_seen": trainer.step * recipe.tokens_per_step,
        "epochs": trainer.sampler.epochs_at(trainer.step), "wall_time_s": trainer.history.wall_s,
        "setup_time_s": setup_s, "resumed_at": trainer.history.resumed_at,
        "final_train_loss": last["train_loss"], "final_val_loss": last["val_loss"], "saved_val_loss": saved_val_loss,
        "greedy_sample": sample, "intervals": trainer.history.intervals,
        "initial_model": trainer.history.initial_model,
    }
    with writing(out):
        (out / PROMPTS_FILE).write_text(json.dumps({
            "source": f"the held-out split of {corpus.name} (engine/training/corpus.py), drawn with seed {recipe.seed}",
            "order": "first the prompt whose greedy continuation has the highest distinct-4-gram rate, then as drawn",
            "prompts": [{"text": tokenizer.decode(prompts[i].tolist())} for i in order]}, indent=2) + "\n")
        (out / TRAINING_FILE).write_text(json.dumps(report, indent=2) + "\n")
        remove_checkpoints(out)
    print(f"wrote {out}: {report['num_parameters'] / 1e6:.2f} M parameters, {trainer.step} steps, "
          f"train loss {last['train_loss']:.3f}, val loss {last['val_loss']:.3f} ({saved_val_loss:.3f} as saved), "
          f"distinct-4-gram {report['greedy_sample']['distinct_4gram_rate']:.2f}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train-target", help="train the target model on text; write a Hugging Face model directory",
        description="Train a DeepSeek-V3-architecture target on the Python standard library's sources (or "
                    "--corpus-dir) and write config.json, model.safetensors, tokenizer.json and training.json "
                    "into --out. docs/training.md has the presets and the files.")
    parser.add_argument("--out", required=True, type=Path, help="the run directory (created if missing; "
                        "an existing one that holds other files needs --force)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="the recipe to start from (default tiny)")
    parser.add_argument("--steps", type=int, help="optimizer steps")
    parser.add_argument("--batch-size", type=int, help="sequences per step")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (at most max_position_embeddings)")
    parser.add_argument("--dropout", type=float, help="residual dropout while training")
    parser.add_argument("--seed", type=int, help="seed of the initial weights, data order and dropout")
    add_optimizer_options(parser)
    parser.add_argument("--corpus-dir", type=Path, help="train on the .py/.txt/.md files under this folder instead")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json (or a folder with one) instead of training")
    parser.add_argument("--init-from", type=Path, help="start from the weights and tokenizer of a model directory "
                        "train-target wrote (its shape must be the preset's), e.g. to fine-tune the shipped target")
    parser.add_argument("--unlikelihood-weight", type=float, help="weight of the sequence-level unlikelihood term: "
                        "each step the model continues prompts greedily and is trained away from the tokens that "
                        "repeat a 4-gram of its own continuation (default 0: off)")
    parser.add_argument("--unlikelihood-batch", type=int, help="prompts the unlikelihood term continues, cut from "
                        "the step's windows (default 8)")
    parser.add_argument("--unlikelihood-every", type=int, help="add the term every this many steps (a divisor of "
                        "--log-every; default 1): fewer, larger generations")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, help="torch.compile each step's "
                        "forward and loss: fused kernels, faster on a GPU after a compile of a minute or so; the "
                        "rounding differs slightly from the eager step's (default: the preset's; a --resume keeps "
                        "the run's choice)")
    add_run_dir_options(parser)
    parser.set_defaults(func=train_target)
