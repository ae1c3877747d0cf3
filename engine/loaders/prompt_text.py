"""What to tell a person about a text prompt before it is encoded: where it is read from, and a prompt that ends at a
bare line break.

The shipped tokenizer (byte-level BPE trained on Python) merges a line break with the next line's indentation, so
"\n    " is one token and a bare "\n" at the very end of a prompt is a token the model rarely saw before code: it
then tends to continue with column-0 junk. We warn and say the fix rather than heal the token (backing the prompt
off to its last whole-token boundary and constraining the first pick): healing changes which token the first step
may pick, in AR and DDTree alike, and the warning keeps every decode a plain continuation of the text as typed.
"""
from __future__ import annotations

import pathlib

MAX_PROMPT_FILE_BYTES = 1 << 20


class PromptTextError(ValueError):
    """A prompt file that cannot be read as text."""


def read_prompt_file(path: str | pathlib.Path) -> str:
    """A prompt file's text: a regular file of at most MAX_PROMPT_FILE_BYTES, UTF-8."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise PromptTextError(f"{path}: no such file (or not a regular file); give a text file with the prompt")
    size = path.stat().st_size
    if size > MAX_PROMPT_FILE_BYTES:
        raise PromptTextError(f"{path}: {size} bytes, more than a prompt file may hold ({MAX_PROMPT_FILE_BYTES}); "
                              "give a shorter prompt")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PromptTextError(f"{path}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def line_break_note(text: str) -> str | None:
    """A warning for a prompt that ends at a bare line break (None for any other prompt)."""
    if not text.endswith("\n"):
        return None
    return ("the prompt ends at a bare line break: this tokenizer merges a line break with the next line's "
            "indentation, so a final '\\n' is a token the model rarely saw before code and it may continue with junk; "
            "end the prompt before the line break, or include the next line's indentation (e.g. ':\\n    ')")
