"""JSON as the loaders read it from files they did not write: UTF-8 only, no duplicate keys, bounded nesting.

Python's json module keeps the last of two equal keys, raises RecursionError on deep nesting and ValueError on an
integer of too many digits; here every one of those is a StrictJSONError whose message says what was wrong.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class StrictJSONError(ValueError):
    """The bytes are not one strict JSON document. The message is a predicate ("is not valid JSON (...)", "has
    duplicate key(s) [...]") for the caller to put after what it read, e.g. f"{path} {exc}"."""


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    seen: set[str] = set()
    duplicates = sorted({key for key, _ in pairs if key in seen or seen.add(key)})
    if duplicates:
        raise StrictJSONError(f"has duplicate key(s) {duplicates[:5]} in one object")
    return dict(pairs)


def loads(raw: bytes) -> Any:
    """The JSON document in raw."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError(f"is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError("is nested too deeply to be a config, an index or a header") from None
    except ValueError as exc:  # JSONDecodeError, or an integer with more digits than Python converts
        raise StrictJSONError(f"is not valid JSON ({exc})") from None


def read_file(path: Path, limit: int, what: str) -> Any:
    """The JSON document in the file at path, which may hold at most `limit` bytes (`what` names what the file is, for
    the message: "a config or an index"). Every problem is a StrictJSONError whose message is a predicate, as loads'
    are: "cannot be read (...)", "is larger than N bytes, too large for <what>"."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as exc:
        raise StrictJSONError(f"cannot be read ({exc.strerror or exc})") from None
    if len(raw) > limit:
        raise StrictJSONError(f"is larger than {limit} bytes, too large for {what}")
    return loads(raw)
