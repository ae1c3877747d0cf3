"""The one place a command's arguments become a DecodeRequest: the checkpoint, the prompt, the decode settings, the
drafter and the speculative modes (cli/options.py reads each)."""
from __future__ import annotations

import argparse

from cli import options as opts
from engine.decoding.request import DecodeRequest
from engine.drafters import DrafterSpec
from engine.records import TREES


def request_from_args(args: argparse.Namespace, drafter: DrafterSpec | None = None) -> DecodeRequest:
    """The request the options describe; `drafter` in place of the drafter options (a command that checks one
    drafter takes none). A command without --tree decodes DDTree beside AR."""
    ckpt = opts.load_checkpoint(args)
    prompt = opts.pick_prompt(args, ckpt)
    drafter = drafter or opts.drafter_spec(args)
    config = opts.decode_config(args, ckpt, prompt, drafter)  # --block-size left out: the drafter's own
    return DecodeRequest(ckpt, tuple(prompt), config, drafter, TREES[getattr(args, "tree", "tree")])
