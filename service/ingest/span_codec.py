"""`OtlpSpanCodec`: how the span archive keeps a trace's spans and events: as OTLP request messages.

Spans are kept as one `ExportTraceServiceRequest` message, events (GenAI
events sent as log records) as one `ExportLogsServiceRequest`, each grown by
appending: the concatenation of two such messages is one message holding
both (protobuf concatenates repeated fields). The bytes are the spans topic's
(service/ingest/span_records.py): a span that arrived as OTLP protobuf is
kept as its own wire bytes. Reading them back screens them again, as a
spans-topic record is: what ingest accepted passes.

An item's identity is a digest of its wire bytes, so a span delivered twice
(a client's retry, a replayed write-ahead log record, a Kafka record read
again) is kept once, in whichever form it came.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from service.conventions.spans import AnySpan, LogEvent, WireSpan
from service.ingest import otlp, otlp_logs, span_records

__all__ = ["OtlpSpanCodec"]

# one record holds a whole trace's items here: no record limit applies to what is kept
_NO_LIMIT = 1 << 62


class OtlpSpanCodec:
    """`service.store.span_archive.SpanCodec` on OTLP protobuf."""

    def encode(self, items: Sequence[AnySpan]) -> tuple[bytes, bytes]:
        spans: list[bytes] = []
        events: list[bytes] = []
        for record in span_records.encode(items, _NO_LIMIT):
            (events if dict(record.headers)["ragmon-kind"] == b"logs" else spans).append(record.value)
        return b"".join(spans), b"".join(events)

    def decode(self, tenant: str, spans: bytes, events: bytes) -> list[AnySpan]:
        items: list[AnySpan] = list(otlp.screen_protobuf(spans, tenant).spans) if spans else []
        if events:
            items.extend(otlp_logs.decode_protobuf(events, tenant).log_events)
        return items

    def identity(self, item: AnySpan) -> bytes:
        raw = item.raw if isinstance(item, WireSpan) else span_records.item_bytes(item)
        kind = b"e" if isinstance(item, LogEvent) else b"s"
        return kind + hashlib.blake2b(raw, digest_size=16).digest()
