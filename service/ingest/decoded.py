"""`DecodedBatch`: what decoding one export request kept, refused, dropped and truncated.

The decoders (`otlp_protobuf.py`, `otlp_json.py`, `otlp_logs.py`) fill it; the receivers answer from it
(OTLP `partial_success`), count it (`ragmon_ingest_rejected_total{reason}`,
`ragmon_ingest_truncated_values_total`) and log a sample of it
(`drop_log.py`); the builder counts what it drops on a `DecodedBatch` too.

Three kinds of trouble, told apart because OTLP tells them apart:

* a rejected span (or log record) is counted in `rejected_spans` and by its
  reason in `rejections`;
* a dropped attribute value (the reasons in `labels.ATTRIBUTE_REASONS`) is
  counted in `rejections` only: its span is kept, and marked with the keys it
  lost (`DROPPED_KEY`);
* a truncated attribute value (text cut so that its span fits
  `span_size.MAX_SPAN_BYTES`) is counted in `truncated`: its span is kept,
  marked with the keys that were cut (`TRUNCATED_KEY`), and the text ends with
  a note saying how long it was.

`drops` keeps the first few dropped or truncated values as (where, attribute
key, reason): never a value, so that they can be logged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from service.conventions.attributes import RagmonAttributes
from service.conventions.spans import AnySpan, Attributes
from service.labels import ATTRIBUTE_REASONS, RejectReason

__all__ = ["DROPPED_KEY", "MAX_DETAILS", "MAX_MARKED", "TRUNCATED", "TRUNCATED_KEY", "DecodedBatch", "mark"]

MAX_DETAILS = 5
MAX_MARKED = 64
"""The most keys a span's `DROPPED_KEY` or `TRUNCATED_KEY` list names."""
DROPPED_KEY = RagmonAttributes.DROPPED
"""Added by ingest to a span (or log event) that lost attribute values: their keys."""
TRUNCATED_KEY = RagmonAttributes.TRUNCATED
"""Added by ingest to a span (or log event, or resource) whose text values were cut: their keys."""
TRUNCATED = "truncated"
"""The reason `drops` gives a truncated value (not a `RejectReason`: the value was kept, shortened)."""


@dataclass(slots=True)
class DecodedBatch:
    """The accepted spans of one export request and what was refused (see the module docstring).

    `rejections` maps a `RejectReason` value to a count (spans, or attribute
    values for `labels.ATTRIBUTE_REASONS`); `rejected_spans` is the OTLP
    `partial_success.rejected_spans`. `details` keeps the first few concrete
    problems for the error message. `dropped_keys` and `truncated_keys` are
    scratch lists: a span's decoder takes the keys its span added to them, to
    mark the span, and removes them.
    """

    spans: list[AnySpan] = field(default_factory=list)
    rejected_spans: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    truncated: int = 0
    drops: list[tuple[str, str, str]] = field(default_factory=list)
    dropped_keys: list[str] = field(default_factory=list)
    truncated_keys: list[str] = field(default_factory=list)
    # texts redacted in the spans, by kind (`span_redaction.py`, with redaction on)
    redactions: dict[str, int] = field(default_factory=dict)
    # what `rejected_spans` counts, for the message (the logs receiver counts log records)
    unit: ClassVar[str] = "spans"

    @property
    def accepted(self) -> int:
        """Spans (or log records) kept (`span_records.RecordBatch` counts those it encoded)."""
        return len(self.spans)

    @property
    def dropped(self) -> int:
        """Attribute values dropped (all the `ATTRIBUTE_REASONS` counts)."""
        return sum(n for reason, n in self.rejections.items() if reason in ATTRIBUTE_REASONS)

    @property
    def error_message(self) -> str:
        """One line for OTLP `partial_success.error_message`; empty when nothing was refused, dropped or
        truncated."""
        if not self.rejections and not self.truncated:
            return ""
        parts: list[str] = []
        if self.rejected_spans:
            span_counts = ", ".join(
                f"{reason}={n}"
                for reason, n in sorted(self.rejections.items())
                if reason not in ATTRIBUTE_REASONS
            )
            total = self.rejected_spans + self.accepted
            parts.append(f"rejected {self.rejected_spans} of {total} {self.unit} ({span_counts})")
        dropped_counts = {r: n for r, n in sorted(self.rejections.items()) if r in ATTRIBUTE_REASONS}
        dropped = sum(dropped_counts.values())
        if dropped:
            reasons = ", ".join(f"{reason}={n}" for reason, n in dropped_counts.items())
            parts.append(
                f"dropped {dropped} invalid attribute value{'s' if dropped != 1 else ''} ({reasons})"
            )
        if self.truncated:
            n = self.truncated
            parts.append(f"truncated {n} oversize attribute value{'s' if n != 1 else ''}")
        message = "; ".join(parts)
        if self.details:
            message += ": " + "; ".join(self.details)
        return message

    def _count(self, reason: RejectReason, detail: str, n: int = 1) -> None:
        self.rejections[reason.value] = self.rejections.get(reason.value, 0) + n
        if len(self.details) < MAX_DETAILS:
            self.details.append(detail)

    def _reject(self, reason: RejectReason, detail: str) -> None:
        self.rejected_spans += 1
        self._count(reason, detail)

    def _drop(self, reason: RejectReason, detail: str, where: str, key: str) -> None:
        """One attribute value dropped: counted, its key noted for the span's mark and the log."""
        self._count(reason, detail)
        self.dropped_keys.append(key)
        if len(self.drops) < MAX_DETAILS:
            self.drops.append((where, key, reason.value))

    def _truncate(self, detail: str, where: str, key: str) -> None:
        """One attribute value truncated: counted, its key noted for the span's mark and the log."""
        self.truncated += 1
        self.truncated_keys.append(key)
        if len(self.details) < MAX_DETAILS:
            self.details.append(detail)
        if len(self.drops) < MAX_DETAILS:
            self.drops.append((where, key, TRUNCATED))

    def absorb(self, other: DecodedBatch) -> None:
        """Add what `other` (a scratch batch of one span) counted to this batch: not its spans."""
        self.rejected_spans += other.rejected_spans
        for reason, n in other.rejections.items():
            self.rejections[reason] = self.rejections.get(reason, 0) + n
        self.truncated += other.truncated
        self.details.extend(other.details[: max(0, MAX_DETAILS - len(self.details))])
        self.drops.extend(other.drops[: max(0, MAX_DETAILS - len(self.drops))])


def mark(attributes: Attributes, marker: str, keys: Iterable[str]) -> None:
    """Add `keys` to the list of keys under `marker` (`DROPPED_KEY`, `TRUNCATED_KEY`), each once, at most
    `MAX_MARKED` of them (then "... and N more"): a span that lost 60,000 values must not grow by their
    names. A value the sender put there that is not a list of strings is replaced."""
    previous = attributes.get(marker)
    merged = dict.fromkeys(k for k in previous if isinstance(k, str)) if isinstance(previous, list) else {}
    merged.update(dict.fromkeys(keys))  # no list scans: a span may lose thousands
    names = list(merged)
    if len(names) > MAX_MARKED:
        names = [*names[: MAX_MARKED - 1], f"... and {len(names) - MAX_MARKED + 1} more"]
    attributes[marker] = names  # type: ignore[assignment]
