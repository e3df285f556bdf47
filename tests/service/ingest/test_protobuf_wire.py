"""Finding each span's bytes in an OTLP body by walking the wire format (service/ingest/protobuf_wire.py)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from service.conventions.spans import WireSpan
from service.ingest.otlp_protobuf import decode_protobuf, screen_protobuf
from service.ingest.protobuf_wire import WireError, array_bytes, attribute_ranges, field_ranges, span_slices
from tests.protobuf_bytes import field, tag, varint

# unknown fields of every wire type a parser must skip, one with a two-byte tag (field 300)
UNKNOWN = (
    tag(20, 0)
    + varint(2**63)
    + tag(21, 1)
    + struct.pack("<d", 1.5)
    + tag(22, 5)
    + struct.pack("<f", 2.5)
    + field(300, b"x" * 200)
)


def _all_spans(request: ExportTraceServiceRequest) -> list[PbSpan]:
    return [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]


@pytest.fixture
def exported() -> Iterator[bytes]:
    """A body from the real OTLP encoder: two resources, two scopes in one, spans over 127 bytes."""
    exporter = InMemorySpanExporter()
    providers = [
        TracerProvider(resource=Resource.create({"service.name": name})) for name in ("qa-bot", "search")
    ]
    for provider in providers:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    for n, tracer in enumerate(
        [providers[0].get_tracer("a"), providers[0].get_tracer("b"), providers[1].get_tracer("c")]
    ):
        with tracer.start_as_current_span(f"root {n}") as root:
            root.set_attribute("input.value", "q" * (50 + 100 * n))
            with tracer.start_as_current_span("child") as child:
                child.set_attribute("embedding.embeddings.0.embedding.vector", [0.5] * 64)
    yield encode_spans(exporter.get_finished_spans()).SerializeToString()
    for provider in providers:
        provider.shutdown()


def test_slices_are_the_spans_the_parser_sees_in_its_order(exported: bytes) -> None:
    request = ExportTraceServiceRequest.FromString(exported)
    assert len(request.resource_spans) == 2
    slices = span_slices(exported)
    parsed = _all_spans(request)
    assert len(slices) == len(parsed) == 6
    # what the OTLP encoder writes is canonical: the slices are byte for byte the re-encoding
    assert slices == [span.SerializeToString() for span in parsed]


def test_unknown_fields_split_lists_and_long_tags_are_walked_past() -> None:
    start = 1_764_000_000_000_000_000
    spans = [
        PbSpan(
            trace_id=bytes([i]) * 16,
            span_id=bytes([i]) * 8,
            name=f"s{i}" * 40,
            start_time_unix_nano=start,
            end_time_unix_nano=start + 1_000_000,
        )
        for i in range(1, 5)
    ]
    raw = [span.SerializeToString() for span in spans]
    scope_a = UNKNOWN + field(1, b"\x0a\x01a") + field(2, raw[0]) + UNKNOWN + field(2, raw[1])
    scope_b = field(2, raw[2]) + field(3, b"schema")
    resource_a = field(1, b"") + field(2, scope_a) + UNKNOWN + field(2, scope_b)
    resource_b = UNKNOWN + field(2, field(2, raw[3]))
    # ResourceSpans, unknown fields and ResourceSpans again: a repeated field may be split
    body = field(1, resource_a) + UNKNOWN + field(1, resource_b)
    request = ExportTraceServiceRequest.FromString(body)
    assert _all_spans(request) == spans
    assert span_slices(body) == raw
    # and screening hands those bytes on
    screened = screen_protobuf(body, "acme")
    assert screened.rejected_spans == 0
    assert [s.raw for s in screened.spans if isinstance(s, WireSpan)] == raw
    # a body given as a bytearray or memoryview is screened the same
    for view in (bytearray(body), memoryview(body)):
        assert [s.raw for s in screen_protobuf(view, "acme").spans if isinstance(s, WireSpan)] == raw  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="body must be bytes"):
        screen_protobuf("not bytes", "acme")  # type: ignore[arg-type]


def test_field_ranges_point_into_the_buffer() -> None:
    message = field(2, b"first") + UNKNOWN + field(2, b"") + field(3, b"other") + field(2, b"last")
    ranges = field_ranges(message, 0, len(message), 2)
    assert [message[start:end] for start, end in ranges] == [b"first", b"", b"last"]


@pytest.mark.parametrize(
    "body",
    [
        field(1, b"abc")[:-1],  # a length past the end
        tag(1, 2),  # a tag with no length
        tag(1, 0) + b"\xff" * 11,  # a varint over 10 bytes
        tag(7, 3) + tag(7, 4),  # a group
        tag(1, 2) + varint(3) + b"abc" + tag(2, 1) + b"\x00" * 7,  # a fixed64 cut short
    ],
)
def test_what_does_not_walk_raises_wire_error(body: bytes) -> None:
    with pytest.raises(WireError):
        span_slices(body)


def test_a_body_the_parser_takes_but_the_walk_does_not_is_re_encoded(exported: bytes) -> None:
    # protobuf parsers skip unknown groups; the walk gives up on them, and screening re-encodes
    body = exported + tag(9, 3) + tag(1, 0) + varint(5) + tag(9, 4)
    with pytest.raises(WireError):
        span_slices(body)
    screened = screen_protobuf(body, "acme")
    decoded = decode_protobuf(exported, "acme")
    assert [PbSpan.FromString(s.raw) for s in screened.spans if isinstance(s, WireSpan)] == _all_spans(
        ExportTraceServiceRequest.FromString(exported)
    )
    assert screened.rejected_spans == decoded.rejected_spans == 0


# -- a vector's bytes in its span (attribute_ranges, array_bytes) -------------------------------------


def _double_item(x: float) -> bytes:
    return field(1, tag(4, 1) + struct.pack("<d", x))  # ArrayValue.values += AnyValue{double_value}


def _key_value(key: str, any_value: bytes) -> bytes:
    return field(1, key.encode()) + field(2, any_value)


def test_array_bytes_are_what_the_parsed_array_re_encodes_to() -> None:
    span = PbSpan(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="embed", start_time_unix_nano=1)
    span.attributes.add(key="embedding.model_name").value.string_value = "m" * 300
    vector = span.attributes.add(key="embedding.embeddings.0.embedding.vector")
    vector.value.array_value.values.extend(
        [type(vector.value)(double_value=float(i) / 7) for i in range(600)]
    )
    span.attributes.add(key="empty").value.array_value.SetInParent()
    raw = UNKNOWN + span.SerializeToString() + UNKNOWN  # unknown fields around are walked past
    parsed = PbSpan.FromString(raw)
    ranges = attribute_ranges(raw)
    assert len(ranges) == len(parsed.attributes) == 3
    for index in (1, 2):
        expected = parsed.attributes[index].value.array_value.SerializeToString()
        assert array_bytes(raw, ranges[index]) == expected
    assert array_bytes(raw, ranges[0]) is None  # a string value holds no array field


@pytest.mark.parametrize(
    "key_value",
    [
        # the value given twice: the parser merges the two arrays into one
        _key_value("v", field(5, _double_item(1.0))) + field(2, field(5, _double_item(2.0))),
        # the array field given twice within one value: merged too
        _key_value("v", field(5, _double_item(1.0)) + field(5, _double_item(2.0))),
        # no value at all
        field(1, b"v"),
        # a value that does not walk (a length past its end)
        field(1, b"v") + tag(2, 2) + varint(3) + tag(5, 2) + varint(40),
    ],
)
def test_array_bytes_are_refused_where_they_are_not_what_the_parser_holds(key_value: bytes) -> None:
    assert array_bytes(key_value, (0, len(key_value))) is None
