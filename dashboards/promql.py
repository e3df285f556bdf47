"""Metric names read from a PromQL expression, for checking queries against what ragmon emits.

A small lexical reader, not a parser: it drops strings, label matchers,
range selectors, grouping clauses and numbers, then keeps each identifier
that is neither a keyword nor followed by `(` (a function or aggregation).
Validity of the expression itself is promtool's job (`promtool check rules`).
"""

from __future__ import annotations

import re

__all__ = ["metric_names"]

_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
    | {"inf", "nan", "atan2"}
)
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?\w+")
_IDENT = re.compile(r"(?<![\w.$])[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """Every metric (or recorded series) name `expr` selects."""
    text = _STRING.sub('""', expr)
    for pattern in (_MATCHERS, _RANGE, _GROUPING, _OFFSET):
        text = pattern.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        word = match.group()
        if word.lower() in _KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue
        names.add(word)
    return names
