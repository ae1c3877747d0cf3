"""The Compare page's token table with pieces (ids beside them), and the tokens at a first divergence. Pieces come
from files (a tokenizer, a recording's vocabulary): they reach the page escaped through st.html
(profiling.token_diff, ui.views.text_html), as dataframe cells (plain text), or as code spans in markdown."""
from __future__ import annotations

from collections.abc import Callable

from ui.safe_text import code

Piece = Callable[[int], str]


def text_rows(rows: list[dict], labels: list[str], piece: Piece | None) -> list[dict]:
    """ui.views.compare_rows with each run's column (labels: "AR", "DDTree", ...) showing the token's piece and its
    id in a column of its own ("AR id", ...) after "equal"; unchanged without a tokenizer."""
    if piece is None:
        return rows
    out = []
    for row in rows:
        shown = {}
        for key, value in row.items():
            shown[key] = piece(value) if key in labels and value is not None else value
            if key == "equal":
                shown |= {f"{label} id": row[label] for label in labels}
        out.append(shown)
    return out


def divergence_tokens(div: dict, label: str, piece: Piece) -> str:
    """Markdown naming the two tokens at a first divergence, their pieces as code spans."""
    def token(t: int | None) -> str:
        return "none (the run ended)" if t is None else f"{t} {code(piece(t))}"
    return f"AR's token there: {token(div['ar_token'])}; {label}'s: {token(div['token'])}."
