"""The report schema (profiling/schema.py) checked in seconds at any size the reader admits.

jsonschema walks every element of every array in Python: on a recording of 303 steps at B = 1024 that is
millions of numbers and minutes. Here the arrays of plain items (integers, numbers, nulls, strings, or arrays
of those: the trees' tokens, parents, scores and visibility rows) are checked by a typed loop first and, when
every element passes, cut to their first element; jsonschema then validates that skeleton, whose verdict is
the full document's. The typed check passes only 64-bit integers and finite floats, so the reader's walk for
out-of-range numbers runs on the skeleton too. An array whose fast check fails is kept whole, so the walks find
the element and report its exact place (and jsonschema accepts what it accepts, such as 1.0 for an integer).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import jsonschema

from profiling.schema import REPORT_SCHEMA

_VALIDATOR = jsonschema.Draft202012Validator(REPORT_SCHEMA)
_TYPES = {"integer": (int,), "number": (int, float), "null": (type(None),), "string": (str,)}
_PLAIN_ARRAY_KEYS = {"type", "items", "description"}  # no minItems, prefixItems, ...: cutting it changes nothing
_INT64 = 2**63

ListCheck = Callable[[list], bool]


def _scalars_check(schema: object) -> ListCheck | None:
    """A check of a whole list against a plain scalar item schema ({"type": ..., "minimum": ...}), else None. It
    passes only values the reader takes as they are: exact types (a bool is no integer here), 64-bit integers,
    finite floats; anything else fails it, and the list is left for the full walks."""
    if not isinstance(schema, dict) or "type" not in schema or set(schema) - {"type", "minimum", "description"}:
        return None
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if any(name not in _TYPES for name in names):
        return None
    allowed = frozenset(t for name in names for t in _TYPES[name])
    minimum = schema.get("minimum")

    def check(values: list) -> bool:
        found = set(map(type, values))  # C loops throughout: seconds for millions of values
        if not found <= allowed:
            return False
        numbers = [v for v in values if v is not None] if type(None) in found else values
        if not numbers or not found & {int, float}:
            return True
        ints = numbers if float not in found else [v for v in numbers if type(v) is int]
        if ints and not (-_INT64 <= min(ints) and max(ints) < _INT64):
            return False
        if float in found and not all(map(math.isfinite, numbers)):
            return False
        return minimum is None or min(numbers) >= minimum

    return check


def _items_check(schema: object) -> ListCheck | None:
    """A check of a whole list of plain scalars, or of plain arrays of plain scalars (the visibility rows)."""
    scalars = _scalars_check(schema)
    if scalars is not None:
        return scalars
    if isinstance(schema, dict) and schema.get("type") == "array" and set(schema) <= _PLAIN_ARRAY_KEYS:
        inner = _scalars_check(schema.get("items"))
        if inner is not None:
            return lambda rows: set(map(type, rows)) <= {list} and inner(list(itertools.chain.from_iterable(rows)))
    return None


def skeleton(value: object, schema: dict = REPORT_SCHEMA) -> object:
    """value with every plain array whose elements all pass the fast check cut to its first element."""
    if type(value) is list and isinstance(schema, dict) and "items" in schema:
        items = schema["items"]
        check = _items_check(items) if set(schema) <= _PLAIN_ARRAY_KEYS else None
        if check is not None:
            return value[:1] if check(value) else value
        return [skeleton(v, items) for v in value]
    if type(value) is dict and isinstance(schema, dict):
        if "properties" in schema:
            props = schema["properties"]
            return {k: skeleton(v, props[k]) if k in props else v for k, v in value.items()}
        for branch in (*schema.get("oneOf", ()), *schema.get("anyOf", ())):
            if isinstance(branch, dict) and branch.get("type") == "object":
                return skeleton(value, branch)
    return value


def schema_error(cut: object) -> jsonschema.ValidationError | None:
    """The best-matching schema error (jsonschema.exceptions.best_match) of a skeleton, or None if it matches:
    the full document's verdict, at the same place."""
    return jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(cut))
