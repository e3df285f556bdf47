"""Building a span from its bytes with `LazySpan` (service/ingest/lazy_arrays.py) decodes exactly what the
real classes decode: random spans with array and map values of every shape a sender may write (an
array or a value given twice, a text overriding an array and the reverse, arrays inside maps and
events, unknown fields, explicit zeros, attributes between other fields), decoded by `span_from_wire`
and by the same function on the real classes, must give equal spans and count the same problems."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.conventions.spans import WireSpan
from service.ingest import lazy_arrays, otlp_protobuf
from service.ingest.lazy_arrays import LazySpan
from service.ingest.otlp import DecodedBatch, InvalidValue
from tests.protobuf_bytes import field, tag, varint

TENANT = "acme"
TRACE = "5b8efff798038103d269b633813fc60c"
SPAN_ID = "eee19b7ec3c1b174"
# keys of each kind `otlp.kind_of` tells apart: a vector, a count, a score, free text and a list
KEYS = (
    "embedding.embeddings.0.embedding.vector",
    "embedding.embeddings.1.embedding.vector",
    "llm.token_count.prompt",
    "retrieval.documents.0.document.score",
    "input.value",
    "tag.tags",
    "metadata",
)


def _doubles(rng: random.Random) -> list[Any]:
    items: list[Any] = [rng.uniform(-1, 1) for _ in range(rng.choice([0, 1, 3, 256, 600]))]
    if items and rng.random() < 0.15:
        items[rng.randrange(len(items))] = rng.choice([math.nan, 7, "x"])
    return items


def _array(items: list[Any]) -> ArrayValue:
    array = ArrayValue()
    for x in items:
        if isinstance(x, float):
            array.values.add(double_value=x)
        elif isinstance(x, int):
            array.values.add(int_value=x)
        else:
            array.values.add(string_value=x)
    return array


def _array_value(rng: random.Random, odd: bool) -> bytes:
    """An AnyValue holding an array, serialized; if `odd`, sometimes with the array field twice (the
    parser merges the two)."""
    items = _doubles(rng) if rng.random() < 0.7 else [f"tag{i}" for i in range(rng.randint(0, 4))]
    whole = AnyValue(array_value=_array(items)).SerializeToString()
    if odd and rng.random() < 0.25:  # the same array field again, its own items
        return whole + field(5, _array(_doubles(rng)).SerializeToString())
    return whole


def _any_value(rng: random.Random, odd: bool, depth: int = 0) -> bytes:
    choice = rng.randrange(9)
    if choice == 0:
        return AnyValue(string_value="t" * rng.randint(1, 30)).SerializeToString()
    if choice == 1:
        return AnyValue(int_value=rng.choice([5, -1, 2**40])).SerializeToString()
    if choice == 2:
        return AnyValue(double_value=rng.choice([0.5, math.inf, -0.0])).SerializeToString()
    if choice == 3:
        return AnyValue(bool_value=True).SerializeToString()
    if choice == 4 and depth == 0:  # a map whose values may hold arrays
        pairs = [field(1, f"k{i}".encode()) + field(2, _any_value(rng, odd, depth + 1)) for i in range(3)]
        return field(6, b"".join(field(1, pair) for pair in pairs[: rng.randint(0, 3)]))
    if choice == 5 and odd:  # an array, then a text: the oneof keeps the text
        return _array_value(rng, odd) + field(1, b"later text")
    if choice == 6 and odd:  # a text, then an array: the oneof keeps the array
        return field(1, b"earlier text") + _array_value(rng, odd)
    return _array_value(rng, odd)


def _key_value(rng: random.Random, odd: bool) -> bytes:
    parts = [field(1, rng.choice(KEYS).encode()), field(2, _any_value(rng, odd))]
    if odd and rng.random() < 0.1:  # the value field twice: the parser merges the two AnyValues
        parts.append(field(2, _any_value(rng, odd)))
    if odd and rng.random() < 0.1:  # a field KeyValue does not have
        parts.insert(1, field(7, b"?"))
    return b"".join(parts)


def _random_span(rng: random.Random) -> bytes:
    """One span's bytes with random attributes and events. Two in five as a protobuf library writes
    them (fields in order, each once, no zeros); the rest with odd values (above), attributes among
    the other fields, or the explicit zeros another encoder writes, so that they do not re-encode
    to their own bytes."""
    odd = rng.random() < 0.6
    attributes = [field(9, _key_value(rng, odd)) for _ in range(rng.randint(0, 6))]
    events = []
    for i in range(rng.choice([0, 0, 1, 2])):
        event = PbSpan.Event(time_unix_nano=3, name=f"e{i}").SerializeToString()
        event += b"".join(field(3, _key_value(rng, odd)) for _ in range(rng.randint(0, 3)))
        events.append(field(11, event))
    ids = PbSpan(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN_ID), name="s")
    times = PbSpan(kind=PbSpan.SPAN_KIND_CLIENT, start_time_unix_nano=1, end_time_unix_nano=2)
    middle = rng.randrange(len(attributes) + 1) if odd else 0
    zeros = tag(10, 0) + varint(0) if odd and rng.random() < 0.3 else b""  # dropped_attributes_count: 0
    return (
        ids.SerializeToString()
        + b"".join(attributes[:middle])
        + times.SerializeToString()
        + b"".join(attributes[middle:])
        + zeros
        + b"".join(events)
    )


def _decoded(raw: bytes) -> str:
    """`span_from_wire`'s span and what it counted, or the problem it raised, as a repr: it tells NaN
    from NaN as equal, and -0.0 from 0.0 and 1 from 1.0 as different, which == does not."""
    problems = DecodedBatch()
    try:
        span = otlp_protobuf.span_from_wire(WireSpan(TENANT, TRACE, None, 0, raw, {}), problems)
    except InvalidValue as problem:  # e.g. two vector lengths: screening would have refused the span
        return repr((problem.reason, str(problem)))
    return repr((span, list(span.attributes), problems.rejections, problems.drops, problems.dropped_keys))


def _decode_with_real_classes(monkeypatch: pytest.MonkeyPatch, spans: list[bytes]) -> list[str]:
    with monkeypatch.context() as patched:
        patched.setattr(otlp_protobuf, "LazySpan", PbSpan)
        patched.setattr(otlp_protobuf, "SpanArrays", lambda span, raw: None)  # arrays re-encoded
        return [_decoded(raw) for raw in spans]


def test_spans_built_from_lazy_arrays_equal_the_real_classes(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(32)
    spans = [_random_span(rng) for _ in range(400)]
    assert all(PbSpan.FromString(raw) for raw in spans)  # each parses: screening would take it
    exact: list[bool] = []
    real_is_exact = otlp_protobuf.SpanArrays._is_exact

    def counted(self: Any) -> bool:
        if self._exact is None:
            exact.append(real_is_exact(self))
        return real_is_exact(self)

    found: list[bool] = []
    real_array_bytes = lazy_arrays.array_bytes

    def walked(wire: bytes, key_value: tuple[int, int]) -> bytes | None:
        array = real_array_bytes(wire, key_value)
        found.append(array is not None)
        return array

    monkeypatch.setattr(otlp_protobuf.SpanArrays, "_is_exact", counted)
    monkeypatch.setattr(lazy_arrays, "array_bytes", walked)
    lazy = [_decoded(raw) for raw in spans]
    assert lazy == _decode_with_real_classes(monkeypatch, spans)
    # every way of reading an array was taken: from the lazy parse (spans that re-encode to their
    # bytes), from the span's bytes (the rest), and through the real classes (a field given twice)
    assert exact.count(True) >= 80 and exact.count(False) >= 80, (exact.count(True), exact.count(False))
    assert found.count(True) >= 30 and found.count(False) >= 10, (found.count(True), found.count(False))
    assert sum(out.startswith("(<RejectReason") for out in lazy) >= 5  # some refused (two lengths)


@pytest.mark.parametrize(
    "value",
    [
        _array(list(range(3))).SerializeToString(),
        _array([0.5] * 600).SerializeToString(),
    ],
    ids=["ints", "doubles"],
)
def test_an_array_given_twice_is_merged_as_the_real_parser_merges_it(value: bytes) -> None:
    """A span that is exact but for one array field given twice: the lazy parse keeps only the
    second, the decoded span holds both (read from the span's bytes through the real classes)."""
    key_value = field(1, b"embedding.embeddings.0.embedding.vector") + field(
        2, field(5, value) + field(5, value)
    )
    raw = (
        PbSpan(trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN_ID), name="s").SerializeToString()
        + PbSpan(start_time_unix_nano=1, end_time_unix_nano=2).SerializeToString()
        + field(9, key_value)
    )
    lazy_items = LazySpan.FromString(raw).attributes[0].value.array_value
    assert lazy_items == value  # the lazy class kept the last one only
    real = PbSpan.FromString(raw).attributes[0].value.array_value
    span = otlp_protobuf.span_from_wire(WireSpan(TENANT, TRACE, None, 0, raw, {}), DecodedBatch())
    vector = span.attributes["embedding.embeddings.0.embedding.vector"]
    assert len(vector) == 2 * len(ArrayValue.FromString(value).values) == len(real.values)


def test_lazy_span_keeps_the_oneof_rule_and_every_other_field() -> None:
    """What `LazySpan` is trusted for without a check: which member of the value's oneof is set
    (the last given, array or not), and every field that is not an array, equal to the real parse."""
    rng = random.Random(7)
    for _ in range(200):
        raw = _random_span(rng)
        lazy, real = LazySpan.FromString(raw), PbSpan.FromString(raw)
        for lazy_pair, real_pair in zip(lazy.attributes, real.attributes, strict=True):
            assert lazy_pair.key == real_pair.key
            which = real_pair.value.WhichOneof("value")
            assert lazy_pair.value.WhichOneof("value") == which
            if which not in ("array_value", "kvlist_value"):
                assert getattr(lazy_pair.value, which or "string_value") == getattr(
                    real_pair.value, which or "string_value"
                )
        assert (lazy.name, lazy.kind, lazy.start_time_unix_nano, len(lazy.events)) == (
            real.name,
            real.kind,
            real.start_time_unix_nano,
            len(real.events),
        )


def test_mutations_of_the_exactness_check_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trusting every lazy parse (no check), or reading a map's values lazily in a span that is not
    exact, changes some decoded span: the equivalence test above would fail."""
    rng = random.Random(32)
    spans = [_random_span(rng) for _ in range(400)]
    expected = _decode_with_real_classes(monkeypatch, spans)
    mutations: list[Callable[[], None]] = [
        lambda: monkeypatch.setattr(otlp_protobuf.SpanArrays, "_is_exact", lambda self: True),
        lambda: monkeypatch.setattr(
            otlp_protobuf.SpanArrays, "value", lambda self, event, index, value: value
        ),
    ]
    for mutate in mutations:
        with monkeypatch.context():
            mutate()
            assert [_decoded(raw) for raw in spans] != expected
        monkeypatch.undo()


def test_a_span_the_walk_cannot_follow_is_read_from_its_re_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown group (a wire type OTLP never uses, which the parser skips) stops the walk through the
    span's bytes; an array given twice in that span is then read from the real classes' re-encoding."""
    group = tag(20, 3) + tag(1, 0) + varint(5) + tag(20, 4)
    array = _array([1.5, 2.5]).SerializeToString()
    key_value = field(1, KEYS[0].encode()) + field(2, field(5, array) + field(5, array))
    raw = (
        PbSpan(
            trace_id=bytes.fromhex(TRACE), span_id=bytes.fromhex(SPAN_ID), name="s", start_time_unix_nano=1
        ).SerializeToString()
        + PbSpan(end_time_unix_nano=2).SerializeToString()
        + group
        + field(9, key_value)
    )
    assert len(PbSpan.FromString(raw).attributes[0].value.array_value.values) == 4
    canonical: list[bytes] = []
    real_walk = lazy_arrays.field_ranges

    def walk(message: bytes, start: int, end: int, number: int) -> list[tuple[int, int]]:
        canonical.append(message)
        return real_walk(message, start, end, number)

    monkeypatch.setattr(lazy_arrays, "field_ranges", walk)
    decoded = _decoded(raw)
    assert "[1.5, 2.5, 1.5, 2.5]" in decoded
    known = PbSpan.FromString(raw)
    known.DiscardUnknownFields()
    assert canonical == [raw, known.SerializeToString()]  # the walk, then its fallback
    assert decoded == _decode_with_real_classes(monkeypatch, [raw])[0]


def test_screening_a_long_vector_in_a_span_the_walk_cannot_follow() -> None:
    """Screening (the real classes) reads a long vector from its span's bytes; where an unknown group
    stops that walk it reads it from the span's re-encoding without unknown fields, and the span
    passes, its vector whole."""
    group = tag(20, 3) + tag(1, 0) + varint(5) + tag(20, 4)
    numbers = [i / 7 for i in range(otlp_protobuf.WIRE_SLICE_MIN_ITEMS + 8)]
    key_value = field(1, KEYS[0].encode()) + field(
        2, AnyValue(array_value=_array(numbers)).SerializeToString()
    )
    raw = (
        PbSpan(
            trace_id=bytes.fromhex(TRACE),
            span_id=bytes.fromhex(SPAN_ID),
            name="s",
            start_time_unix_nano=1,
            end_time_unix_nano=2,
        ).SerializeToString()
        + group
        + field(9, key_value)
    )
    body = field(1, field(2, field(2, raw)))  # request.resource_spans[0].scope_spans[0].spans[0]
    batch = otlp_protobuf.screen_protobuf(body, TENANT)
    assert batch.rejected_spans == 0 and len(batch.spans) == 1
    span = otlp_protobuf.span_from_wire(batch.spans[0], DecodedBatch())  # type: ignore[arg-type]
    assert span.attributes[KEYS[0]] == numbers
