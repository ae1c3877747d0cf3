"""The command-line options that verify, run and sweep share, and how each becomes an engine value: one
definition of the model and prompt choice, the drafter, the decode settings and the output checks."""
from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

import torch

from engine.config import AUTO_BUDGET_MAX, BATCH_INVARIANT_BY_DEVICE, ConfigError, DecodeConfig
from engine.decoding.decoder import validate_prompt
from engine.decoding.session import parse_prompt
from engine.drafters import REGISTRY, DrafterSpec
from engine.loaders.checkpoint import Checkpoint
from engine.loaders.dflash_checkpoint import dflash_dir_beside
from engine.loaders.loading import load_model
from engine.loaders.prompt_text import PromptTextError, line_break_note, read_prompt_file
from engine.loaders.shipped import DEFAULT_MODEL
from engine.records import TREES
from engine.settings import Option, options_of


class CliError(ValueError):
    """A command-line input is missing or invalid."""


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "--fixture", dest="model", default=str(DEFAULT_MODEL), metavar="PATH",
                   help="a .kdtr file or a Hugging Face DeepSeek-V3 / Kimi-K2 directory (default: %(default)s)")


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument("--prompt", help="prompt token ids, comma or space separated (default: the checkpoint's "
                                         "prompt)")
    prompt.add_argument("--prompt-text", help="the prompt as text, encoded with the model's tokenizer.json (a shell "
                                              "passes \\n as two characters: use $'...' quoting or --prompt-file)")
    prompt.add_argument("--prompt-file", metavar="PATH", help="the prompt as text, read from a UTF-8 file")
    prompt.add_argument("--prompt-index", type=int, metavar="N", help="the model's own example prompt N (prompts.json, "
                                                                     "0-based: its held-out prompts)")


def add_drafter_args(p: argparse.ArgumentParser) -> None:
    """--drafter and every registered drafter's settings, one flag per setting (a flag two drafters share is one
    option); a flag left out is None, so drafter_spec knows which were given."""
    p.add_argument("--drafter", choices=sorted(REGISTRY),
                   help="default: the drafter whose options are given, else dflash when the model has a DFlash "
                        "directory beside it (<dir>/dflash/ or <model>-dflash/), else oracle. " +
                        " ".join(f"{name}: {entry.summary}" for name, entry in REGISTRY.items()))
    for opt, names in drafter_flags().values():
        _add_option(p, opt, None, prefix=f"{', '.join(names)}: ",
                    default_text=None if opt.default is None else str(opt.default))


def add_decode_args(p: argparse.ArgumentParser, budget: bool = True, max_new_default: int | None = None) -> None:
    """One flag per DecodeConfig field, from its Setting (sweep passes budget=False: it takes --budgets). --max-new
    defaults to max_new_default, else (None) to decode_config's rule; --block-size (None) to decode_config's."""
    for opt in options_of(DecodeConfig):
        if opt.name == "budget" and not budget:
            continue
        if opt.name == "max_new_tokens":
            _add_option(p, opt, max_new_default, default_text=str(max_new_default) if max_new_default is not None
                        else f"the fixture's golden length for its own prompt, else {opt.default}")
        elif opt.name == "block_size":
            _add_option(p, opt, None, default_text=f"the drafter's own: a DFlash checkpoint's block_size, the one it "
                                                   f"was trained at; else {opt.default}")
        elif opt.name == "batch_invariant":
            _add_option(p, opt, None, default_text=", ".join(
                f"{'on' if on else 'off'} with --device {device}" for device, on in BATCH_INVARIANT_BY_DEVICE.items()))
        else:
            _add_option(p, opt, opt.default, default_text=str(opt.default))


def _add_option(p: argparse.ArgumentParser, opt: Option, default: object, prefix: str = "",
                default_text: str | None = None) -> None:
    """The flag of one Setting: its help, what it may hold, and its default."""
    s = opt.setting
    text = f"{prefix}{s.help}" + (f"; {opt.expected}" if opt.kind in (int, float) else "")
    help_text = (text + (f" (default: {default_text})" if default_text is not None else "")).replace("%", "%%")
    flags = (s.flag, *s.aliases)
    if opt.kind is bool and default is None:  # not given: the field's own rule; --no-FLAG turns it off
        p.add_argument(*flags, dest=s.dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
    elif opt.kind is bool:
        p.add_argument(*flags, dest=s.dest, action="store_true", default=default, help=help_text)
    elif opt.name == "budget":
        p.add_argument(*flags, dest=s.dest, type=budget_arg, default=default, metavar=s.metavar, help=help_text)
    else:
        p.add_argument(*flags, dest=s.dest, type=opt.kind, default=default, choices=s.choices or None,
                       metavar=s.metavar, help=help_text)


@dataclasses.dataclass(frozen=True, slots=True)
class AutoBudget:
    """--budget auto[:MAX]: the budget chosen every step, up to maximum."""

    maximum: int


def budget_arg(text: str) -> int | AutoBudget:
    """--budget's value: B, `auto` (up to AUTO_BUDGET_MAX) or `auto:MAX`."""
    head, _, tail = text.partition(":")
    if head == "auto":
        if tail and not tail.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r}: expected auto or auto:MAX with MAX a whole number")
        return AutoBudget(int(tail) if tail else AUTO_BUDGET_MAX)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, auto or auto:MAX") from None


def add_tree_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tree", default="tree", choices=sorted(TREES),
                   help="verify the best-first tree (DDTree), the drafter's top-1 chain (DFlash's own "
                        "verification), or both beside AR (default: tree)")


def load_checkpoint(args: argparse.Namespace) -> Checkpoint:
    if not pathlib.Path(args.model).exists():
        raise CliError(f"--model {args.model}: no such file or directory; pass a .kdtr file or a Hugging Face "
                       "model directory")
    return load_model(args.model)


def pick_prompt(args: argparse.Namespace, ckpt: Checkpoint) -> list[int]:
    if args.prompt is not None:
        return parse_prompt(args.prompt, ckpt.config.vocab_size)
    text, flag = prompt_text(args, ckpt)
    if text is not None:
        if ckpt.tokenizer is None:
            raise CliError(f"{flag}: {ckpt.source} has no tokenizer.json; pass token ids with --prompt")
        if not text:
            raise CliError(f"{flag}: the prompt text is empty: give some text, or token ids with --prompt")
        note = line_break_note(text)
        if note:
            print(f"warning: {note}", file=sys.stderr)
        return validate_prompt(ckpt.tokenizer.encode(text), ckpt.config.vocab_size)
    if ckpt.prompt is None:
        raise CliError(f"{ckpt.source} has no prompt of its own: pass --prompt with token ids, e.g. --prompt 1,2,3")
    return ckpt.prompt.tolist()


def prompt_text(args: argparse.Namespace, ckpt: Checkpoint) -> tuple[str | None, str]:
    """The text prompt the options give (None: none) and the flag that gave it."""
    if getattr(args, "prompt_file", None) is not None:
        try:
            return read_prompt_file(args.prompt_file), "--prompt-file"
        except PromptTextError as exc:
            raise CliError(f"--prompt-file {exc}") from None
    if getattr(args, "prompt_index", None) is not None:
        texts = ckpt.prompt_texts
        if not 0 <= args.prompt_index < len(texts):
            raise CliError(f"--prompt-index {args.prompt_index}: {ckpt.source} has {len(texts)} example prompts "
                           f"(prompts.json){f'; give 0..{len(texts) - 1}' if texts else ''}")
        return texts[args.prompt_index], "--prompt-index"
    return args.prompt_text, "--prompt-text"


def decode_config(args: argparse.Namespace, ckpt: Checkpoint, prompt: list[int],
                  drafter: DrafterSpec | None = None) -> DecodeConfig:
    """--max-new defaults to the fixture's golden length for its own prompt, else to DecodeConfig's; --block-size to
    the drafter's own block size (DrafterSpec.default_block_size: a DFlash checkpoint's), else (no drafter given) to
    DecodeConfig's. A value out of its field's range is a CliError naming the flag."""
    values = {}
    for opt in (o for o in options_of(DecodeConfig) if hasattr(args, o.setting.dest)):  # sweep has no --budget
        value = getattr(args, opt.setting.dest)
        if opt.name == "max_new_tokens" and value is None:
            own = ckpt.golden_tokens is not None and ckpt.prompt is not None and prompt == ckpt.prompt.tolist()
            value = len(ckpt.golden_tokens) if own else opt.default
        if opt.name == "block_size" and value is None:
            value = opt.default if drafter is None else drafter.default_block_size()
        if isinstance(value, AutoBudget):  # --budget auto[:MAX]
            values["auto_budget"], value = True, value.maximum
        elif opt.name == "auto_budget" and values.get("auto_budget"):
            continue
        values[opt.name] = value if value is None and opt.default is None else _checked(opt, value)
    if values["device"] == "cuda" and not torch.cuda.is_available():
        raise CliError("--device cuda: torch sees no CUDA GPU here; use --device cpu")
    return DecodeConfig(**values)


def _checked(opt: Option, value: object) -> object:
    try:
        return opt.check(value)
    except ConfigError as exc:
        raise CliError(f"{opt.setting.flag}: {exc}") from None


def drafter_flags() -> dict[str, tuple[Option, list[str]]]:
    """argparse dest -> (the Setting's option, the drafters taking it), over every registered drafter."""
    flags: dict[str, tuple[Option, list[str]]] = {}
    for name, entry in REGISTRY.items():
        for opt in options_of(entry.settings):
            flags.setdefault(opt.setting.dest, (opt, []))[1].append(name)
    return flags


def drafter_spec(args: argparse.Namespace) -> DrafterSpec:
    """The DrafterSpec the options describe; options of another drafter are refused. Without --drafter: the drafter
    whose options are given (the first in the registry that takes one), else the DFlash drafter when the model has a
    DFlash directory beside it, else the oracle."""
    given = {dest: value for dest in drafter_flags() if (value := getattr(args, dest, None)) is not None}
    beside = dflash_dir_beside(args.model)
    name = args.drafter or next((n for n, entry in REGISTRY.items()
                                 if any(opt.setting.dest in given for opt in options_of(entry.settings))),
                                "dflash" if beside else "oracle")
    options = {opt.setting.dest: opt for opt in options_of(REGISTRY[name].settings)}
    stray = [drafter_flags()[dest][0].setting.flag for dest in given if dest not in options]
    if stray:
        raise CliError(f"--drafter {name} does not take {', '.join(stray)}")
    values = {options[dest].name: _checked(options[dest], value) for dest, value in given.items()}
    if name == "dflash" and "model" not in values and beside:
        values["model"] = str(beside)  # the target's own drafter
    try:
        return DrafterSpec(name, **values)
    except ConfigError as exc:
        raise CliError(f"--drafter {name}: {exc}") from None


def check_output_file(path: pathlib.Path, force: bool, flag: str) -> None:
    """path can be written: not a directory, an existing file only with --force, its directory writable."""
    if path.is_dir():
        raise CliError(f"{flag} {path} is a directory: give a file path")
    if path.exists() and not force:
        raise CliError(f"{flag} {path} exists; pass --force to overwrite it")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: directory {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: directory {parent} is not writable")
