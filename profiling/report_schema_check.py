"""The report schema (profiling/schema.py) checked in seconds at any size the reader admits.

jsonschema walks every element of every array in Python, and every keyword of every step object: on a recording
of hundreds of steps at B = 1024 that is minutes. Two parts here:
- first_problem(doc): the schema compiled once into plain functions (first_problem), strict where jsonschema is
  lenient: exact types (1.0 is no integer, True no number) and every number a report can hold (finite, within
  64 bits), anywhere in the document. The arrays of plain items (the trees' tokens, parents, scores, visibility
  rows) are checked by C loops over the whole list. None means the document matches; the reader then runs nothing
  else of this module.
- For a document that does not: skeleton(doc) cuts every plain array whose elements all pass to its first element,
  and schema_error(skeleton) is jsonschema's verdict and place on it, which is the full document's; out_of_range(doc)
  names a non-finite float or a huge integer. The reader words its messages from these.
"""
from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable

import jsonschema

from profiling.schema import REPORT_SCHEMA

_VALIDATOR = jsonschema.Draft202012Validator(REPORT_SCHEMA)
_TYPES = {"integer": (int,), "number": (int, float), "null": (type(None),), "string": (str,)}
_PLAIN_ARRAY_KEYS = {"type", "items", "description"}  # no minItems, prefixItems, ...: cutting it changes nothing
_INT64 = 2**63

ListCheck = Callable[[list], bool]
Problem = tuple[tuple, str]  # (the place: keys and indices from the top, what is wrong there)
Check = Callable[[object], "Problem | None"]


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
        if int in found:
            ints = values if found == {int} else [v for v in values if type(v) is int]
            if not (-_INT64 <= min(ints) and max(ints) < _INT64):
                return False
        if float in found and not all(map(math.isfinite, filter(None, values))):  # skips None and 0.0: both pass
            return False
        return minimum is None or not found & {int, float} or min(v for v in values if v is not None) >= minimum

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


def out_of_range(doc: object) -> tuple[tuple, object] | None:
    """(place, value) of a non-finite float (NaN, Infinity, 1e999) or an integer beyond 64 bits, else None."""
    stack: list[tuple[object, tuple]] = [(doc, ())]
    while stack:
        value, where = stack.pop()
        kind = type(value)
        if (kind is float and not math.isfinite(value)) or (kind is int and not -_INT64 <= value < _INT64):
            return where, value
        if kind is dict:
            stack.extend((v, (*where, k)) for k, v in value.items())
        elif kind is list:
            stack.extend((v, (*where, i)) for i, v in enumerate(value))
    return None


# -- the compiled schema ----------------------------------------------------------------------------------------

_KNOWN = {"$schema", "title", "description", "type", "const", "enum", "minimum", "maximum", "pattern", "properties",
          "required", "additionalProperties", "propertyNames", "minProperties", "items", "prefixItems", "minItems",
          "maxItems", "oneOf"}
_KINDS = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}


def _shown(value: object) -> str:
    """value as a message shows it: a scalar's repr (cut short), a container by its kind and size."""
    if type(value) in (dict, list):
        return f"{'an object' if type(value) is dict else 'an array'} of {len(value)}"
    return f"{value!r:.40}"


def _type_check(names: list[str]) -> Check:
    """Exact types: an integer is an int within 64 bits (not 1.0, not True), a number also a finite float."""
    kinds = frozenset(k for n in names for k in ((int, float) if n == "number" else _TYPES.get(n, (_KINDS.get(n),))))
    wanted = " or ".join(names)

    def check(value: object) -> Problem | None:
        kind = type(value)
        if kind in kinds and (kind is not int or -_INT64 <= value < _INT64) and (kind is not float or
                                                                                 math.isfinite(value)):
            return None
        return (), f"is {_shown(value)}, not {wanted}"

    return check


def _in_range(value: object) -> Problem | None:
    """Anything the schema leaves open (config.model, ...): every number in it one a report can hold."""
    bad = out_of_range(value)
    return None if bad is None else (bad[0], f"is {_shown(bad[1])}, which a report never holds")


def _inside(key: object, problem: Problem | None) -> Problem | None:
    return None if problem is None else ((key, *problem[0]), problem[1])


def _first(checks: list[Check]) -> Check:
    if not checks:
        return _in_range
    if len(checks) == 1:
        return checks[0]
    return lambda value: next((p for p in map(lambda c: c(value), checks) if p is not None), None)


def _types_of(schema: dict) -> set[str]:
    if "type" not in schema:
        raise ValueError("profiling/report_schema_check.py checks oneOf only over branches that name their type")
    names = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
    return {"number" if n == "integer" else n for n in names}


def compile_check(schema: dict) -> Check:
    """schema as one function: value -> the first Problem, or None where value matches. Refuses a keyword it does
    not implement, so a schema change cannot slip past it."""
    unknown = set(schema) - _KNOWN
    if unknown:
        raise ValueError(f"profiling/report_schema_check.py does not implement {sorted(unknown)}: add it there")
    checks: list[Check] = []
    if "type" in schema:
        checks.append(_type_check(schema["type"] if isinstance(schema["type"], list) else [schema["type"]]))
    for options in ([schema["const"]] if "const" in schema else [], schema.get("enum", [])):
        if options:
            checks.append(lambda v, o=tuple(options): None if any(type(v) is type(e) and v == e for e in o)
                          else ((), f"is {_shown(v)}, not one of {list(o)}"))
    if "minimum" in schema or "maximum" in schema:
        low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
        checks.append(lambda v: None if type(v) not in (int, float) or low <= v <= high
                      else ((), f"is {v!r}, outside [{low}, {high}]"))
    if "pattern" in schema:
        pattern = re.compile(schema["pattern"])
        checks.append(lambda v: None if type(v) is not str or pattern.search(v) else ((), f"{_shown(v)} is malformed"))
    if {"properties", "required", "additionalProperties", "propertyNames", "minProperties"} & set(schema):
        checks.append(_object_check(schema))
    if {"items", "prefixItems", "minItems", "maxItems"} & set(schema):
        checks.append(_array_check(schema))
    if "oneOf" in schema:
        checks.append(_one_of(schema["oneOf"]))
    if "type" not in schema and "const" not in schema and "enum" not in schema and "oneOf" not in schema:
        checks.append(_in_range)
    return _first(checks)


def _one_of(branches: list[dict]) -> Check:
    """Branches of disjoint types (null or an object): exactly one matches where any does."""
    types = [_types_of(b) for b in branches]
    if any(a & b for a, b in itertools.combinations(types, 2)):
        raise ValueError("profiling/report_schema_check.py checks oneOf only over branches of disjoint types")
    checks = [compile_check(b) for b in branches]

    def check(value: object) -> Problem | None:
        problems = [c(value) for c in checks]
        return None if None in problems else min(problems, key=lambda p: -len(p[0]))

    return check


def _object_check(schema: dict) -> Check:
    props = {k: compile_check(v) for k, v in schema.get("properties", {}).items()}
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    extra_check = None if extra is False else _in_range if extra is True else compile_check(extra)
    names = compile_check(schema["propertyNames"]) if "propertyNames" in schema else None
    min_props = schema.get("minProperties", 0)

    def check(value: object) -> Problem | None:
        if type(value) is not dict:
            return None
        missing = [k for k in required if k not in value]
        if missing:
            return (), f"lacks the field {missing[0]!r}"
        if len(value) < min_props:
            return (), f"holds {len(value)} fields, fewer than {min_props}"
        for key, item in value.items():
            if names is not None and (problem := names(key)) is not None:
                return (key,), f"the key {problem[1]}"
            own = props.get(key)
            if own is None and extra_check is None:
                return (key,), "is a field a report does not hold"
            problem = (own or extra_check)(item)
            if problem is not None:
                return _inside(key, problem)
        return None

    return check


def _array_check(schema: dict) -> Check:
    prefix = [compile_check(s) for s in schema.get("prefixItems", [])]
    items = compile_check(schema["items"]) if "items" in schema else _in_range
    whole = _items_check(schema["items"]) if "items" in schema and not prefix else None
    low, high = schema.get("minItems", 0), schema.get("maxItems", math.inf)

    def check(value: object) -> Problem | None:
        if type(value) is not list:
            return None
        if not low <= len(value) <= high:
            return (), f"has {len(value)} items, not {low} to {high}"
        if whole is not None and whole(value):
            return None
        for i, item in enumerate(value):
            problem = (prefix[i] if i < len(prefix) else items)(item)
            if problem is not None:
                return _inside(i, problem)
        return None

    return check


_REPORT = compile_check(REPORT_SCHEMA)


def first_problem(doc: object) -> Problem | None:
    """The first place where doc does not match the report schema exactly (exact types, numbers a report holds),
    or None."""
    return _REPORT(doc)
