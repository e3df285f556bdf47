"""The trace store: SQLite (embedded) or PostgreSQL (distributed), through SQLAlchemy.

Owns: `Store` (`trace_store.py`: the writes; its reads in `trace_reads.py`, its error translation,
transactions, schema and health in `store_base.py`) and its pipeline sink `StoreSink`
(`store_sink.py`), the engines and their transactions (`engine.py`), trace listing filters and
cursors (`trace_query.py`), keys in IN lists (`keys.py`), every table of the database (`tables.py`,
shared by the feature stores) and the mapping between records and rows (`rows.py`), and the plain
executemany insert (`row_insert.py`).
Feature stores (judgments, reviews, drift, golden sets) live with their feature and build on these
tables; SQLAlchemy errors are translated here and in those stores.

May import: `consumer`, `model`, `errors`.
"""
