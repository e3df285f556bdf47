"""What the review page shows of an item: the listed item, and one item in full (its trace, the judgment
it was queued for, the claims to mark, the reviewer's label, its neighbours in the list).

A blind item hides what the judge thought (its diagnosis, its reasons, the judgment) until the
blind label is in; its claims are shown to mark, without the judge's marks. Trace text is handed
over as data: the page writes it with `textContent` (`static/review.js`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.review.records import ItemFilters, ReviewItem

__all__ = ["claim_marks_error", "item_detail", "listed"]


def listed(item: ReviewItem) -> dict[str, Any]:
    """An item as the list shows it (a blind one without the judge's diagnosis and reasons)."""
    data = item.to_json()
    if item.judge_hidden:
        # what the judge thought stays hidden until the blind label is in
        data["diagnosis"] = None
        data["reasons"] = [{"reason": "blind_sample", "detail": None}]
    return data


def _answer_segments(answer: str, claims: Sequence[str], supported: set[int]) -> list[dict[str, Any]]:
    """The answer cut into pieces, each claim found in it marked with its index and status."""
    marks: list[tuple[int, int, int]] = []
    folded = answer.casefold()
    for index, claim in enumerate(claims):
        needle = claim.strip().casefold()
        if not needle:
            continue
        start = folded.find(needle)
        if start < 0:
            continue
        end = start + len(needle)
        if all(end <= s or start >= e for s, e, _ in marks):
            marks.append((start, end, index))
    pieces: list[dict[str, Any]] = []
    at = 0
    for start, end, index in sorted(marks):
        if start > at:
            pieces.append({"text": answer[at:start], "claim": None, "supported": None})
        pieces.append({"text": answer[start:end], "claim": index, "supported": index in supported})
        at = end
    if at < len(answer):
        pieces.append({"text": answer[at:], "claim": None, "supported": None})
    return pieces


def _judgment_view(record: dict[str, Any], answer: str) -> dict[str, Any]:
    claims = list(record.get("claims") or [])
    supported = set(record.get("supported") or [])
    return {
        "judge": record.get("judge"),
        "judge_version": record.get("judge_version"),
        "judge_model": record.get("judge_model"),
        "outcome": record.get("outcome"),
        "faithfulness": record.get("faithfulness"),
        "diagnosis": record.get("diagnosis"),
        "failure_mode": record.get("failure_mode"),
        "failure_reason": record.get("failure_reason"),
        "rationale": record.get("rationale"),
        "claims": [{"index": i, "text": c, "supported": i in supported} for i, c in enumerate(claims)],
        "answer_segments": _answer_segments(answer, claims, supported),
    }


def _chunks(context: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [
        {"id": c.get("id"), "rank": c.get("rank", i), "score": c.get("score"), "content": c.get("content")}
        for i, c in enumerate(context.get(key) or [])
    ]


def item_detail(
    pipeline: Any, item: ReviewItem, filters: ItemFilters, tenants: Sequence[str]
) -> dict[str, Any]:
    """One item in full, read from the pipeline's stores (blocking: run it in a thread); `filters` and
    `tenants` place it among its neighbours in the reviewer's list."""
    trace = pipeline.store.get_trace(item.tenant, item.trace_id)
    judged, _flags = pipeline.judgments.for_trace(item.tenant, item.trace_id)
    review = pipeline.reviews.review_of(item.id)
    queued_for = _judgment_of(pipeline, item)
    hidden = item.judge_hidden
    answer = (trace or {}).get("answer") or ""
    context = (trace or {}).get("context") or {}
    neighbours = [i.id for i in pipeline.reviews.list_items(tenants, filters, limit=1000)]
    at = neighbours.index(item.id) if item.id in neighbours else -1
    return {
        "item": listed(item) if hidden else item.to_json(),
        "trace": None
        if trace is None
        else {
            "trace_id": trace["trace_id"],
            "app": trace["app"],
            "release": trace.get("release"),
            "intent": trace.get("intent"),
            "start_time": trace.get("start_time"),
            "query": trace.get("query"),
            "answer": trace.get("answer"),
            "chunks": _chunks(context, "chunks"),
            "reranked": _chunks(context, "reranker_output"),
            "feedback": [
                {"kind": f.get("kind"), "reason": f.get("reason"), "text": f.get("text")}
                for f in trace.get("feedback") or []
            ],
        },
        "judge_hidden": hidden,
        "judgment": None if hidden or not judged else _judgment_view(judged[-1], answer),
        "claims_to_label": _claims_to_label(queued_for),
        "review": None
        if review is None
        else {
            "reviewer": review.reviewer,
            "created_at": review.created_at.isoformat(),
            "verdict": review.review.verdict,
            "failure_mode": review.review.failure_mode,
            "expected_chunk_ids": list(review.review.expected_chunk_ids),
            "reference_answer": review.review.reference_answer,
            "category": review.review.category,
            "expected_behaviour": review.review.expected_behaviour,
            "note": review.review.note,
            "claims_supported": None
            if review.review.claims_supported is None
            else list(review.review.claims_supported),
        },
        "prev_id": neighbours[at - 1] if at > 0 else None,
        "next_id": neighbours[at + 1] if 0 <= at < len(neighbours) - 1 else None,
    }


def _judgment_of(pipeline: Any, item: ReviewItem) -> dict[str, Any] | None:
    """The judgment the item was queued for (its judge version), else the newest one of its trace."""
    judged, _flags = pipeline.judgments.for_trace(item.tenant, item.trace_id)
    for record in judged:
        if record.get("judge_version") == item.judge_version:
            return dict(record)
    return dict(judged[-1]) if judged else None


def _claims_to_label(judgment: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The judge's claims as text only, in order: what a reviewer marks supported or not (a blind
    item shows them too, without the judge's marks)."""
    if judgment is None or judgment.get("outcome") != "scored":
        return []
    return [{"index": i, "text": text} for i, text in enumerate(judgment.get("claims") or [])]


def claim_marks_error(pipeline: Any, item: ReviewItem, marks: Sequence[bool] | None) -> str | None:
    """Why the claim marks cannot be stored for the item, or None when they fit its judgment."""
    if marks is None:
        return None
    claims = _claims_to_label(_judgment_of(pipeline, item))
    if len(marks) != len(claims):
        return f"claims_supported has {len(marks)} marks; the judge's answer has {len(claims)} claims"
    return None
