"""Text from a file or a link shown in Streamlit's markdown as the literal characters it holds.

st.markdown, st.caption, st.info and friends render markdown: an image `![x](http://host/x.png)` in a recording's
device name, a vocabulary piece or a ?model= link would make the browser fetch an outside URL, and a link, a
heading or emphasis could spoof the page. plain() backslash-escapes exactly the characters that would start such
a construct (CommonMark + GFM, and Streamlit's $math$ and :color[...]), so the string renders as itself, and the
common ones that cannot (an intraword underscore, a bracket that closes no link) stay as they are.
"""
from __future__ import annotations

import re

_INLINE = re.compile("|".join((
    r"[\\*~$]",  # backslash escapes, emphasis, strikethrough, Streamlit's math
    r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])",  # underscore emphasis (an intraword _ is plain text)
    r"\](?=[(\[:])",  # the end of a link or an image: [x](url), ![x](url), [x][ref], [x]: url
    r"(?<=[A-Za-z/])\[(?=[^\]]*\])",  # Streamlit's directives :red[...], :material/icon[...]
    r"<(?=[A-Za-z/!?]|[^>\s]+@)",  # HTML tags, comments, autolinks <http://...>, <a@b.c>
)))
_BLOCK = re.compile(r"(?m)^([ \t]*)([#>+=|-]|\d+[.)])")  # headings, quotes, lists, tables, setext underlines


def plain(text: object) -> str:
    """str(text) with every character that would start markdown, HTML or Streamlit syntax escaped."""
    out = _INLINE.sub(lambda m: "\\" + m.group(0), str(text))
    return _BLOCK.sub(lambda m: m.group(1) + ("\\" + m.group(2) if not m.group(2)[0].isdigit()
                                              else m.group(2)[:-1] + "\\" + m.group(2)[-1]), out)


def code(text: object) -> str:
    """str(text) as a markdown code span, which shows its content literally: fenced with one more backtick than
    its longest run of backticks (padded with spaces where it starts or ends with one), as CommonMark reads it."""
    text = str(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
