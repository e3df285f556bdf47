"""`FIELDS`: what each string-bearing field of every record ragmon keeps is, and how it is redacted.

The policy, apart from the `Redactor` that applies it (redaction.py): adding a field to a record
means classifying it here, and this list is also what docs/security.md shows (`fields_table`).
Every string-bearing field of every record ragmon keeps is in it, as one of

  ====  ========================================================================================
  text  free text (questions, answers, chunk text, notes): each match becomes `[REDACTED:<kind>]`,
        and a mark with a digest (an id's, below) loses its digest
  id    an identifier or label the app or a person chose (chunk ids, session ids, intent,
        release, app, model, categories): each match becomes `[REDACTED:<kind>:<digest>]`, a keyed
        digest of what it replaced, so two ids stay two ids (a feedback event id, a session, a
        chunk) and the same id is redacted alike everywhere (a golden set's chunk ids still meet
        the traces' ones; a filter on the raw value finds the redacted rows, `identifier`)
  json  a JSON object (chunk metadata): every key and string in it, as ids
  kept  not redacted, with the reason: an id ragmon checked or made (trace ids, hashes, tenants
        from the API-key map), a closed set of values, or a name the operator gives ragmon itself
  ====  ========================================================================================

tests/service/test_redaction.py fails on a string field that is in no list, and plants a secret in
every listed field to find it nowhere after ingest; `fields_table` is the list in docs/security.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FIELDS", "ROOT_RECORDS", "FieldKind", "FieldRule", "fields_table"]

FieldKind = Literal["text", "id", "json", "kept"]


@dataclass(frozen=True, slots=True)
class FieldRule:
    """How one field is redacted, and what it is (or why it is kept)."""

    kind: FieldKind
    why: str


def _text(why: str) -> FieldRule:
    return FieldRule("text", why)


def _id(why: str) -> FieldRule:
    return FieldRule("id", why)


def _kept(why: str) -> FieldRule:
    return FieldRule("kept", why)


_CLOSED = "a closed set of values"
_TENANT = "a tenant ragmon resolved from the API-key map (or the reviewer's grant), not from the text"
_TRACE_ID = "32 hex digits, checked at ingest"
_PROBE_ID = "named by the operator's golden set and `ragmon probe`; runs are looked up and scored by it"

# record class name -> field -> rule. Fields holding a record (or records) are not listed: the
# record's own entry applies. Fields holding no string (numbers, times, flags) are not listed.
FIELDS: dict[str, dict[str, FieldRule]] = {
    "RagTrace": {
        "trace_id": _kept(_TRACE_ID),
        "tenant": _kept(_TENANT),
        "app": _id("service.name: a metric label"),
        "release": _id("service.version: a metric label"),
        "intent": _id("the app's route or intent: a metric label"),
        "session_id": _id("joins re-asked questions"),
        "user_hash": _kept("a SHA-256 of the app's user id, never the id"),
        "query": _text("the question"),
        "answer": _text("the answer"),
        "cited_chunk_ids": _id("chunk ids the answer cites"),
        "regeneration_source": _kept(_CLOSED),
        "probe_run_id": _kept(_PROBE_ID),
        "probe_question_id": _kept(_PROBE_ID),
        "source": _kept(_CLOSED),
        "kind": _kept(_CLOSED),
    },
    "QueryEmbedding": {"model": _id("embedding model name")},
    "Timings": {},  # numbers only
    "Retrieval": {
        "retriever": _id("retriever name"),
        "filter": _text("the filter predicate as the app logged it"),
        "excluded_ids": _id("chunk ids the filter excluded"),
    },
    "Chunk": {
        "id": _id(
            "chunk id (retrieved, reranker input and output); one made from the text: of the redacted text"
        ),
        "content": _text("chunk text"),
        "metadata": FieldRule("json", "chunk metadata: every key and string value"),
    },
    "ModelUsage": {
        "model": _id("model name: a metric label"),
        "kind": _kept(_CLOSED),
        "cost_source": _kept(_CLOSED),
    },
    "Feedback": {
        "event_id": _id("the app's event id: the same id is stored once"),
        "trace_id": _kept(_TRACE_ID),
        "tenant": _kept(_TENANT),
        "app": _id("service name"),
        "kind": _kept(_CLOSED),
        "reason": _id("reason category"),
        "text": _text("the user's comment"),
    },
    "ReviewIn": {
        "verdict": _kept(_CLOSED),
        "failure_mode": _kept(_CLOSED),
        "expected_chunk_ids": _id("chunk ids a reviewer expected"),
        "reference_answer": _text("a reviewer's model answer"),
        "category": _id("a reviewer's category: a golden-set slice and metric label"),
        "expected_behaviour": _kept(_CLOSED),
        "note": _text("a reviewer's note"),
    },
    "Intake": {
        "tenant": _kept(_TENANT),
        "queue": _kept(_CLOSED),
        "trace_id": _kept(_TRACE_ID),
        "app": _id("service name"),
        "reason": _kept(_CLOSED),
        "detail": _text("why it was sent for review (the note of POST /api/v1/review/items)"),
        "diagnosis": _kept(_CLOSED),
        "judge_version": _kept("the judge's version, ragmon's own"),
    },
    "GoldenQuestion": {
        "question_id": _kept(_PROBE_ID),
        "question": _text("the question"),
        "expected_facts": _text("facts a correct answer states"),
        "expected_behaviour": _kept(_CLOSED),
        "category": _id("the slice a question is reported in: a metric label"),
        "tenants": _kept("tenant names, matched against the API-key map's"),
        "reference_answer": _text("a model answer"),
        "source_trace_id": _id("the trace a row came from"),
        "reviewer": _id("who labelled it"),
    },
    "GoldChunk": {
        "chunk_id": _id("gold chunk id, redacted as the traces' chunk ids are"),
        "tenants": _kept("tenant names, matched against the API-key map's"),
    },
    "Evidence": {
        "evidence_id": _id("evidence id"),
        "chunk_ids": _id("the chunks holding the evidence"),
        "tenants": _kept("tenant names, matched against the API-key map's"),
    },
}
"""The one list: what each string-bearing field of a kept record is, and how it is redacted."""

ROOT_RECORDS = ("RagTrace", "Feedback", "ReviewIn", "Intake", "GoldenQuestion")
"""The records ragmon keeps; the others in `FIELDS` are parts of these."""


def fields_table() -> str:
    """`FIELDS` as a Markdown table (docs/security.md, kept current by scripts/update_readme.py)."""
    lines = ["| record | field | redacted as | what it is |", "|---|---|---|---|"]
    for record, rules in FIELDS.items():
        for name, rule in rules.items():
            shown = "not redacted" if rule.kind == "kept" else rule.kind
            lines.append(f"| `{record}` | `{name}` | {shown} | {rule.why} |")
    return "\n".join(lines)
