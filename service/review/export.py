"""Reviewed items as golden-set JSONL (`service/probes/golden.py`), and the `ragmon review export` command.

One row per reviewed trace (the latest review when a trace was reviewed in
both queues): `question_id` is the trace id, `question` the user's query,
`gold_chunks` the chunk ids the reviewer said should have been retrieved
(eligible for the trace's tenant only), `expected_facts` holds the reference
answer when one was given, plus `expected_behaviour` and `category`. Every row
is validated as a `GoldenQuestion`. With provenance (the default) each row
also carries `reference_answer`, `source_trace_id` and `reviewer`; `--golden`
leaves them out, giving rows today's golden-set reader loads as they are.
Traces whose query is missing or blank cannot be golden questions and are
skipped (counted in the command's summary).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the stores (SQLAlchemy) load when the export runs, not when `ragmon --help` builds the flags
    from service.review.records import ReviewRecord
    from service.review.store import ReviewStore
    from service.store.trace_store import Store

__all__ = ["add_arguments", "golden_rows", "main"]

PROVENANCE = ("reference_answer", "source_trace_id", "reviewer")


def _latest(records: Iterable[ReviewRecord]) -> list[ReviewRecord]:
    latest: dict[tuple[str, str], ReviewRecord] = {}
    for record in records:  # oldest first, so later reviews replace earlier ones
        latest[(record.tenant, record.trace_id)] = record
    return list(latest.values())


def golden_rows(
    reviews: ReviewStore,
    traces: Store,
    tenants: Sequence[str] | None = None,
    *,
    since: datetime | None = None,
    provenance: bool = True,
) -> tuple[list[dict[str, Any]], int]:
    """(golden-set rows of the reviewed traces, how many were skipped for want of a question)."""
    from service.probes.golden import GoldChunk, GoldenQuestion

    rows: list[dict[str, Any]] = []
    skipped = 0
    used: set[str] = set()
    for record in _latest(reviews.list_reviews(tenants, since=since)):
        trace = traces.get_trace(record.tenant, record.trace_id)
        question = (trace or {}).get("query") or ""
        if not question.strip():
            skipped += 1
            continue
        review = record.review
        question_id = record.trace_id
        if question_id in used:  # the same trace id in two tenants
            question_id = f"{record.tenant}:{record.trace_id}"
        used.add(question_id)
        golden = GoldenQuestion(
            question_id=question_id,
            question=question,
            gold_chunks=tuple(GoldChunk(chunk_id=c) for c in dict.fromkeys(review.expected_chunk_ids)),
            expected_facts=(review.reference_answer,) if review.reference_answer else (),
            expected_behaviour=review.expected_behaviour,
            category=review.category or None,
            tenants=(record.tenant,),
        )
        row = json.loads(golden.model_dump_json(exclude_defaults=True))
        if provenance:
            row |= {
                "reference_answer": review.reference_answer,
                "source_trace_id": record.trace_id,
                "reviewer": record.reviewer,
            }
        rows.append(row)
    return rows, skipped


def to_jsonl(rows: Iterable[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, required=True, help="JSONL file to write ('-' for stdout)")
    parser.add_argument(
        "--since", help="only reviews made at or after this ISO date or time (UTC if no zone)"
    )
    parser.add_argument("--tenant", action="append", help="only this tenant (repeatable; default: all)")
    parser.add_argument(
        "--golden",
        action="store_true",
        help="leave out reference_answer, source_trace_id and reviewer (plain golden-set rows)",
    )


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise SystemExit(f"ragmon review export: --since {text!r} is not an ISO date or time") from exc
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def main(args: argparse.Namespace, store_url: str) -> int:
    """Write the export; prints one summary line to stderr. Returns the exit status."""
    from service.review.store import ReviewStore
    from service.store.trace_store import Store

    since = _since(args.since)
    traces = Store(store_url)
    try:
        reviews = ReviewStore(traces.engine)
        reviews.create_schema()
        rows, skipped = golden_rows(reviews, traces, args.tenant, since=since, provenance=not args.golden)
    finally:
        traces.close()
    text = to_jsonl(rows)
    if str(args.out) == "-":
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
    print(f"exported {len(rows)} reviewed questions ({skipped} without a question skipped)", file=sys.stderr)
    return 0
