"""The drift tables: their own `MetaData`, created on the trace store's engine by `DriftStore.create_schema`.

What each table holds, and the bounds on it: `store.py`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from service.store.tables import UtcDateTime

metadata = sa.MetaData()


def _key_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("tenant", sa.Text, nullable=False),
        sa.Column("app", sa.Text, nullable=False),
        sa.Column("model_key", sa.Text, nullable=False),
    ]


def _observation_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("trace_time", UtcDateTime, nullable=False),
        sa.Column("release", sa.Text),
        sa.Column("intent", sa.Text),
        sa.Column("query", sa.Text),
        sa.Column("vector", sa.LargeBinary),
        sa.Column("top1", sa.Float),
        sa.Column("topk", sa.Float),
        sa.Column("empty", sa.Boolean),
        sa.Column("hit", sa.Text),
    ]


drift_buckets = sa.Table(
    "drift_buckets",
    metadata,
    *_key_columns(),
    sa.Column("bucket_start", UtcDateTime, nullable=False),
    sa.Column("seen", sa.BigInteger, nullable=False),
    sa.Column("kept", sa.Integer, nullable=False),
    sa.PrimaryKeyConstraint("tenant", "app", "model_key", "bucket_start"),
    sa.Index("drift_buckets_by_time", "bucket_start"),
)

drift_observations = sa.Table(
    "drift_observations",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    *_key_columns(),
    sa.Column("bucket_start", UtcDateTime, nullable=False),
    *_observation_columns(),
    sa.Index("drift_observations_by_bucket", "tenant", "app", "model_key", "bucket_start"),
)

drift_references = sa.Table(
    "drift_references",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    *_key_columns(),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("label", sa.Text, nullable=False),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("range_start", UtcDateTime),
    sa.Column("range_end", UtcDateTime),
    sa.Column("release", sa.Text),
    sa.Column("n", sa.Integer, nullable=False),
    sa.Column("traces_represented", sa.BigInteger, nullable=False),
    sa.Column("excluded_buckets", sa.Integer, nullable=False),
    sa.Column("content_hash", sa.String(64), nullable=False),
    sa.UniqueConstraint("tenant", "app", "model_key", "version", name="drift_references_version"),
)

drift_reference_rows = sa.Table(
    "drift_reference_rows",
    metadata,
    sa.Column("reference_id", sa.Integer, sa.ForeignKey("drift_references.id"), primary_key=True),
    sa.Column("position", sa.Integer, primary_key=True, autoincrement=False),
    *_observation_columns(),
)

drift_reference_embedders = sa.Table(
    "drift_reference_embedders",
    metadata,
    sa.Column("reference_id", sa.Integer, sa.ForeignKey("drift_references.id"), primary_key=True),
    sa.Column("embedder_key", sa.Text, nullable=False),
    sa.Column("state", sa.LargeBinary, nullable=False),
)

drift_runs = sa.Table(
    "drift_runs",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("tenant", sa.Text, nullable=False),
    sa.Column("app", sa.Text, nullable=False),
    sa.Column("model_key", sa.Text),
    sa.Column("intent", sa.Text),
    sa.Column("detector", sa.String(64), nullable=False),
    sa.Column("version", sa.String(16), nullable=False),
    sa.Column("reference_id", sa.Text),
    sa.Column("window_start", UtcDateTime),
    sa.Column("window_end", UtcDateTime),
    sa.Column("n_reference", sa.Integer, nullable=False),
    sa.Column("n_window", sa.Integer, nullable=False),
    sa.Column("statistic", sa.Float),
    sa.Column("p_value", sa.Float),
    sa.Column("alpha", sa.Float),
    sa.Column("drifted", sa.Boolean, nullable=False),
    sa.Column("alarm", sa.Boolean, nullable=False),
    sa.Column("outcome", sa.String(24), nullable=False),
    sa.Column("trigger", sa.String(16), nullable=False),
    sa.Column("details", sa.Text, nullable=False),
    sa.Column("explanation", sa.Text),
    sa.Column("ran_at", UtcDateTime, nullable=False),
    sa.Index("drift_runs_by_app", "tenant", "app", "detector", "ran_at"),
    sa.Index("drift_runs_by_time", "ran_at"),
)

drift_monitor_state = sa.Table(
    "drift_monitor_state",
    metadata,
    sa.Column("tenant", sa.Text, primary_key=True),
    sa.Column("app", sa.Text, primary_key=True),
    sa.Column("intent", sa.Text, primary_key=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("updated_at", UtcDateTime, nullable=False),
)
