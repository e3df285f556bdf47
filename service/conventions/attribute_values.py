"""Typed values read out of span attributes: text, numbers, counts, flags, JSON, string lists, vectors.

Attribute values come from outside, so no reader raises for a value of the
wrong shape: it returns None (or an empty result) and the caller falls back
to the next convention. JSON payloads are parsed only when a reader needs the
value and the string looks like JSON (`{` or `[` first); a payload that is not
JSON but a Python literal (some instrumentations `str()` a dict) is read with
`ast.literal_eval` up to 4 KiB. A flattened list's index (`prefix.N.rest`) is read
up to `MAX_ATTRIBUTE_INDEX`; an item under a larger one is skipped (the decoder
drops such span attributes, `service/ingest/otlp.py`; this covers keys inside
parsed JSON payloads, where `int()` of 5,000 digits would raise).
"""

from __future__ import annotations

import ast
import json
from math import isfinite
from typing import Annotated, Any

from pydantic import Field, JsonValue, TypeAdapter, ValidationError

from service.conventions.spans import Attributes, AttrValue

__all__ = [
    "MAX_ATTRIBUTE_INDEX",
    "filter_text",
    "first_count",
    "first_text",
    "flag",
    "indexed",
    "json_object",
    "json_safe",
    "number",
    "parse_json",
    "parse_json_string",
    "string_list",
    "vector",
]

MAX_ATTRIBUTE_INDEX = 65_535
"""The largest list index read from a flattened key (`retrieval.documents.<i>.document.id`)."""
_MAX_INDEX_DIGITS = len(str(MAX_ATTRIBUTE_INDEX))
_LITERAL_LIMIT = 4096
_JSON = json.JSONDecoder()
_TRUE_STRINGS = frozenset({"true", "1", "yes"})
_FINITE_FLOATS = TypeAdapter(tuple[Annotated[float, Field(strict=True, allow_inf_nan=False)], ...])


def first_text(attributes: Attributes, *keys: str) -> str | None:
    """The first non-blank string (or integer, as a string) under `keys`."""
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            if value.strip():
                return value
        elif isinstance(value, int) and not isinstance(value, bool):
            return str(value)
    return None


def number(value: AttrValue) -> float | None:
    """A finite float from a number or a numeric string; None for anything else (booleans included, and
    integers too large for a float, which parsed JSON payloads can hold)."""
    try:
        if type(value) is float or type(value) is int:  # the usual cases, by exact type
            return float(value) if isfinite(value) else None
        if value is None or isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return float(value) if isfinite(value) else None
    except OverflowError:  # an int over ~1.8e308
        return None
    if isinstance(value, str):
        try:
            parsed = float(value)
        except ValueError:
            return None
        return parsed if isfinite(parsed) else None
    return None


def first_count(attributes: Attributes, *keys: str) -> int | None:
    """The first non-negative whole number under `keys`."""
    for key in keys:
        value = attributes.get(key)
        if value is None:
            continue
        found = number(value)
        if found is not None and found >= 0 and found.is_integer():
            return int(found)
    return None


def parse_json(value: AttrValue) -> Any:
    """A JSON (or Python-literal) string that holds an object or array, parsed; else the value itself."""
    if not isinstance(value, str):
        return value
    stripped = value.strip()
    if not stripped or stripped[0] not in "{[":
        return value
    try:
        return parse_json_string(stripped)
    except RecursionError:
        return value  # nested deeper than the parser goes: keep the text, never fail the trace
    except ValueError:
        return _literal(stripped, value)


def parse_json_string(stripped: str) -> Any:
    """`json.loads` of a string without surrounding whitespace, minus the wrappers' cost."""
    parsed, end = _JSON.raw_decode(stripped)
    if end != len(stripped):
        raise ValueError("extra data after the JSON value")
    return parsed


def _literal(stripped: str, value: str) -> Any:
    """A Python literal that is not JSON (`{'a': 1}`), parsed when short; else `value` unchanged."""
    if len(stripped) <= _LITERAL_LIMIT:
        try:
            return ast.literal_eval(stripped)
        except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
            pass
    return value


def json_safe(value: Any) -> JsonValue:
    """`value` with what JSON cannot hold (tuples, sets, bytes, non-text keys) made JSON values or text."""
    return json.loads(json.dumps(_string_keys(value), default=str))  # type: ignore[no-any-return]


def _string_keys(value: Any) -> Any:
    # json.dumps refuses dict keys that are tuples (a Python literal can have them); make them text
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _string_keys(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_string_keys(v) for v in value]
    return value


def json_object(value: AttrValue) -> dict[str, JsonValue] | None:
    """A non-empty JSON object from a JSON/literal string or a kvlist; None otherwise."""
    if isinstance(value, str):
        stripped = value.strip()
        if stripped[:1] == "{":
            try:
                parsed = parse_json_string(stripped)
            except RecursionError:
                return None
            except ValueError:
                parsed = _literal(stripped, value)
            else:
                # A JSON parser only makes JSON values, so there is nothing to make safe.
                return parsed if isinstance(parsed, dict) and parsed else None
        else:
            return None
    else:
        parsed = value
    if isinstance(parsed, dict) and parsed:
        safe = json_safe(parsed)
        return safe if isinstance(safe, dict) else None
    return None


def string_list(value: AttrValue) -> tuple[str, ...]:
    """Strings from a list (or a JSON list string, or a single string); integers become strings."""
    parsed = parse_json(value)
    if isinstance(parsed, str):
        return (parsed,) if parsed else ()
    if isinstance(parsed, list):
        return tuple(
            str(item) for item in parsed if isinstance(item, str | int) and not isinstance(item, bool)
        )
    return ()


def filter_text(value: AttrValue) -> str | None:
    """A filter predicate as text: a string as sent, a kvlist or list as JSON with sorted keys."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, dict | list):
        return json.dumps(json_safe(value), sort_keys=True)
    return None


def flag(value: Any) -> bool:
    """True for true, a non-zero number, or "true"/"1"/"yes" in any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value != 0
    return isinstance(value, str) and value.strip().lower() in _TRUE_STRINGS


def vector(value: AttrValue) -> tuple[float, ...] | None:
    """A non-empty list of finite numbers as exact floats; None if any item is not one."""
    if not isinstance(value, list) or not value:
        return None
    # Usually all floats (the decoder makes them so): pydantic's strict, finite float check runs
    # over them in one native call, and gives what `number` gives for each item when it passes.
    # Anything it refuses (booleans, numeric strings, NaN, ...) takes the exact path below.
    try:
        return _FINITE_FLOATS.validate_python(value)
    except ValidationError:
        pass
    numbers = [number(v) for v in value]
    return tuple(n for n in numbers if n is not None) if None not in numbers else None


def indexed(attributes: Attributes | dict[str, Any], prefix: str) -> list[dict[str, AttrValue]]:
    """The objects of a flattened list (`prefix.N.rest`), in index order; a structured list also works.
    Items whose index is over `MAX_ATTRIBUTE_INDEX` are left out."""
    structured = attributes.get(prefix)
    if isinstance(structured, list):
        return [item for item in structured if isinstance(item, dict)]
    dotted = prefix + "."
    start = len(dotted)
    items: dict[int, dict[str, AttrValue]] = {}
    for key, value in attributes.items():
        if key.startswith(dotted):
            index, _, rest = key[start:].partition(".")
            if index.isdecimal() and rest and len(index) <= _MAX_INDEX_DIGITS:
                position = int(index)
                if position <= MAX_ATTRIBUTE_INDEX:
                    items.setdefault(position, {})[rest] = value
    return [items[i] for i in sorted(items)]
