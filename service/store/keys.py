"""Keys in statements: a batch's (tenant, key) pairs as IN lists the databases answer by index.

Both build `key IN (...)` per tenant (or per tenant and judge version): SQLite
answers a row-value IN list of whole keys with a full table scan.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import sqlalchemy as sa

__all__ = ["Group", "keys_by_group", "keys_in"]

# How many keys one expanding IN list carries: far below SQLite's 32,766 host parameters and
# PostgreSQL's 65,535.
_KEYS_PER_STATEMENT = 500


Group = TypeVar("Group", str, tuple[str, str])


def keys_by_group(keys: Iterable[tuple[Group, str]]) -> Iterator[tuple[Group, list[str]]]:
    """(group, up to `_KEYS_PER_STATEMENT` sorted keys) for statements that take one group (a
    tenant, or a tenant and judge version) and an expanding list of keys: such a statement is
    compiled once, where a fresh `keys_in` expression is built and compiled for every call, and
    SQLite answers a row-value IN of whole keys with a scan."""
    grouped: dict[Group, list[str]] = {}
    for group, key in keys:
        grouped.setdefault(group, []).append(key)
    for group, members in sorted(grouped.items()):
        members.sort()
        for start in range(0, len(members), _KEYS_PER_STATEMENT):
            yield group, members[start : start + _KEYS_PER_STATEMENT]


def keys_in(
    tenant: sa.Column[str], key: sa.Column[str], keys: Iterable[tuple[str, str]]
) -> sa.ColumnElement[bool]:
    """`(tenant, key) IN keys`, spelled as per-tenant `key IN (...)`.

    SQLite answers a row-value IN list with a full table scan; this form
    uses the primary key (or index) on both databases.
    """
    by_tenant: dict[str, list[str]] = {}
    for t, k in keys:
        by_tenant.setdefault(t, []).append(k)
    return sa.or_(*(sa.and_(tenant == t, key.in_(sorted(ks))) for t, ks in sorted(by_tenant.items())))
