"""`SpanRedaction`: spans and GenAI log events redacted where ingest decodes them (`redaction.enabled`).

What ingest accepts is buffered by the span assembler, kept in the span archive (`trace_spans`) for
`assembler.late_window_s` so that late spans complete a stored trace, and published to the spans
topic in distributed mode. Redacting only the trace built from them (service/redaction.py) left all
of that as received. So with redaction on, the decoders (`IngestPool.decode`, `decode_logs`: in their
worker processes) redact every item they return, and everything after them (the buffer, the archive,
the topic, every build of a trace, the first and the late ones) sees the same redacted items. The
write-ahead log alone holds requests as received, until they are stored (docs/security.md).

The rule: every text an item carries is redacted as an id (`Redactor.identifier`: a keyed mark,
`[REDACTED:<kind>:<digest>]`): attribute values (inside lists and kvlists too), attribute keys, span
and event names, resource attributes, a log record's body. Except:

  ===============  ==========================================================================
  kept             `ragmon.probe.run_id` / `.question_id` (and `probe_run_id`,
                   `probe_question_id` in `metadata` or OpenLLMetry association
                   properties): the trace keeps them as given (redaction.FIELDS)
  hashed           the user id (`user.id`, `enduser.id`, `user_id` in `metadata` or an
                   association property): its hash (`conventions.user_hash`), all a trace keeps
  JSON             a text that is JSON (an object, array or string: what the builder
                   parses): each string in it redacted by this same rule, in place, its
                   escapes read and the rest of the text left as it was; a Python literal
                   (`str()` of a dict, which the builder also reads) is read and written back
  read as written  where the builder takes a text as it is (an id, a model, a chunk's text,
                   a message's content, `input.value` excepted), the whole text is redacted
                   as one, JSON or not, as the trace's redaction would
  metadata         `metadata` (a JSON object) is read and written back, by the rules above
  a filter         `ragmon.retrieval.filter` sent as a kvlist or list becomes the text the
                   builder makes of it (`filter_text`), redacted
  numbers          stay numbers, but an integer where the builder reads an id's text
                   (`session.id`, a document id, ...) that redaction changes becomes its
                   redacted digits; bytes are redacted when they are UTF-8 text
  ===============  ==========================================================================

Why a trace built from redacted items, then redacted (`RedactingFilter`), is the trace built from the
raw items, then redacted, field by field (tests/service/ingest/test_span_redaction.py checks it over
the captures of twelve real instrumentation libraries, a secret planted in every text they send):

* a keyed mark keeps two texts two and one text one, so every choice the builder makes by comparing
  texts (a payload's document with the attribute's, an embedded text with the question, nested
  retrievers' documents by content, duplicates by id) comes out the same, and so does every choice
  made by a closed set of names, a key or whether a value is there;
* the trace's redaction leaves an id's marks as they are and takes the digest out of a mark in free
  text (`Redactor.edits`), which is then the mark it writes itself;
* what the builder hashes is hashed alike: the user id (above), and a chunk that came without an id is
  named by the hash of its redacted text in both (`Redactor.record`).

Where it cannot be exact, the archive's side redacts more (listed in docs/security.md): a match that
only a JSON escape shows (`\\u0040`, or a phone number after `\\n`) in JSON the builder takes as it is;
a model name that held a match is priced by its redacted name (so it is unpriced); an id the marks
lengthen past 512 characters (`otlp.MAX_IDENTIFIER_CHARS`) or a Python-literal payload they lengthen
past 4 KiB is read as the builder reads those; a custom pattern that matches ragmon's own vocabulary
(role names, span kinds). Numbers in JSON and in attributes no reader takes as text stay as sent.

Redacting is idempotent (marks and hashed ids are left as they are), so a span logged again by the
write-ahead log (`wal.relog_after_s`) and replayed is redacted to the same bytes, and a span sent
twice is still kept once (the archive knows an item by its wire bytes). A protobuf span is decoded
to be redacted; one that changed travels re-encoded (`otlp_encode.span_bytes`), its dropped
attribute values counted in the answer, as for a span screening repaired (`otlp_protobuf._repaired`).

Cost: nothing with redaction off (the decoders never call this); on, about what a full decode of
each span costs, in the decoder processes (bench/RESULTS.md).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from openinference.semconv.resource import ResourceAttributes
from openinference.semconv.trace import RerankerAttributes, SpanAttributes

from service.config import RedactionConfig
from service.conventions.attribute_values import filter_text, parse_json
from service.conventions.attributes import (
    EMBEDDING_MODEL_KEYS,
    SDK_DEFAULT_SERVICE,
    GenAIAttributes,
    RagmonAttributes,
    TraceloopAttributes,
    attribute_kind,
)
from service.conventions.spans import AnySpan, Attributes, LogEvent, PackedSpan, Span, SpanEvent, WireSpan
from service.conventions.user_hash import hashed_user_id
from service.ingest import otlp_body, otlp_logs, otlp_protobuf
from service.ingest.decoded import DecodedBatch
from service.ingest.otlp_encode import span_bytes
from service.redaction import Edit, Redactor, apply_edits

__all__ = ["SpanRedaction"]

# JSON inside JSON inside ...: deeper than this, a text is redacted as plain text
_MAX_DEPTH = 8
# what the builder parses as a Python literal, at most (`attribute_values._LITERAL_LIMIT`)
_LITERAL_LIMIT = 4096
_JSON_HEADS = frozenset('{["')
# a JSON string token (valid JSON: every quote outside a string opens one)
_JSON_STRING = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"', re.DOTALL)
_KEY_CACHE_LIMIT = 65_536
# texts shorter than this are redacted again rather than looked up
_MEMO_MIN_CHARS = 64
_MARK = re.compile(r"\[REDACTED:([^\[\]:]+)(:[a-p]{16})?\]")

_Rule = Callable[["_ItemRedactor", Any], Any]


class SpanRedaction:
    """Redacts the spans and events decoders return (see the module docstring): picklable, so a
    decoder process gets it with each call (and keeps one per configuration)."""

    def __init__(self, config: RedactionConfig, key: bytes) -> None:
        self.builtin = tuple(config.builtin)
        self.patterns = tuple(config.patterns.items())
        self.key = key
        self.config = RedactionConfig(enabled=True, builtin=list(self.builtin), patterns=dict(self.patterns))
        # keys seen to need no redaction, and each key's rule: attribute keys repeat from span to span
        self.clean_keys: set[str] = set()
        self.rules: dict[tuple[int, str], _Rule] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restored, (self.builtin, self.patterns, self.key))

    def decode_traces(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int, packed: bool = False
    ) -> DecodedBatch:
        """`otlp_body.decode_body`, its spans redacted; `packed`: decoded spans come back as `PackedSpan`s
        (what a decoder process returns, service/ingest/pool.py)."""
        batch = otlp_body.decode_body(
            body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit
        )
        self.redact(batch)
        if packed:
            batch.spans = [PackedSpan.pack(span) if isinstance(span, Span) else span for span in batch.spans]
        return batch

    def decode_logs(
        self, body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int
    ) -> otlp_logs.DecodedLogs:
        """`otlp_logs.decode_logs_body`, its events redacted."""
        batch = otlp_logs.decode_logs_body(
            body, json_body=json_body, encoding=encoding, tenant=tenant, limit=limit
        )
        self.redact(batch)
        return batch

    def redact(self, batch: DecodedBatch) -> None:
        """Every item of `batch` redacted, in place; what was redacted is counted in `batch.redactions`
        (by kind), the attribute values decoding dropped in its rejections."""
        items = _ItemRedactor(self, Redactor(self.config, None, self.key))
        batch.spans = [items.item(item, batch) for item in batch.spans]
        for kind, n in items.redactor.counts.items():
            batch.redactions[kind] = batch.redactions.get(kind, 0) + n


@lru_cache(maxsize=8)
def _restored(builtin: tuple[str, ...], patterns: tuple[tuple[str, str], ...], key: bytes) -> SpanRedaction:
    config = RedactionConfig(enabled=True, builtin=list(builtin), patterns=dict(patterns))
    return SpanRedaction(config, key)


class _ItemRedactor:
    """The redaction of one batch: its redactor (and counts), and its resources, each redacted once
    and still shared by the items that shared it."""

    def __init__(self, owner: SpanRedaction, redactor: Redactor) -> None:
        self.owner = owner
        self.redactor = redactor
        self.resources: dict[int, tuple[Attributes, Attributes]] = {}
        self.memo: dict[tuple[str, bool], tuple[str, Counter[str]]] = {}

    # -- items

    def item(self, item: AnySpan, batch: DecodedBatch) -> AnySpan:
        if isinstance(item, WireSpan):
            return self.wire(item, batch)
        if isinstance(item, LogEvent):
            return self.event(item)
        if isinstance(item, PackedSpan):
            span = item.unpack()
            redacted = self.span(span)
            return item if redacted is span else PackedSpan.pack(redacted)
        return self.span(item)

    def wire(self, wire: WireSpan, batch: DecodedBatch) -> WireSpan:
        """A screened protobuf span, redacted: decoded, and re-encoded when that changed it."""
        scratch = DecodedBatch()
        span = otlp_protobuf.span_from_wire(wire, scratch)
        redacted = self.span(span)
        if redacted is span:
            resource = self.resource(wire.resource)
            return wire if resource is wire.resource else wire._replace(resource=resource)
        batch.absorb(scratch)  # the builder finds nothing left to drop in the re-encoded span
        raw = span_bytes(redacted)
        size = max(len(raw), wire.size_bytes + 2 * (len(raw) - len(wire.raw)))
        return WireSpan(wire.tenant, wire.trace_id, wire.parent_span_id, size, raw, redacted.resource)

    def span(self, span: Span) -> Span:
        name = self.identifier(span.name)
        attributes = self.attributes(span.attributes, _SPAN_RULES, span_attributes=True)
        events = self.events(span.events)
        resource = self.resource(span.resource)
        if (
            name is span.name
            and attributes is span.attributes
            and events is span.events
            and resource is span.resource
        ):
            return span
        return dataclasses.replace(span, name=name, attributes=attributes, events=events, resource=resource)

    def events(self, events: list[SpanEvent]) -> list[SpanEvent]:
        if not events:
            return events
        out = [
            SpanEvent(self.identifier(e.name), e.time_ns, self.attributes(e.attributes, _NO_RULES))
            for e in events
        ]
        if all(a.name is b.name and a.attributes is b.attributes for a, b in zip(out, events, strict=True)):
            return events
        return out

    def event(self, event: LogEvent) -> LogEvent:
        name = self.identifier(event.name)
        attributes = self.attributes(event.attributes, _NO_RULES)
        resource = self.resource(event.resource)
        if name is event.name and attributes is event.attributes and resource is event.resource:
            return event
        return dataclasses.replace(event, name=name, attributes=attributes, resource=resource)

    def resource(self, resource: Attributes) -> Attributes:
        done = self.resources.get(id(resource))
        if done is None:
            done = self.resources[id(resource)] = (resource, self.attributes(resource, _RESOURCE_RULES))
        return done[1]

    # -- attributes

    def attributes(
        self, attributes: Attributes, rules: dict[str, _Rule], *, span_attributes: bool = False
    ) -> Attributes:
        """The attributes redacted, each by its key's rule (the module docstring); the same dict when
        nothing changed."""
        out: Attributes = {}
        changed = False
        for key, value in attributes.items():
            new = self.rule(key, rules, span_attributes)(self, value)
            new_key = self.key(key)
            changed = changed or new is not value or new_key is not key
            out[new_key] = new
        return out if changed else attributes

    def rule(self, key: str, rules: dict[str, _Rule], span_attributes: bool) -> _Rule:
        """The rule of an attribute key (kept per key: keys repeat from span to span)."""
        resolved = self.owner.rules
        found = resolved.get((id(rules), key))
        if found is None:
            found = rules.get(key) or (_span_rule(key) if span_attributes else None)
            if found is None:
                # a number, count or vector (decoding checked it is one), else any value
                found = _kept if attribute_kind(key) is not None else _ItemRedactor.value
            if len(resolved) >= _KEY_CACHE_LIMIT:
                resolved.clear()
            resolved[(id(rules), key)] = found
        return found

    def key(self, key: str) -> str:
        clean = self.owner.clean_keys
        if key in clean:
            return key
        new = self.identifier(key)
        if new is key:
            if len(clean) >= _KEY_CACHE_LIMIT:
                clean.clear()
            clean.add(key)
        return new

    def value(self, value: Any) -> Any:
        """Any value (an attribute's, or inside a parsed payload), redacted: its texts by `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list | tuple | set | frozenset):
            items = [self.value(item) for item in value]
            if all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items if isinstance(value, list) else type(value)(items)
        if isinstance(value, dict):
            pairs = [(self.key(k) if isinstance(k, str) else k, self.value(v)) for k, v in value.items()]
            if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, value.items(), strict=True)):
                return value
            return dict(pairs)
        if isinstance(value, bytes):
            try:
                text = value.decode()
            except UnicodeDecodeError:
                return value
            redacted = self.identifier(text)
            return value if redacted is text else redacted.encode()
        return value

    # -- texts

    def identifier(self, text: str) -> str:
        """The whole text redacted as one id (keyed marks); the same object when nothing matched."""
        return self._memo(text, True)

    def text(self, text: str) -> str:
        """A text redacted, JSON in it string by string (the module docstring); the same object when
        nothing matched."""
        return self._memo(text, False)

    def _memo(self, text: str, whole: bool) -> str:
        """A text of this batch redacted once: the question and the documents recur in span after span.
        A text seen again counts its redactions again (the marks it gained), as a first sight would."""
        if len(text) < _MEMO_MIN_CHARS:
            edits = self.redactor.edits(text, keyed=True) if whole else self.edits(text, 0)
            return apply_edits(text, edits) if edits else text
        found = self.memo.get((text, whole))
        if found is not None:
            redacted, marks = found
            if redacted == text:  # unchanged: this very object, so that its span is seen unchanged
                return text
            self.redactor.counts.update(marks)
            return redacted
        edits = self.redactor.edits(text, keyed=True) if whole else self.edits(text, 0)
        redacted = apply_edits(text, edits) if edits else text
        marks = (
            Counter(kind for kind, _ in _MARK.findall(redacted))
            - Counter(kind for kind, _ in _MARK.findall(text))
            if edits
            else Counter()
        )
        self.memo[(text, whole)] = (redacted, marks)
        return redacted

    def edits(self, text: str, depth: int) -> list[Edit]:
        stripped = text.strip()
        if stripped[:1] in _JSON_HEADS and depth < _MAX_DEPTH:
            try:
                json.loads(stripped)
            except (ValueError, RecursionError):
                if stripped[0] != '"' and len(stripped) <= _LITERAL_LIMIT:
                    return self.literal_edits(text, stripped)
            else:
                return self.json_edits(text, depth)
        return self.redactor.edits(text, keyed=True)

    def json_edits(self, text: str, depth: int) -> list[Edit]:
        """The edits of each string of a JSON text, made where the string's characters are in the text."""
        out: list[Edit] = []
        for token in _JSON_STRING.finditer(text):
            raw = token.group(1)
            decoded: str = json.loads(f'"{raw}"') if "\\" in raw else raw
            inner = self.edits(decoded, depth + 1)
            if not inner:
                continue
            base = token.start(1)
            offsets = _offsets(raw) if decoded is not raw else None
            if offsets is not None and len(offsets) != len(decoded) + 1:  # not read as expected: whole
                out.append((base, token.end(1), _escaped(apply_edits(decoded, inner))))
                continue
            for start, end, replacement in inner:
                if offsets is not None:
                    start, end = offsets[start], offsets[end]
                out.append((base + start, base + end, _escaped(replacement)))
        return out

    def literal_edits(self, text: str, stripped: str) -> list[Edit]:
        """A Python literal (the builder reads one of up to 4 KiB): read, redacted, written back."""
        parsed = parse_json(stripped)
        if isinstance(parsed, str):  # not a literal either: plain text
            return self.redactor.edits(text, keyed=True)
        redacted = self.value(parsed)
        if redacted is parsed:
            return []
        start = len(text) - len(text.lstrip())
        return [(start, start + len(stripped), repr(redacted))]

    # -- the rules of particular attributes

    def as_written(self, value: Any) -> Any:
        """A text the builder takes as it is: redacted whole, as the trace's redaction will."""
        return self.identifier(value) if isinstance(value, str) else self.value(value)

    def id_text(self, value: Any) -> Any:
        """An id the builder reads as text, an integer as its digits."""
        if type(value) is int:
            digits = str(value)
            redacted = self.identifier(digits)
            return value if redacted is digits else redacted
        return self.as_written(value)

    def id_list(self, value: Any) -> Any:
        """A list of ids (a JSON list as text, or a string list, as `string_list` reads them)."""
        if isinstance(value, list):
            items = [self.id_text(item) for item in value]
            return value if all(a is b for a, b in zip(items, value, strict=True)) else items
        return self.value(value)

    def user_id(self, value: Any, *, blank_is_none: bool) -> Any:
        """A user id, hashed (`hashed_user_id`): a text (not blank, where `first_text` reads it) or
        an integer; anything else is no user id to the builder."""
        if isinstance(value, str):
            return hashed_user_id(value) if (value.strip() if blank_is_none else value) else value
        if type(value) is int:
            return hashed_user_id(str(value))
        return self.value(value)

    def service_name(self, value: Any) -> Any:
        """`service.name`: the SDK's default keeps its prefix, so the builder still sees no app name."""
        if isinstance(value, str) and value.startswith(SDK_DEFAULT_SERVICE):
            rest = value[len(SDK_DEFAULT_SERVICE) :]
            redacted = self.identifier(rest)
            return value if redacted is rest else SDK_DEFAULT_SERVICE + redacted
        return self.as_written(value)

    def filter(self, value: Any) -> Any:
        """`ragmon.retrieval.filter`: a kvlist or list is stored as the text the builder makes of it."""
        if isinstance(value, dict | list):
            text = filter_text(value)
            if text is not None:
                redacted = self.identifier(text)
                return value if redacted is text else redacted
        return self.as_written(value)

    def metadata(self, value: Any) -> Any:
        """OpenInference `metadata` (a JSON object, or a kvlist): read, each entry by its rule, written
        back as JSON (only ever parsed, never read as text)."""
        if isinstance(value, str):
            parsed = parse_json(value)
            if not isinstance(parsed, dict):
                return self.value(value)
        elif isinstance(value, dict):
            parsed = value
        else:
            return self.value(value)
        pairs = [(self.key(k) if isinstance(k, str) else k, self.meta_entry(k, v)) for k, v in parsed.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(pairs, parsed.items(), strict=True)):
            return value
        redacted = dict(pairs)
        if not isinstance(value, str):
            return redacted
        try:
            return json.dumps(redacted)
        except (TypeError, ValueError):  # a literal's bytes or tuple keys: a literal it stays
            return repr(redacted)

    def meta_entry(self, name: Any, value: Any) -> Any:
        """One entry of `metadata` or one OpenLLMetry association property (`_metadata_map` merges both)."""
        rule = _META_RULES.get(name) if isinstance(name, str) else None
        return rule(self, value) if rule is not None else self.value(value)


def _kept(_: _ItemRedactor, value: Any) -> Any:
    return value


def _offsets(raw: str) -> list[int]:
    """Where each character of a JSON string's text, read, starts in the text (and where it ends)."""
    out: list[int] = []
    index, end = 0, len(raw)
    while index < end:
        out.append(index)
        if raw[index] != "\\":
            index += 1
        elif raw[index + 1] != "u":
            index += 2
        else:
            code = int(raw[index + 2 : index + 6], 16)
            low = raw[index + 8 : index + 12] if raw.startswith("\\u", index + 6) else ""
            pair = 0xD800 <= code < 0xDC00 and len(low) == 4 and 0xDC00 <= int(low, 16) < 0xE000
            index += 12 if pair else 6
    out.append(end)
    return out


def _escaped(text: str) -> str:
    """`text` as the inside of a JSON string (a mark needs no escape; a written-back literal may)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


_META_RULES: dict[str, _Rule] = {
    "probe_run_id": _kept,
    "probe_question_id": _kept,
    "user_id": lambda r, v: r.user_id(v, blank_is_none=False),
    "session_id": _ItemRedactor.id_text,
    "intent": _ItemRedactor.id_text,
    "route": _ItemRedactor.id_text,
    "release": _ItemRedactor.id_text,
}
_SPAN_RULES: dict[str, _Rule] = {
    RagmonAttributes.PROBE_RUN_ID: _kept,
    RagmonAttributes.PROBE_QUESTION_ID: _kept,
    SpanAttributes.USER_ID: lambda r, v: r.user_id(v, blank_is_none=True),
    "enduser.id": lambda r, v: r.user_id(v, blank_is_none=True),
    SpanAttributes.SESSION_ID: _ItemRedactor.id_text,
    GenAIAttributes.CONVERSATION_ID: _ItemRedactor.id_text,
    RagmonAttributes.INTENT: _ItemRedactor.id_text,
    RagmonAttributes.RELEASE: _ItemRedactor.id_text,
    RagmonAttributes.CITED_CHUNK_IDS: _ItemRedactor.id_list,
    RagmonAttributes.RETRIEVAL_EXCLUDED_IDS: _ItemRedactor.id_list,
    RagmonAttributes.RETRIEVAL_FILTER: _ItemRedactor.filter,
    SpanAttributes.METADATA: _ItemRedactor.metadata,
    RerankerAttributes.RERANKER_QUERY: _ItemRedactor.as_written,
    **{
        key: _ItemRedactor.as_written
        for key in (
            SpanAttributes.LLM_MODEL_NAME,
            SpanAttributes.LLM_REQUEST_MODEL_NAME,
            SpanAttributes.LLM_RESPONSE_MODEL_NAME,
            RerankerAttributes.RERANKER_MODEL_NAME,
            *EMBEDDING_MODEL_KEYS,
            *TraceloopAttributes.FILTERS,
        )
    },
}
_RESOURCE_RULES: dict[str, _Rule] = {
    "service.name": _ItemRedactor.service_name,
    "service.version": _ItemRedactor.id_text,
    ResourceAttributes.PROJECT_NAME: _ItemRedactor.as_written,
}
_NO_RULES: dict[str, _Rule] = {}
# flattened list items whose text the builder takes as it is (`retrieval.documents.0.document.content`)
_AS_WRITTEN_SUFFIXES = (
    ".document.content",
    ".message.content",
    ".message_content.text",
    ".prompt.text",
    ".completion.text",
    ".embedding.text",
)
_MESSAGE_PREFIXES = (TraceloopAttributes.PROMPT_PREFIX + ".", TraceloopAttributes.COMPLETION_PREFIX + ".")


def _span_rule(key: str) -> _Rule | None:
    """The rule of a span attribute no exact key names: association properties, flattened lists."""
    if key.startswith(TraceloopAttributes.ASSOCIATION_PREFIX):
        name = key[len(TraceloopAttributes.ASSOCIATION_PREFIX) :]
        return lambda r, v: r.meta_entry(name, v)
    if key.endswith(".document.id"):
        return _ItemRedactor.id_text
    if key.endswith(_AS_WRITTEN_SUFFIXES) or (key.startswith(_MESSAGE_PREFIXES) and key.endswith(".content")):
        return _ItemRedactor.as_written
    return None
