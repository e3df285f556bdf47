"""The review tables: items in a queue (one per tenant, queue and trace), their reasons, the reviews
and the reviewers' marks on the judge's claims (`ReviewStore`, `store.py`, works on them; the
blind labels read them with the judge queue: `blind_labels.py`)."""

from __future__ import annotations

import sqlalchemy as sa

from service.store.tables import UtcDateTime

__all__ = ["metadata", "review_claim_labels", "review_items", "review_reasons", "reviews"]

metadata = sa.MetaData()

review_items = sa.Table(
    "review_items",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("queue", sa.String(16), nullable=False),
    sa.Column("trace_id", sa.String(32), nullable=False),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("severity", sa.Integer, nullable=False),
    sa.Column("diagnosis", sa.String(32)),
    sa.Column("judge_version", sa.String(64)),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("reviewer", sa.String(128)),
    sa.Column("lease_until", UtcDateTime),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("done_at", UtcDateTime),
    sa.UniqueConstraint("tenant", "queue", "trace_id", name="review_items_key"),
    sa.CheckConstraint("state IN ('open', 'claimed', 'done')", name="review_items_state"),
    sa.Index("review_items_by_priority", "state", "severity", "created_at"),
)

review_reasons = sa.Table(
    "review_reasons",
    metadata,
    sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("reason", sa.String(32), primary_key=True),
    sa.Column("detail", sa.Text),
    sa.Column("created_at", UtcDateTime, nullable=False),
)

reviews = sa.Table(
    "reviews",
    metadata,
    sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("queue", sa.String(16), nullable=False),
    sa.Column("trace_id", sa.String(32), nullable=False),
    sa.Column("reviewer", sa.String(128), nullable=False),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("failure_mode", sa.String(32)),
    sa.Column("expected_chunk_ids", sa.Text, nullable=False),  # JSON list
    sa.Column("reference_answer", sa.Text),
    sa.Column("category", sa.Text),
    sa.Column("expected_behaviour", sa.String(16), nullable=False),
    sa.Column("note", sa.Text),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Index("reviews_by_time", "created_at"),
    sa.Index("reviews_by_trace", "tenant", "trace_id"),
)

# The reviewer's mark on each of the judge's claims, apart from `reviews` so that a database made before
# claim marks existed gets the table from `create_schema` (which creates missing tables, never columns).
review_claim_labels = sa.Table(
    "review_claim_labels",
    metadata,
    sa.Column("item_id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("supported", sa.Text, nullable=False),  # JSON list of booleans, the judge's claim order
)
