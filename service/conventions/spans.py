"""`Span`: one decoded OTLP span, the unit the assembler buffers.

Receivers (`service/ingest/otlp_protobuf.py`, `otlp_json.py`, the gRPC receiver) produce these
(or their packed forms below, `PackedSpan` and `WireSpan`, which worker
processes hand around); `semconv.py` turns the spans of one trace into a
`RagTrace`. Ids are
lower-case hex, times are Unix nanoseconds, attribute values are plain Python
values (str, bool, int, float, bytes, lists of those, or dicts for kvlists).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

# Union, not `|`: the recursive forward references are strings, which `|` cannot combine at runtime.
AttrValue = Union[str, bool, int, float, bytes, list["AttrValue"], dict[str, "AttrValue"], None]  # noqa: UP007
Attributes = dict[str, AttrValue]


@dataclass(slots=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict)


@dataclass(slots=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Attributes = field(default_factory=dict)
    events: list[SpanEvent] = field(default_factory=list)
    resource: Attributes = field(default_factory=dict)
    kind: int = 0
    status_code: int = 0
    tenant: str = "default"
    size_bytes: int = 0

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9

    def __reduce__(self) -> tuple[Any, ...]:
        # Positional fields pickle in half the time of the default slots state (service/ingest/pool.py).
        return (
            Span,
            (
                self.trace_id,
                self.span_id,
                self.parent_span_id,
                self.name,
                self.start_ns,
                self.end_ns,
                self.attributes,
                self.events,
                self.resource,
                self.kind,
                self.status_code,
                self.tenant,
                self.size_bytes,
            ),
        )


class PackedSpan(NamedTuple):
    """A decoded span with everything but what the assembler routes by kept pickled.

    Worker processes decode bodies into these and later build traces from them
    (service/ingest/pool.py), so the server process never unpickles a span's
    attributes: it only groups the spans by trace.
    """

    tenant: str
    trace_id: str
    parent_span_id: str | None
    size_bytes: int
    blob: bytes

    @classmethod
    def pack(cls, span: Span) -> PackedSpan:
        return cls(span.tenant, span.trace_id, span.parent_span_id, span.size_bytes, pickle.dumps(span, 5))

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id

    def unpack(self) -> Span:
        span: Span = pickle.loads(self.blob)
        return span


class WireSpan(NamedTuple):
    """An OTLP protobuf span that passed every check that can reject it, kept as its wire bytes.

    Decoding a body only screens its spans (ids, times, embedding vectors:
    service/ingest/otlp_protobuf.py); the attributes are converted when the trace is built
    (`otlp_protobuf.span_from_wire`), off the request's path. `resource` is the
    decoded resource of the span's `ResourceSpans`, one dict shared by its
    spans. `size_bytes` estimates the decoded span, as `Span.size_bytes` does.
    """

    tenant: str
    trace_id: str
    parent_span_id: str | None
    size_bytes: int
    raw: bytes
    resource: Attributes

    @property
    def is_root(self) -> bool:
        return not self.parent_span_id


@dataclass(slots=True)
class LogEvent:
    """An event of span `span_id` that arrived as an OTLP log record, not inside the span.

    The OTel GenAI instrumentations send message content this way
    (`gen_ai.user.message`, `gen_ai.choice`,
    `gen_ai.client.inference.operation.details`): the log record carries the
    trace and span ids of the call it belongs to. The assembler buffers it with
    the spans of its trace, whichever arrives first, and `semconv` attaches it
    to its span as a `SpanEvent` when the trace is built. `attributes` are the
    record's attributes with the fields of its body (an AnyValue map) merged in;
    a body that is not a map is kept under "content".
    """

    trace_id: str
    span_id: str
    name: str
    time_ns: int
    attributes: Attributes = field(default_factory=dict)
    resource: Attributes = field(default_factory=dict)
    tenant: str = "default"
    size_bytes: int = 0

    # never the root: a trace is complete when its root *span* has ended
    is_root = False

    def as_span_event(self) -> SpanEvent:
        return SpanEvent(self.name, self.time_ns, self.attributes)


# What the assembler buffers: a span, the same span packed by a worker process, a screened
# protobuf span still in its wire form, or an event of a span sent as a log record.
AnySpan = Span | PackedSpan | WireSpan | LogEvent
