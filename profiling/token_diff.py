"""The AR vs chain/DDTree token diff as strips of chips, one strip per run: each generated token shows its text piece
where the model has a tokenizer (else its id), its position and id on hover, and a chip that differs from AR's token
at its position is red. report.html and the Compare page both draw it; every piece and id is HTML-escaped."""
from __future__ import annotations

import html
from collections.abc import Callable

from engine.records import MODE_LABELS, RunRecord

DIFF_COLOUR = "#f8c8c8"
SAME_COLOUR = "#eef1f6"
CHIP = ("border-radius:4px;padding:1px 5px;margin:2px 1px;display:inline-block;font-family:monospace;"
        "white-space:pre;background:")

Piece = Callable[[int], str]


def vocabulary_piece(runs: dict[str, RunRecord]) -> Piece | None:
    """token -> display piece from the runs' recorded vocabulary (RunRecord.vocabulary: what a report carries of the
    tokenizer); None when the model had none. An id the vocabulary lacks shows as <id N>."""
    if all(run.vocabulary is None for run in runs.values()):
        return None
    table = {t: entry[0] for run in runs.values() for t, entry in (run.vocabulary or {}).items()}
    return lambda token: table.get(int(token), f"<id {int(token)}>")


def label_of(token: int, piece: Piece | None) -> str:
    """A token as the strips show it: its piece, or its id without a tokenizer."""
    return str(int(token)) if piece is None else piece(token)


def strip_html(tokens: list[int], ar_tokens: list[int] | None, piece: Piece | None) -> str:
    """One run's tokens as chips; with ar_tokens, the chips that differ from AR's at their position are red (a
    position AR does not reach counts as different)."""
    chips = []
    for position, token in enumerate(tokens):
        same = ar_tokens is None or (position < len(ar_tokens) and ar_tokens[position] == token)
        hover = f"position {position} · id {int(token)}"
        if not same and position < len(ar_tokens):
            hover += f" · AR: id {int(ar_tokens[position])} {label_of(ar_tokens[position], piece)!r}"
        chips.append(f'<span title="{html.escape(hover)}" style="{CHIP}{SAME_COLOUR if same else DIFF_COLOUR}">'
                     f"{html.escape(label_of(token, piece))}</span>")
    return "".join(chips)


def diff_html(runs: dict[str, RunRecord], piece: Piece | None) -> str:
    """Every run's generated tokens, AR first, one strip each, a speculative run's differences from AR in red."""
    ar = runs["ar"].tokens
    rows = [f'<div style="margin:4px 0;line-height:1.9"><b style="display:inline-block;min-width:5em">'
            f"{html.escape(MODE_LABELS[mode])}</b>{strip_html(run.tokens, None if mode == 'ar' else ar, piece)}</div>"
            for mode, run in runs.items()]
    return f'<div class="token-diff">{"".join(rows)}</div>'
