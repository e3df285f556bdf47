"""`OtlpSpanCodec`: how the span archive keeps a trace's spans and events: as OTLP request messages.

Spans are kept as one `ExportTraceServiceRequest` message, events (GenAI
events sent as log records) as one `ExportLogsServiceRequest`, each grown by
appending: the concatenation of two such messages is one message holding
both (protobuf concatenates repeated fields). The bytes are the spans topic's
(service/ingest/span_records.py): a span that arrived as OTLP protobuf is
kept as its own wire bytes. Reading them back screens them again, as a
spans-topic record is: what ingest accepted passes.

An item's identity is its wire bytes, so a span delivered twice
(a client's retry, a replayed write-ahead log record, a Kafka record read
again) is kept once, in whichever form it came.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from service.conventions.spans import AnySpan, LogEvent, WireSpan
from service.ingest import otlp_logs, otlp_protobuf, span_records

__all__ = ["OtlpSpanCodec"]


class OtlpSpanCodec:
    """`service.store.span_archive.SpanCodec` on OTLP protobuf."""

    def encode(self, items: Sequence[AnySpan]) -> tuple[bytes, bytes]:
        return self.encode_many([items])[0]

    def encode_many(self, groups: Sequence[Sequence[AnySpan]]) -> list[tuple[bytes, bytes]]:
        """`encode` of several traces' items (one trace per group) in one pass: a resource shared by
        the spans of one request is serialized once for all of them."""
        return span_records.encode_traces(groups)

    def decode(self, tenant: str, spans: bytes, events: bytes) -> list[AnySpan]:
        items: list[AnySpan] = list(otlp_protobuf.screen_protobuf(spans, tenant).spans) if spans else []
        if events:
            items.extend(otlp_logs.decode_protobuf(events, tenant).log_events)
        return items

    def identity(self, item: AnySpan) -> Hashable:
        # the bytes themselves: hashing them once (bytes keep their hash) costs a fraction of a digest
        raw = item.raw if isinstance(item, WireSpan) else span_records.item_bytes(item)
        return (isinstance(item, LogEvent), raw)
