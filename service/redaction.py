"""`Redactor`: personal data and secrets taken out of every field ragmon keeps, before anything keeps it.

Optional (`redaction.enabled`). When on, every trace (from spans, GenAI log events or the JSON API)
passes here right after assembly, and feedback, reviewers' labels and notes, traces sent for review
and golden sets as they arrive, so what is stored, judged, exported, shown to reviewers, reported
and exported as a metric label never holds the redacted text. Spans and GenAI log events are
redacted before that, where ingest decodes them (service/ingest/span_redaction.py), so the open-trace
buffer, the span archive that completes a stored trace with its late spans (`trace_spans`) and the
spans topic hold them redacted too, by rules that make the trace built from redacted spans, once
redacted here, the trace built from the raw ones and redacted here, field by field. Each match becomes
`[REDACTED:<kind>]` and is counted in `ragmon_redactions_total{kind}` (where it was found: in a
span, or in a record).

Which fields, and how each is redacted (free text, an id with a keyed digest, a JSON object, or
kept): `FIELDS` in redaction_fields.py is the one list, re-exported here; `Redactor.record` applies it.

A chunk that came without an id is named by a hash of its text (`sha256:...`,
conventions/content.py): of its redacted text, as redacted spans name it (the hash of the raw text
would also let a guess of the text be confirmed).

Built-in kinds (all on by default when enabled; `redaction.builtin` picks):

  ========  ====================================================================
  email     an e-mail address
  phone     a phone number: 8 to 15 digits written as one (a leading +, groups
            split by spaces or parentheses, or 10+ digits with dashes or dots);
            dates are left alone
  card      13 to 19 digits (spaces or dashes between groups) that pass the
            Luhn check, so order numbers and timestamps are left alone
  api_key   key-like tokens: `sk-...`, `sk_live_...`, `AKIA...`, `ghp_...`,
            `xox[abpr]-...`, and what follows `Bearer ` in a text
  ========  ====================================================================

`redaction.patterns` adds named regexes of your own. The kinds run in order, each over what the
ones before it left, and again until none finds more (a mark can start a match: in
`4111 1111 1111 1111sk-proj-...` the key is one only once the card number is a mark); the marks
written are never redacted again, so redacting is idempotent (a reviewer's expected chunk ids are
the redacted ones they were shown). `Redactor.edits` says where each replacement goes, so that
span redaction can redact the text inside a JSON string and leave its escapes as they were.
What is *not* covered: the write-ahead log holds requests as received until they are stored
(transient), and the Phoenix tee forwards the raw OTLP request, so the configuration refuses
redaction together with the tee.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from service.config import RagmonConfig, RedactionConfig
from service.consumer import TraceConsumer
from service.conventions.content import CONTENT_ID_PREFIX, content_id
from service.metrics import Metrics
from service.model import Chunk, Feedback, RagTrace
from service.redaction_fields import FIELDS, ROOT_RECORDS, FieldKind, FieldRule, fields_table

__all__ = [
    "BUILTIN",
    "FIELDS",
    "ROOT_RECORDS",
    "FieldRule",
    "RedactingFilter",
    "Redactor",
    "fields_table",
    "redaction_key",
]

R = TypeVar("R")


def _luhn(digits: str) -> bool:
    total = 0
    for i, char in enumerate(reversed(digits)):
        n = int(char)
        if i % 2:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card(match: re.Match[str]) -> bool:
    digits = re.sub(r"\D", "", match.group(0))
    return 13 <= len(digits) <= 19 and _luhn(digits)


def _phone(match: re.Match[str]) -> bool:
    text = match.group(0)
    digits = len(re.sub(r"\D", "", text))
    if not 8 <= digits <= 15 or _DATE.fullmatch(text.strip()):
        return False
    # a number written as one: international (+), in groups with spaces or parentheses, or 10+ digits
    return text.startswith("+") or " " in text or "(" in text or digits >= 10


_DATE = re.compile(r"\d{4}[-./]\d{1,2}[-./]\d{1,2}|\d{1,2}[-./]\d{1,2}[-./]\d{2,4}")


# kind -> (pattern, a check a match must pass as well); order matters: cards before phones
BUILTIN: dict[str, tuple[re.Pattern[str], Callable[[re.Match[str]], bool] | None]] = {
    "email": (re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"), None),
    "api_key": (
        re.compile(
            r"(?:\bsk[-_](?:live_|test_|proj-)?[A-Za-z0-9_-]{16,}|\bAKIA[0-9A-Z]{16}\b|\bghp_[A-Za-z0-9]{30,}"
            r"|\bxox[abpr]-[A-Za-z0-9-]{10,}|(?<=Bearer )[A-Za-z0-9._~+/-]{16,}=*)"
        ),
        None,
    ),
    "card": (re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)"), _card),
    "phone": (re.compile(r"(?<![\w+])\+?\(?\d[\d .()-]{6,18}\d(?!\w)"), _phone),
}


def _digit_count(text: str) -> int:
    """ASCII digits in `text`; a text with any other character counts as all digits (a built-in kind's
    `\\d` matches every script's digits)."""
    return sum(map(text.count, "0123456789")) if text.isascii() else len(text)


# What a built-in kind's match can begin or end with: a round can only start a match that a mark touches
# (every built-in kind looks one character around a match, no more, but for "Bearer ", which a mark only
# takes away), so a round whose marks touch none of these is the last.
_WORDISH = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_+(.%=-")


def _next_to_a_mark(value: str, edits: Sequence[Edit]) -> bool:
    """Whether a character that a match can begin or end with sits right beside one of the edits."""
    for start, end, _ in edits:
        before, after = value[start - 1 : start], value[end : end + 1]
        if (before and (before in _WORDISH or not before.isascii())) or (
            after and (after in _WORDISH or not after.isascii())
        ):
            return True
    return False


_API_KEY_HINT = re.compile(r"sk[-_]|AKIA|ghp_|xox[abpr]-|Bearer ")
# What a text must hold for a built-in kind to match in it, checked before its regex (a fraction of
# its cost): (the text, its digits) -> whether the kind's regex may match.
_HINTS: dict[str, Callable[[str, int], bool]] = {
    "email": lambda text, _: "@" in text,
    "api_key": lambda text, _: _API_KEY_HINT.search(text) is not None,
    "card": lambda _, digits: digits >= 13,
    "phone": lambda _, digits: digits >= 8,
}

_Rule = tuple[str, re.Pattern[str], Callable[[re.Match[str]], bool] | None, Callable[[str, int], bool] | None]

# A mark this module wrote; the text between marks is what is still to redact. The digest is 16
# letters a-p (hex shifted), so no built-in kind ever matches inside a mark.
_MARKS = re.compile(r"\[REDACTED:([^\[\]:]+)(?::([a-p]{16}))?\]")
# rounds of redaction after the first: one more is all the built-in kinds ever need
_MAX_ROUNDS = 8
_DIGEST_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")
_KEY_FILE = "redaction.key"


def redaction_key(config: RagmonConfig) -> bytes:
    """The key of the digests in redacted ids: `redaction.key`, else one kept in the data directory
    (made on first use, readable by its owner only). Distributed mode requires the setting, so every
    process redacts an id alike (`RagmonConfig` refuses it unset)."""
    if config.redaction.key is not None:
        return config.redaction.key.get_secret_value().encode()
    path = Path(config.data_dir) / _KEY_FILE
    try:
        return path.read_bytes().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32).encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: use theirs
        return path.read_bytes().strip()
    with os.fdopen(fd, "wb") as out:
        out.write(key)
    return key


Edit = tuple[int, int, str]
"""A replacement in a string: (start, end, what replaces value[start:end])."""


def apply_edits(value: str, edits: Sequence[Edit]) -> str:
    """`value` with `edits` (in order, not overlapping) made."""
    if not edits:
        return value
    parts: list[str] = []
    end = 0
    for start, stop, replacement in edits:
        parts += (value[end:start], replacement)
        end = stop
    parts.append(value[end:])
    return "".join(parts)


# A piece of text being redacted: (its text now, where it was in the original: start, end, whether it
# is a mark this redaction wrote)
_Segment = tuple[str, int, int, bool]


class _Overlap(Exception):
    """A pattern matched across a mark written earlier (only a custom pattern can)."""


def _replace(
    text: str,
    pattern: re.Pattern[str],
    check: Callable[[re.Match[str]], bool] | None,
    mark: Callable[[str], str],
) -> tuple[str, int]:
    """`text` with the matches that pass `check` replaced by `mark(match)`, and how many there were
    (an empty match replaces nothing)."""
    parts: list[str] = []
    end = count = 0
    for match in pattern.finditer(text):
        if match.end() > match.start() and (check is None or check(match)):
            parts += (text[end : match.start()], mark(match.group(0)))
            end = match.end()
            count += 1
    return ("".join(parts) + text[end:], count) if count else (text, 0)


def _replaced(
    segments: list[_Segment], matches: Sequence[re.Match[str]], mark: Callable[[str], str]
) -> list[_Segment]:
    """`segments` with each match (in their joined text, in order) replaced by its mark; raises
    `_Overlap` for a match that takes in part of a mark."""
    out: list[_Segment] = []
    index = 0
    position = 0
    for text, origin, origin_end, is_mark in segments:
        begin, stop = position, position + len(text)
        position = stop
        if is_mark:
            if index < len(matches) and matches[index].start() < stop:
                raise _Overlap
            out.append((text, origin, origin_end, is_mark))
            continue
        cut = 0
        while index < len(matches) and matches[index].start() < stop:
            match = matches[index]
            if match.end() > stop:
                raise _Overlap
            a, b = match.start() - begin, match.end() - begin
            if a > cut:
                out.append((text[cut:a], origin + cut, origin + a, False))
            out.append((mark(match.group(0)), origin + a, origin + b, True))
            cut = b
            index += 1
        if cut < len(text):
            out.append((text[cut:], origin + cut, origin_end, False))
    return out


class Redactor:
    """Replaces every match of the configured kinds, in a text, an id, or a record field by field
    (`FIELDS`), counting each by kind: in `metrics`, or, without, in `counts` (a worker process's
    redactor, whose counts its caller adds to the metrics)."""

    def __init__(self, config: RedactionConfig, metrics: Metrics | None, key: bytes | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.counts: Counter[str] = Counter()
        self._key = key if key is not None else secrets.token_bytes(32)
        # (kind, its regex, a check a match must pass, what a text must hold for the regex to match)
        self._rules: list[_Rule] = [
            (kind, *BUILTIN[kind], _HINTS[kind]) for kind in BUILTIN if kind in config.builtin
        ]
        self._rules += [(name, re.compile(pattern), None, None) for name, pattern in config.patterns.items()]
        # with the built-in kinds alone, a text none of them can match is known at once
        self._hinted = not config.patterns

    def _may_match(self, value: str, keyed: bool) -> bool:
        """Whether a built-in kind may match in `value` (or, unkeyed, a keyed mark lose its digest)."""
        if not keyed and "[REDACTED:" in value:
            return True
        digits = _digit_count(value)
        return any(hint is not None and hint(value, digits) for _, _, _, hint in self._rules)

    def _count(self, kind: str, n: int) -> None:
        if self.metrics is not None:
            self.metrics.redactions.labels(kind=kind).inc(n)
        else:
            self.counts[kind] += n

    def edits(self, value: str, keyed: bool) -> list[Edit]:
        """What redacting `value` replaces, as edits of `value` itself: each match by its mark (keyed:
        `[REDACTED:<kind>:<digest>]`, else `[REDACTED:<kind>]`), and, unkeyed, each keyed mark in it by
        the mark without its digest (free text never carries a digest). Marks are never redacted again;
        the kinds run in order over the text between them, each over what the ones before it left, and
        again until none finds more (a mark can start a match: `...1111sk-proj-...` is a key only once
        the card number before it is a mark), so that redacting is idempotent.

        Knowing where each replacement sits lets a caller redact the text inside an encoding (a JSON
        string with escapes) and keep the rest of the encoding as it was (service/ingest/span_redaction.py);
        where a second round found more, the one edit replaces the whole text."""
        if not value or (self._hinted and not self._may_match(value, keyed)):
            return []
        edits = self._round(value, keyed)
        if not edits or (self._hinted and not _next_to_a_mark(value, edits)):
            return edits
        redacted = again = apply_edits(value, edits)
        for _ in range(_MAX_ROUNDS):
            more = self._round(again, keyed)
            if not more:
                break
            again = apply_edits(again, more)
        return edits if again is redacted else [(0, len(value), again)]

    def _round(self, value: str, keyed: bool) -> list[Edit]:
        """One round of `edits`: every kind once over the text between the marks."""
        edits: list[Edit] = []
        end = 0
        for found in _MARKS.finditer(value):
            edits += self._piece_edits(value, end, found.start(), keyed)
            if not keyed and found.group(2):
                edits.append((found.start(), found.end(), f"[REDACTED:{found.group(1)}]"))
            end = found.end()
        edits += self._piece_edits(value, end, len(value), keyed)
        return edits

    def _piece_edits(self, value: str, start: int, end: int, keyed: bool) -> list[Edit]:
        """The edits of the text between two marks: each kind replaces its matches in what the kinds
        before it left (their marks included, as the text they are)."""
        if start == end:
            return []
        piece = value[start:end]
        segments: list[_Segment] = [(piece, start, end, False)]
        counts: Counter[str] = Counter()
        digits = -1  # counted when a kind asks
        try:
            for kind, pattern, check, hint in self._rules:
                if hint is not None:
                    # a built-in kind needs what the piece lacks: its regex need not scan it (the piece
                    # only loses what the kinds before this one took)
                    if digits < 0:
                        digits = _digit_count(piece)
                    if not hint(piece, digits):
                        continue
                text = segments[0][0] if len(segments) == 1 else "".join(s[0] for s in segments)
                matches = [
                    m for m in pattern.finditer(text) if m.end() > m.start() and (check is None or check(m))
                ]
                if matches:
                    mark = self._keyed_mark(kind) if keyed else (lambda _, kind=kind: f"[REDACTED:{kind}]")
                    segments = _replaced(segments, matches, mark)
                    counts[kind] += len(matches)
        except _Overlap:
            return self._overlapping_edits(value, start, end, keyed)
        for kind, n in counts.items():
            self._count(kind, n)
        return [(s[1], s[2], s[0]) for s in segments if s[3]]

    def _overlapping_edits(self, value: str, start: int, end: int, keyed: bool) -> list[Edit]:
        """A custom pattern matched across a mark: the piece is redacted as one string, one edit."""
        piece = value[start:end]
        for kind, pattern, check, _ in self._rules:
            mark = self._keyed_mark(kind) if keyed else (lambda _, kind=kind: f"[REDACTED:{kind}]")
            piece, count = _replace(piece, pattern, check, mark)
            if count:
                self._count(kind, count)
        return [(start, end, piece)] if piece != value[start:end] else []

    def _redact(self, value: str, keyed: bool) -> str:
        return apply_edits(value, self.edits(value, keyed))

    def _keyed_mark(self, kind: str) -> Callable[[str], str]:
        def mark(found: str) -> str:
            digest = hmac.new(self._key, f"{kind}\x00{found}".encode(), hashlib.sha256).hexdigest()
            return f"[REDACTED:{kind}:{digest[:16].translate(_DIGEST_LETTERS)}]"

        return mark

    def text(self, value: str | None) -> str | None:
        """`value` with every match replaced by `[REDACTED:<kind>]`; None stays None."""
        return self._redact(value, keyed=False) if value else value

    def identifier(self, value: str | None) -> str | None:
        """`value` with every match replaced by `[REDACTED:<kind>:<digest>]`, the same for the same
        match everywhere; None stays None. A filter on a raw id finds the rows holding it redacted."""
        return self._redact(value, keyed=True) if value else value

    def _json(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.identifier(value)
        if isinstance(value, dict):
            return {self.identifier(k): self._json(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._json(v) for v in value]
        return value

    def _field(self, value: Any, kind: FieldKind) -> Any:
        if value is None:
            return None
        if kind == "json":
            return self._json(value)
        redact = self.text if kind == "text" else self.identifier
        if isinstance(value, str):
            return redact(value)
        if isinstance(value, tuple | list):
            return type(value)(redact(v) if isinstance(v, str) else v for v in value)
        return value

    def _nested(self, value: Any) -> Any:
        if isinstance(value, BaseModel) or dataclasses.is_dataclass(value):
            return self.record(value)
        if isinstance(value, tuple | list) and value and not isinstance(value[0], str | int | float):
            return type(value)(self._nested(v) for v in value)
        return value

    def record(self, record: R) -> R:
        """`record` (a `RagTrace`, `Feedback`, review or golden-set record: any class in `FIELDS`)
        with every field redacted as `FIELDS` says, nested records included.

        Raises TypeError for a record class that is not in `FIELDS`."""
        rules = FIELDS.get(type(record).__name__)
        if rules is None:
            raise TypeError(f"{type(record).__name__} is not in redaction.FIELDS: classify its fields there")
        if isinstance(record, BaseModel):
            names: Iterable[str] = type(record).model_fields
        else:
            names = [f.name for f in dataclasses.fields(record)]  # type: ignore[arg-type]
        update: dict[str, Any] = {}
        for name in names:
            rule = rules.get(name)
            if rule is not None and rule.kind == "kept":
                continue
            value = getattr(record, name)
            new = self._nested(value) if rule is None else self._field(value, rule.kind)
            if new is not value and new != value:
                update[name] = new
        if isinstance(record, Chunk) and _named_by_content(record):
            # a chunk that came without an id is named by a hash of its text: of the redacted text, as
            # built from redacted spans (a hash of the raw text would let a guess of it be confirmed)
            named = content_id(self._redact(record.content or "", keyed=True))
            if named != record.id:
                update["id"] = named
        if not update:
            return record
        if isinstance(record, BaseModel):
            return record.model_copy(update=update)
        return dataclasses.replace(record, **update)  # type: ignore[type-var]

    def trace(self, trace: RagTrace) -> RagTrace:
        """The trace with every field `FIELDS` lists redacted."""
        return self.record(trace)

    def traces(self, batch: Iterable[RagTrace]) -> list[RagTrace]:
        return [self.record(t) for t in batch]

    def feedback(self, batch: Iterable[Feedback]) -> list[Feedback]:
        """Feedback with every field `FIELDS` lists redacted."""
        return [self.record(f) for f in batch]


def _named_by_content(chunk: Chunk) -> bool:
    """Whether a chunk's id is the hash of its text (`conventions.content.content_id`)."""
    if not (chunk.content and chunk.id.startswith(CONTENT_ID_PREFIX)):
        return False
    try:
        return chunk.id == content_id(chunk.content)
    except UnicodeEncodeError:  # a lone surrogate (a JSON escape) hashes to nothing
        return False


class RedactingFilter:
    """Processor: traces in, the same traces redacted out to `next` (right after assembly)."""

    def __init__(self, redactor: Redactor, next: TraceConsumer) -> None:
        self.redactor = redactor
        self.next = next

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        await self.next.consume_traces(self.redactor.traces(batch))
