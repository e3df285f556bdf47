"""UtcDateTime's one-step SQLite bind processor writes what SQLAlchemy's two layers write
(`process_bind_param`, then the SQLite dialect's DATETIME text), and reads back as the same instant."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import sqlite

from service.store.tables import UtcDateTime

DIALECT = sqlite.dialect()


def layered(value: datetime | None) -> str | None:
    """What SQLAlchemy writes without the one-step processor."""
    naive = UtcDateTime().process_bind_param(value, DIALECT)
    process = sa.DateTime().dialect_impl(DIALECT).bind_processor(DIALECT)
    assert process is not None
    text: str | None = process(naive)
    return text


def values() -> list[datetime]:
    fixed = [
        datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC),  # microsecond 0: isoformat would drop it unasked
        datetime(2026, 3, 1, 12, 0, 0, 1, tzinfo=UTC),
        datetime(2026, 3, 1, 9, 30),  # naive: taken as UTC
        datetime(2026, 3, 1, 14, 0, 0, 250, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 3, 1, 1, 0, tzinfo=timezone(timedelta(hours=-8))),  # another UTC day
        datetime(2026, 3, 1, tzinfo=timezone(timedelta(0))),  # UTC, but not the UTC singleton
        datetime(1, 1, 1, 0, 0, tzinfo=UTC),
        datetime(999, 12, 31, 23, 59, 59, 999_999),  # a three-digit year, zero-padded by both
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
    ]
    rng = random.Random(23)
    drawn = [
        datetime(2000, 1, 1, tzinfo=UTC)
        + timedelta(seconds=rng.uniform(0, 40 * 365 * 86400), microseconds=rng.randrange(1_000_000))
        for _ in range(200)
    ]
    zones = [timezone(timedelta(minutes=rng.randrange(-720, 841))) for _ in range(20)]
    return fixed + drawn + [d.astimezone(rng.choice(zones)) for d in drawn[:100]]


def test_the_one_step_processor_writes_what_the_two_layers_write() -> None:
    process = UtcDateTime().bind_processor(DIALECT)
    assert process is not None
    for value in values():
        assert process(value) == layered(value), value
    assert process(None) is None


def test_a_value_written_again_or_between_others_writes_the_same_text() -> None:
    """The processor remembers the last value's text: repeats, alternations, an equal instant in
    another zone and a copy of the same instant all write what the two layers write."""
    process = UtcDateTime().bind_processor(DIALECT)
    assert process is not None
    drawn = values()
    rng = random.Random(5)
    sequence = [drawn[i] for i in (0, 0, 0, 1, 0, 1, 1)]
    sequence += [rng.choice(drawn[:12]) for _ in range(300)]
    instant = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    sequence += [instant, instant.astimezone(timezone(timedelta(hours=3))), instant.replace(), instant]
    for value in sequence:
        assert process(value) == layered(value), value
        assert process(value) == layered(value), value
    assert process(None) is None
    assert process(sequence[-1]) == layered(sequence[-1])


def test_other_dialects_keep_the_layered_processor() -> None:
    from sqlalchemy.dialects import postgresql

    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    process = UtcDateTime().bind_processor(dialect)
    value = datetime(2026, 3, 1, 9, 30, tzinfo=timezone(timedelta(hours=2)))
    written = value if process is None else process(value)
    assert written == value and written.tzinfo == UTC  # the same instant, in UTC


@pytest.mark.parametrize("value", values()[:9])
def test_a_written_time_reads_back_as_the_same_instant(tmp_path: Path, value: datetime) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'times.db'}")
    table = sa.Table("times", sa.MetaData(), sa.Column("at", UtcDateTime, nullable=False))
    table.create(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"at": value}])
        read = conn.execute(sa.select(table.c.at)).scalar_one()
    expected = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    assert read == expected and read.tzinfo == UTC
