"""The report schema (profiling/schema.py) checked in seconds at any size the reader admits.

jsonschema walks every element of every array in Python: on a recording of 303 steps at B = 1024 that is
millions of numbers and minutes. Here the arrays of plain items (integers, numbers, nulls, strings, or arrays
of those: the trees' tokens, parents, scores and visibility rows) are checked by a typed loop first and, when
every element passes, cut to their first element; jsonschema then validates that skeleton, whose verdict is
the full document's. An array whose fast check fails is kept whole, so jsonschema finds the element and reports
its exact place (and accepts what it accepts, such as 1.0 for an integer).
"""
from __future__ import annotations

from collections.abc import Callable

import jsonschema

from profiling.schema import REPORT_SCHEMA

_VALIDATOR = jsonschema.Draft202012Validator(REPORT_SCHEMA)
_TYPES = {"integer": (int,), "number": (int, float), "null": (type(None),), "string": (str,)}
_PLAIN_ARRAY_KEYS = {"type", "items", "description"}  # no minItems, prefixItems, ...: cutting it changes nothing


def _scalar_check(schema: dict) -> Callable[[object], bool] | None:
    """A fast predicate for a plain scalar item schema ({"type": ..., "minimum": ...}), else None."""
    if not isinstance(schema, dict) or "type" not in schema or set(schema) - {"type", "minimum", "description"}:
        return None
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    if any(name not in _TYPES for name in names):
        return None
    allowed = frozenset(t for name in names for t in _TYPES[name])  # type() is exact: a bool is no integer here
    minimum = schema.get("minimum")
    if minimum is None:
        return lambda v: type(v) in allowed
    return lambda v: type(v) in allowed and (v is None or v >= minimum)


def _item_check(schema: dict) -> Callable[[object], bool] | None:
    """A fast predicate for an array's items: a plain scalar, or a plain array of plain scalars."""
    scalar = _scalar_check(schema)
    if scalar is not None:
        return scalar
    if isinstance(schema, dict) and schema.get("type") == "array" and set(schema) <= _PLAIN_ARRAY_KEYS:
        inner = _scalar_check(schema.get("items"))
        if inner is not None:
            return lambda v: type(v) is list and all(map(inner, v))
    return None


def skeleton(value: object, schema: dict) -> object:
    """value with every plain array whose elements all pass the fast check cut to its first element."""
    if type(value) is list and isinstance(schema, dict) and "items" in schema:
        items = schema["items"]
        check = _item_check(items) if set(schema) <= _PLAIN_ARRAY_KEYS else None
        if check is not None:
            return value[:1] if all(map(check, value)) else value
        return [skeleton(v, items) for v in value]
    if type(value) is dict and isinstance(schema, dict):
        if "properties" in schema:
            props = schema["properties"]
            return {k: skeleton(v, props[k]) if k in props else v for k, v in value.items()}
        for branch in (*schema.get("oneOf", ()), *schema.get("anyOf", ())):
            if isinstance(branch, dict) and branch.get("type") == "object":
                return skeleton(value, branch)
    return value


def schema_error(doc: dict) -> jsonschema.ValidationError | None:
    """The best-matching schema error of doc (jsonschema.exceptions.best_match), or None if it matches."""
    return jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(skeleton(doc, REPORT_SCHEMA)))
