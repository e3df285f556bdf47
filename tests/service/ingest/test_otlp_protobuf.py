"""Tests of `service/ingest/otlp_protobuf.py`'s own reading of protobuf: arrays on and off the
all-double fast path, and `pb_attributes`' inline cases against the general path of `otlp.py`
(`finish_attributes` over `pb_value`), value by value. Decoding by the shared rules, protobuf beside
OTLP/JSON, is tested in test_otlp.py."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from service.ingest.otlp import (
    MAX_COUNT,
    MAX_IDENTIFIER_CHARS,
    MAX_KEY_CHARS,
    MAX_TEXT_CHARS,
    MAX_VECTOR_LENGTH,
    DecodedBatch,
    InvalidValue,
    RejectReason,
    finish_attributes,
)
from service.ingest.otlp_protobuf import decode_request, pb_attributes, pb_value
from tests.protobuf_bytes import field

VECTOR_KEY = "embedding.embeddings.0.embedding.vector"
TENANT = "acme"
TRACE = "5b8efff798038103d269b633813fc60c"
ROOT = "eee19b7ec3c1b174"


def test_protobuf_arrays_decode_exactly_on_and_off_the_double_fast_path() -> None:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = "arrays", bytes.fromhex(TRACE), bytes.fromhex(ROOT)
    span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    doubles = [0.0, -0.0, 1.5, -2.25e-300, 1e300]
    cases: dict[str, list[Any]] = {
        VECTOR_KEY: doubles,
        "ints": [1, -2, 2**62],
        "mixed": [0.5, "x", True],
        "empty": [],
    }
    for key, values in cases.items():
        kv = span.attributes.add()
        kv.key = key
        array = kv.value.array_value
        array.SetInParent()  # an empty list is still a set array value
        for item in values:
            element = array.values.add()
            if isinstance(item, bool):
                element.bool_value = item
            elif isinstance(item, float):
                element.double_value = item
            elif isinstance(item, int):
                element.int_value = item
            else:
                element.string_value = item
    batch = decode_request(request, TENANT)
    (decoded,) = batch.spans
    assert batch.rejections == {}
    assert decoded.attributes[VECTOR_KEY] == doubles
    assert decoded.attributes["ints"] == [1, -2, 2**62]
    assert decoded.attributes["mixed"] == [0.5, "x", True]
    assert decoded.attributes["empty"] == []
    assert all(type(v) is int for v in decoded.attributes["ints"])
    kv = span.attributes[0]
    kv.key = "plain.doubles"
    (again,) = decode_request(request, TENANT).spans
    assert again.attributes["plain.doubles"] == doubles
    negative_zero = again.attributes["plain.doubles"][1]
    assert isinstance(negative_zero, float) and math.copysign(1.0, negative_zero) == -1.0


def _array(*items: AnyValue) -> AnyValue:
    value = AnyValue()
    value.array_value.SetInParent()  # an empty array is still a set value
    value.array_value.values.extend(items)
    return value


def _kvlist(**items: AnyValue) -> AnyValue:
    value = AnyValue()
    value.kvlist_value.SetInParent()
    for key, item in items.items():
        value.kvlist_value.values.add(key=key, value=item)
    return value


def _doubles(*numbers: float) -> AnyValue:
    return _array(*(AnyValue(double_value=n) for n in numbers))


_SCORE = "retrieval.documents.0.document.score"

_COUNT = "llm.token_count.prompt"

_ODD_ATTRIBUTES: list[tuple[str, AnyValue]] = [
    *[
        ("input.value", value)
        for value in [
            AnyValue(string_value="a question"),
            AnyValue(string_value=""),
            AnyValue(string_value="é" * MAX_TEXT_CHARS),
            AnyValue(string_value="x" * (MAX_TEXT_CHARS + 1)),
            AnyValue(int_value=0),
            AnyValue(bool_value=False),
            AnyValue(double_value=math.nan),
            AnyValue(bytes_value=b""),
            AnyValue(),
            _array(AnyValue(string_value="a"), AnyValue(int_value=1)),
            _array(AnyValue(string_value="x" * (MAX_TEXT_CHARS + 1))),
            _kvlist(a=AnyValue(string_value="b"), nested=_kvlist(c=_doubles(0.5))),
        ]
    ],
    *[
        ("session.id", value)
        for value in [
            AnyValue(string_value="s" * MAX_IDENTIFIER_CHARS),
            AnyValue(string_value="s" * (MAX_IDENTIFIER_CHARS + 1)),
            AnyValue(string_value=""),
            AnyValue(int_value=7),
        ]
    ],
    *[
        (_SCORE, AnyValue(double_value=n))
        for n in [0.83, -0.0, 0.0, 1e308, -5e-324, math.nan, math.inf, -math.inf]
    ],
    *[
        (_SCORE, value)
        for value in [
            AnyValue(int_value=3),
            AnyValue(string_value="0.83"),
            AnyValue(string_value="nan"),
            AnyValue(bool_value=True),
            AnyValue(),
            _doubles(0.5),
        ]
    ],
    *[(_COUNT, AnyValue(int_value=n)) for n in [0, 120, -1, MAX_COUNT, MAX_COUNT + 1, 2**63 - 1, -(2**63)]],
    *[
        (_COUNT, value)
        for value in [
            AnyValue(double_value=3.0),
            AnyValue(double_value=3.5),
            AnyValue(string_value=" 12 "),
            AnyValue(bool_value=True),
            AnyValue(),
        ]
    ],
    *[("llm.cost.total", AnyValue(double_value=n)) for n in [0.5, -1.0, math.nan, 2e6]],
    *[
        (VECTOR_KEY, value)
        for value in [
            _doubles(0.1, -0.0, 2.5),
            _doubles(0.25),
            _doubles(1e308, 1e308),  # finite numbers whose sum overflows
            _doubles(0.1, math.nan),
            _doubles(-math.inf),
            _doubles(*[0.5] * (MAX_VECTOR_LENGTH + 1)),
            _array(),
            _array(AnyValue(int_value=1), AnyValue(double_value=2.5)),
            _array(AnyValue(double_value=0.5), AnyValue(string_value="x")),
            AnyValue(string_value="[0.1, 0.2]"),
        ]
    ],
    ("k" * (MAX_KEY_CHARS + 1), AnyValue(string_value="v")),
    ("retrieval.documents.99999.document.id", AnyValue(string_value="doc")),
    ("retrieval.documents.2.document.id", AnyValue(string_value="doc-2")),
]


def _general_path(
    pairs: Sequence[Any], dims: set[int] | None
) -> tuple[str, int, dict[str, int], list[str]] | RejectReason:
    batch = DecodedBatch()
    try:
        attributes, size = finish_attributes(((kv.key, pb_value(kv.value)) for kv in pairs), batch, "w", dims)
    except InvalidValue as problem:
        return problem.reason
    return repr(list(attributes.items())), size, batch.rejections, batch.details


def _inline_path(
    pairs: Sequence[Any], dims: set[int] | None
) -> tuple[str, int, dict[str, int], list[str]] | RejectReason:
    batch = DecodedBatch()
    try:
        attributes, size = pb_attributes(pairs, batch, "w", dims)
    except InvalidValue as problem:
        return problem.reason
    return repr(list(attributes.items())), size, batch.rejections, batch.details


@pytest.mark.parametrize("span_attributes", [True, False], ids=["span", "resource"])
@pytest.mark.parametrize(("key", "value"), _ODD_ATTRIBUTES, ids=lambda x: str(x)[:24])
def test_protobuf_attributes_read_inline_equal_the_general_path(
    key: str, value: AnyValue, span_attributes: bool
) -> None:
    """`pb_attributes` reads common values (strings, double scores, integer counts, all-double
    vectors) inline; every value, odd ones included, must come out as the general path makes it:
    the same value and type, size, rejections, vector lengths, or the same span rejection."""
    span = ExportTraceServiceRequest().resource_spans.add().scope_spans.add().spans.add()
    span.attributes.add(key=key, value=value)
    inline_dims: set[int] | None = set() if span_attributes else None
    general_dims: set[int] | None = set() if span_attributes else None
    assert _inline_path(span.attributes, inline_dims) == _general_path(span.attributes, general_dims)
    assert inline_dims == general_dims


def test_protobuf_attributes_of_a_whole_span_equal_the_general_path() -> None:
    span = ExportTraceServiceRequest().resource_spans.add().scope_spans.add().spans.add()
    for key, value in _ODD_ATTRIBUTES:
        span.attributes.add(key=key, value=value)
    kept = [kv for kv in span.attributes if _general_path([kv], set()) is not RejectReason.NAN_VECTOR]
    inline_dims: set[int] = set()
    general_dims: set[int] = set()
    assert _inline_path(kept, inline_dims) == _general_path(kept, general_dims)
    assert inline_dims == general_dims == {1, 2, 3}


def _long_vector_request() -> bytes:
    """Spans with vectors of more than `WIRE_SLICE_MIN_ITEMS` numbers, which screening reads from their
    span's bytes: canonical ones, one with a NaN, one with an integer among the doubles, two lengths
    in one span, and one whose value the sender split in two (the parser merges the parts)."""
    from service.ingest.otlp_protobuf import WIRE_SLICE_MIN_ITEMS

    n = WIRE_SLICE_MIN_ITEMS + 88
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()

    def span(name: str, *vectors: list[Any]) -> Any:
        pb = scope.spans.add(name=name, trace_id=bytes.fromhex(TRACE), start_time_unix_nano=1)
        pb.span_id, pb.end_time_unix_nano = bytes([len(scope.spans)]) * 8, 2
        pb.attributes.add(key="embedding.model_name").value.string_value = "text-embedding-3-small"
        for i, vector in enumerate(vectors):
            kv = pb.attributes.add(key=f"embedding.embeddings.{i}.embedding.vector")
            for x in vector:
                item = kv.value.array_value.values.add()
                if isinstance(x, float):
                    item.double_value = x
                else:
                    item.int_value = x
        return pb

    base = [i / 997 for i in range(n)]
    span("canonical", base)
    span("nan", [*base[:300], math.nan, *base[301:]])
    span("an integer", [*base[:5], 7, *base[6:]])
    span("two lengths", base, base[:-1])
    span("split value")
    # the split span gets its vector by hand: one KeyValue whose value field comes twice, each an
    # AnyValue holding half of the array (the parser merges them into one array, in order)
    halves = []
    for part in (base[: n // 2], base[n // 2 :]):
        half = AnyValue()
        half.array_value.values.extend([AnyValue(double_value=x) for x in part])
        halves.append(field(2, half.SerializeToString()))
    key_value = field(1, VECTOR_KEY.encode()) + b"".join(halves)
    spans = [pb.SerializeToString() for pb in scope.spans]
    spans[-1] += field(9, key_value)  # Span.attributes: a repeated field, appended
    scope_bytes = b"".join(field(2, raw) for raw in spans)
    return field(1, field(2, scope_bytes))  # request.resource_spans[0].scope_spans[0]


def test_long_vectors_read_from_the_span_bytes_equal_re_encoding_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from service.ingest import lazy_arrays, otlp_protobuf

    body, n = _long_vector_request(), otlp_protobuf.WIRE_SLICE_MIN_ITEMS + 88
    parsed = ExportTraceServiceRequest.FromString(body)
    split = parsed.resource_spans[0].scope_spans[0].spans[-1]
    assert len(split.attributes[-1].value.array_value.values) == n

    def screen_and_decode() -> tuple[Any, ...]:
        batch = otlp_protobuf.screen_protobuf(body, TENANT)
        problems = DecodedBatch()
        spans = [otlp_protobuf.span_from_wire(s, problems) for s in batch.spans]  # type: ignore[arg-type]
        return (
            batch.rejected_spans,
            batch.rejections,
            [(s.name, s.attributes) for s in spans],
            problems.rejections,
        )

    found: list[bytes | None] = []
    real = lazy_arrays.array_bytes

    def counted(buf: bytes, key_value: tuple[int, int]) -> bytes | None:
        found.append(real(buf, key_value))
        return found[-1]

    monkeypatch.setattr(lazy_arrays, "array_bytes", counted)
    sliced = screen_and_decode()
    # screening read its 5 vectors from the span bytes, not the split one, which re-encoding reads as
    # the parser merged it; decoding read the 2 kept canonical spans' vectors from their lazy parse
    # (`lazy_arrays`: the spans re-encode to their own bytes), and the split one's from the real
    # classes, after its bytes refused it too (tests/service/ingest/test_lazy_arrays.py)
    assert [b is not None for b in found].count(True) == 5 and found.count(None) == 2
    monkeypatch.setattr(otlp_protobuf, "WIRE_SLICE_MIN_ITEMS", 10**9)  # every vector screened re-encoded
    assert screen_and_decode() == sliced
    rejected, reasons, kept, _ = sliced
    assert rejected == 2 and reasons == {
        RejectReason.NAN_VECTOR.value: 1,
        RejectReason.VECTOR_DIMENSION_MISMATCH.value: 1,
    }
    by_name = dict(kept)
    assert set(by_name) == {"canonical", "an integer", "split value"}
    expected = [i / 997 for i in range(n)]
    assert by_name["canonical"][VECTOR_KEY] == expected
    assert by_name["split value"][VECTOR_KEY] == expected  # the merged parts, in order
    assert by_name["an integer"][VECTOR_KEY][5] == 7.0


def _vector_request(vector: Sequence[float]) -> bytes:
    request = ExportTraceServiceRequest()
    pb = request.resource_spans.add().scope_spans.add().spans.add(name="embed", start_time_unix_nano=1)
    pb.trace_id, pb.span_id, pb.end_time_unix_nano = bytes.fromhex(TRACE), bytes.fromhex(ROOT), 2
    array = pb.attributes.add(key=VECTOR_KEY).value.array_value
    array.values.extend(AnyValue(double_value=x) for x in vector)
    return request.SerializeToString()


def test_screening_finds_every_non_finite_number_by_its_top_byte_as_numpy_does() -> None:
    """Screening reads one byte of each double (`_may_hold_non_finite`) before any numpy call: it
    must flag every NaN and infinity (any sign and payload), and a finite number it flags (over
    2**1008) must still pass the exact check. Held against `math.isfinite`, number by number,
    over the special values and 20,000 random bit patterns, a quarter of them with every exponent
    bit set."""
    import random
    import struct

    from service.ingest.otlp_protobuf import _may_hold_non_finite, screen_protobuf

    rng = random.Random(36)
    patterns = [rng.getrandbits(64) for _ in range(15_000)]
    patterns += [rng.getrandbits(64) | 0x7FF0_0000_0000_0000 for _ in range(5_000)]  # NaN or infinity
    numbers = [struct.unpack("<d", struct.pack("<Q", p))[0] for p in patterns]
    numbers += [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 5e-324, 2.0**1008, -1.7e308, 0.5]
    flagged = 0
    for x in numbers:
        item = AnyValue(double_value=x)
        wire = field(1, item.SerializeToString())
        assert len(wire) == 11  # the fixed layout the byte is read from
        if not math.isfinite(x):
            assert _may_hold_non_finite(wire), x
        flagged += _may_hold_non_finite(wire)
    assert flagged > 5_000  # the non-finite ones, and the huge finite ones
    for x in (math.nan, -math.inf, 1.7e308, -(2.0**1009), 0.25):
        batch = screen_protobuf(_vector_request([0.1] * 100 + [x] + [0.2] * 27), TENANT)
        if math.isfinite(x):
            assert (len(batch.spans), batch.rejected_spans) == (1, 0), x
        else:
            assert (len(batch.spans), batch.rejections) == (0, {RejectReason.NAN_VECTOR.value: 1}), x
