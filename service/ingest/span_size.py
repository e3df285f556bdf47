"""How much one span may weigh, and how ingest makes an oversize one fit: its longest text is truncated.

Distributed ingest publishes a trace's spans to the spans topic, and the
broker refuses a record over its `message.max.bytes` (`kafka.max_record_bytes`,
1,000,000 by default); one oversize span once cost its whole request a 413,
which OTel exporters do not retry. So every mode holds every span to the same
limit, and the same bytes give the same outcome embedded and distributed:

==========================  ===========  =======================================
limit                       value        what is held to it
==========================  ===========  =======================================
`MAX_SPAN_BYTES`            900,000      a span's (or a GenAI log event's) wire
                                         size: its attributes and its events'
`MAX_RESOURCE_BYTES`        65,536       a resource's wire size (it travels with
                                         every record of its spans)
`MIN_RECORD_BYTES`          966,560      the least `kafka.max_record_bytes` may
                                         be: a span, its resource and framing
==========================  ===========  =======================================

A span over its limit keeps all of its fields; its longest text values (strings
and bytes of its attributes and its events' attributes, also inside kvlists
and arrays, identifiers excepted) are cut to one common length, the longest that makes the span fit ("water
filling": two 600 KB answers keep 450 KB each rather than one of them losing
everything). A cut value ends with `truncation_note`, which says how many bytes
it had; the span lists the keys it cut under `ragmon.truncated`; each cut value
is counted (`ragmon_ingest_truncated_values_total`) and named in the OTLP
answer. A span that cannot fit even with all of its text cut (tens of
thousands of attributes, huge arrays) is rejected alone, `span_too_large`.

Checking costs nothing on the common path: a protobuf span's wire size is
known from screening (`len(raw)`), and a decoded span's `size_bytes` estimate
is compared first; only a span near the limit is encoded to be measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from service.conventions.attributes import is_identifier
from service.conventions.spans import Attributes, AttrValue, LogEvent, Span
from service.ingest.decoded import DROPPED_KEY, TRUNCATED_KEY, DecodedBatch, mark
from service.ingest.otlp_encode import event_bytes, resource_bytes, span_bytes

__all__ = [
    "MAX_RESOURCE_BYTES",
    "MAX_SPAN_BYTES",
    "MIN_RECORD_BYTES",
    "cut_to_fit",
    "fit_event",
    "fit_resource",
    "fit_span",
    "truncation_note",
]

MAX_SPAN_BYTES = 900_000
MAX_RESOURCE_BYTES = 65_536
# a record holds one span at the least, its resource, and the framing of both (a few dozen bytes)
MIN_RECORD_BYTES = MAX_SPAN_BYTES + MAX_RESOURCE_BYTES + 1_024
# The most a note adds to a cut value: the note for a 13-digit size (a body is at most GiBs).
_NOTE_BYTES = len(" …[truncated by ragmon from 1,000,000,000,000 bytes]".encode())
# Rounds of cutting: the marker and protobuf's length prefixes make the first estimate a few bytes off.
_ROUNDS = 3


def truncation_note(original_bytes: int) -> str:
    """What a truncated text value ends with."""
    return f" …[truncated by ragmon from {original_bytes:,} bytes]"


# A text value and where it sits: (its dict or list, its key or index, its name, its size in bytes).
_Text = tuple[dict[str, AttrValue] | list[AttrValue], str | int, str, int]
# How deep into kvlists and arrays text is looked for (the decoder's walk goes as deep as Python's
# recursion: past this, a value is left as it is, and a span that then cannot fit is rejected).
_MAX_DEPTH = 32
_MARKERS = frozenset({DROPPED_KEY, TRUNCATED_KEY})


def _size(value: str | bytes) -> int:
    return len(value.encode()) if isinstance(value, str) else len(value)


def _texts(value: AttrValue, name: str, found: list[_Text], depth: int = 0) -> None:
    """The text values inside a kvlist or an array (a GenAI event's message content is nested)."""
    if depth > _MAX_DEPTH:
        return
    slots: Iterable[tuple[str | int, AttrValue]]
    if isinstance(value, dict):
        slots = value.items()
    elif isinstance(value, list):
        slots = enumerate(value)
    else:
        return
    for slot, item in slots:
        if isinstance(item, str | bytes):
            found.append((value, slot, f"{name}.{slot}", _size(item)))
        else:
            _texts(item, f"{name}.{slot}", found, depth + 1)


def cut_to_fit(dicts: Sequence[Attributes], excess: int) -> list[tuple[str, int]] | None:
    """Cut the longest text values of `dicts` (in place) to one common length, so that together they
    are at least `excess` bytes (UTF-8) shorter, their notes and their names in the span's marker
    (`TRUNCATED_KEY`) included; returns (key, bytes before) of each
    value cut, or None, cutting nothing, when cutting them all to nothing would not be enough.

    Text inside kvlists and arrays counts too, named by its path (`message.content`); identifiers
    (`attributes.is_identifier`) are never cut: a cut id would name something else."""
    texts: list[_Text] = []
    for attributes in dicts:
        for key, value in attributes.items():
            if key in _MARKERS:
                continue
            if isinstance(value, str | bytes):
                if not is_identifier(key):
                    texts.append((attributes, key, key, _size(value)))
            else:
                _texts(value, key, texts)

    # a cut value costs its note, and its name in the span's marker (a few bytes of framing each)
    costs = [_NOTE_BYTES + len(name.encode()) + 4 for _, _, name, _ in texts]

    def saving(cap: int) -> int:
        return sum(
            size - cap - cost for (*_, size), cost in zip(texts, costs, strict=True) if size > cap + cost
        )

    if excess <= 0:
        return []
    if saving(0) < excess:
        return None
    low, high = 0, max(size for *_, size in texts)
    while low < high:  # the largest common length that still saves enough
        middle = (low + high + 1) // 2
        if saving(middle) >= excess:
            low = middle
        else:
            high = middle - 1
    cut: list[tuple[str, int]] = []
    for (container, slot, name, size), cost in zip(texts, costs, strict=True):
        if size > low + cost:
            value = container[slot]  # type: ignore[index]
            note = truncation_note(size)
            if isinstance(value, str):
                # cut on a character boundary: a partial UTF-8 sequence at the end is left out
                container[slot] = value.encode()[:low].decode("utf-8", "ignore") + note  # type: ignore[index]
            elif isinstance(value, bytes):
                container[slot] = value[:low] + note.encode()  # type: ignore[index]
            cut.append((name, size))
    return cut


def _fit(
    measure: Callable[[], int],
    dicts: Sequence[Attributes],
    marked: Attributes,
    limit: int,
    batch: DecodedBatch,
    where: str,
) -> int | None:
    """Cut text values of `dicts` until `measure()` is within `limit`, marking `marked`; returns the new
    size (the old one when it fitted already), or None when it cannot fit."""
    size = measure()
    for _ in range(_ROUNDS):
        if size <= limit:
            return size
        cut = cut_to_fit(dicts, size - limit + 64)  # 64: the marker's key and framing
        if not cut:
            return None
        for key, original in cut:
            batch._truncate(
                f"{where}: {key} of {original:,} bytes was truncated to fit the {limit:,}-byte limit",
                where,
                key,
            )
        mark(marked, TRUNCATED_KEY, (key for key, _ in cut))
        size = measure()
    return size if size <= limit else None


def fit_span(span: Span, batch: DecodedBatch, where: str) -> int | None:
    """Make `span` fit `MAX_SPAN_BYTES` (see the module docstring); its new wire size, or None when it
    cannot fit."""
    dicts = [span.attributes, *(event.attributes for event in span.events)]
    return _fit(lambda: len(span_bytes(span)), dicts, span.attributes, MAX_SPAN_BYTES, batch, where)


def fit_event(event: LogEvent, batch: DecodedBatch, where: str) -> int | None:
    """The same for a GenAI event sent as a log record (it travels as its own item of the spans topic)."""
    return _fit(
        lambda: len(event_bytes(event)), [event.attributes], event.attributes, MAX_SPAN_BYTES, batch, where
    )


def fit_resource(resource: Attributes, batch: DecodedBatch, where: str) -> int | None:
    """The same for a resource, to `MAX_RESOURCE_BYTES`."""
    return _fit(lambda: len(resource_bytes(resource)), [resource], resource, MAX_RESOURCE_BYTES, batch, where)
