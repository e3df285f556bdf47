"""The blind sample's labels joined with the judged sample: what the human-corrected estimate reads.

One row per reviewed blind item whose trace is in the judged sample of the
window: its judge-queue record (app, release, intent, stratum, inclusion
probability) started in (start, end], is `done`, and its judgment (the
record's judge version) scored the answer. Only the `blind` queue counts:
flagged items were chosen because the judge or a user objected, so they are
no random part of the judged sample and would bias the correction. A review
of a trace the sample does not hold (never judged, judged outside the
window, failed, or an answer with no claims by the judge's account) is no
row. One review per item, and the reviewer's later label replaces their
earlier one (`ReviewStore.submit`), so a trace counts once. Reviews and
judge-queue records join on the tenant, so a label never crosses tenants.

Each row gives a `LabelledSample` per reading (`for_reading`):

* `answers`: the judge's 1 (no unsupported claim) or 0 against the
  reviewer's `faithful` 1 / `unfaithful` 0; `unsure` gives no label;
* `claims`: the judge's share of supported claims against the share the
  reviewer marked supported (`ReviewIn.claim_share`: a `faithful` verdict
  with no marks is 1; no marks on another verdict give no label).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from sampler.corrected import LabelledSample
from sampler.queue_table import judge_queue
from service.errors import StoreUnavailable
from service.judge.store import Reading, judgments
from service.review.records import ReviewIn, ReviewVerdict
from service.review.tables import review_claim_labels, reviews

__all__ = ["BlindLabel", "blind_labels"]

# faithfulness is supported / claims, a float: "every claim" is 1.0 up to its rounding (as judge/store.py)
_ALL_SUPPORTED = 1.0 - 1e-9


@dataclass(frozen=True, slots=True)
class BlindLabel:
    """One labelled blind item with its place in the judged sample."""

    tenant: str
    app: str
    release: str | None
    intent: str | None
    stratum: str
    inclusion_probability: float
    judge_faithfulness: float
    verdict: ReviewVerdict
    claims_supported: tuple[bool, ...] | None

    def for_reading(self, reading: Reading) -> LabelledSample | None:
        """The (judge score, human score) pair of one reading, or None when the label says nothing there."""
        review = ReviewIn(self.verdict, claims_supported=self.claims_supported)
        if reading == "answers":
            if self.verdict == "unsure":
                return None
            judge = 1.0 if self.judge_faithfulness >= _ALL_SUPPORTED else 0.0
            human = 1.0 if self.verdict == "faithful" else 0.0
        else:
            share = review.claim_share()
            if share is None:
                return None
            judge, human = self.judge_faithfulness, share
        return LabelledSample(
            inclusion_probability=self.inclusion_probability,
            judge_score=judge,
            human_score=human,
            stratum=self.stratum,
            app=self.app,
            release=self.release,
            intent=self.intent,
        )


def blind_labels(
    engine: Engine, start: datetime, end: datetime, *, tenant: str | None = None
) -> list[BlindLabel]:
    """The labelled blind items of traces that started in (start, end]; one tenant's when `tenant` is given.

    Raises `StoreUnavailable` when the database does not answer."""
    q, j, r, c = judge_queue.c, judgments.c, reviews.c, review_claim_labels.c
    query = (
        sa.select(
            q.tenant,
            q.app,
            q.release,
            q.intent,
            q.stratum,
            q.inclusion_probability,
            j.faithfulness,
            r.verdict,
            c.supported,
        )
        .select_from(
            reviews.join(judge_queue, sa.and_(q.tenant == r.tenant, q.trace_id == r.trace_id))
            .join(
                judgments,
                sa.and_(j.tenant == q.tenant, j.trace_id == q.trace_id, j.judge_version == q.judge_version),
            )
            .outerjoin(review_claim_labels, c.item_id == r.item_id)
        )
        .where(
            r.queue == "blind",
            q.trace_time > start,
            q.trace_time <= end,
            q.state == "done",
            j.outcome == "scored",
            j.faithfulness.is_not(None),
            sa.true() if tenant is None else q.tenant == tenant,
        )
    )
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).all()
    except (sa.exc.OperationalError, sa.exc.InterfaceError) as exc:
        raise StoreUnavailable(f"review store unavailable: {type(exc.orig).__name__}") from exc
    return [
        BlindLabel(
            tenant=row.tenant,
            app=row.app,
            release=row.release,
            intent=row.intent,
            stratum=row.stratum,
            inclusion_probability=float(row.inclusion_probability),
            judge_faithfulness=float(row.faithfulness),
            verdict=row.verdict,
            claims_supported=None
            if row.supported is None
            else tuple(bool(mark) for mark in json.loads(row.supported)),
        )
        for row in rows
    ]
