"""Tests of service/ingest/span_redaction.py: spans redacted where ingest decodes them, so that the span
archive never holds what redaction takes out, and a trace built from redacted spans is, once the
trace's own redaction ran, the trace built from the raw spans and redacted, field by field.

The property is checked over real span shapes: the captures of twelve instrumentation libraries
(tests/conformance/captures, `python -m tests.conformance.harness capture` then `pack`), with secrets
planted in every text they carry (the corpus' documents and ids, the questions and answers, the app and
model names), and over hand-made shapes for each rule the module's docstring lists."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from service.config import RedactionConfig
from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import AnySpan, LogEvent, PackedSpan, Span, SpanEvent, WireSpan
from service.ingest import otlp_body, otlp_logs, otlp_protobuf
from service.ingest.decoded import DecodedBatch
from service.ingest.otlp_encode import key_values, span_bytes
from service.ingest.span_codec import OtlpSpanCodec
from service.ingest.span_redaction import SpanRedaction
from service.metrics import Metrics
from service.model import RagTrace
from service.redaction import Redactor

KEY = b"span-redaction-test-key-0123456789"
CONFIG = RedactionConfig(enabled=True)
PRICES = PriceTable.default()
NOW = datetime(2100, 1, 1, tzinfo=UTC)
CAPTURES = Path(__file__).resolve().parents[2] / "conformance" / "captures"
CLIENTS = sorted(path.name.removesuffix(".json.gz") for path in CAPTURES.glob("*.json.gz"))

# what is planted: the corpus' words, document ids, the app and the models, each next to a secret of one
# of the built-in kinds (a model keeps its name after a path, so that it is priced alike either way)
PLANTS = [
    ("Alpha", "Alpha (ann@leak.example.org)"),
    ("Beta", "Beta +44 20 7946 0958"),
    ("Gamma", "Gamma card 4111 1111 1111 1111"),
    ("Delta", "Delta key sk-proj-abcdefghijklmnop1234"),
    ("Epsilon", "Epsilon, call 415-555-2671"),
    ("Zeta", "Zeta zed@leak.example.org"),
    ("lighthouse", "lighthouse (keeper bob@leak.example.org)"),
    *((f"doc-{name}", f"doc-{name}/{name}@leak.example.org") for name in ("alpha", "beta", "gamma", "delta")),
    ("conformance", "conformance/app@leak.example.org"),
    ("gpt-4o-mini", "eve@leak.example.org/gpt-4o-mini"),
    ("text-embedding-3-small", "eve@leak.example.org/text-embedding-3-small"),
]
SECRETS = ("leak.example.org", "7946 0958", "4111 1111", "sk-proj-", "555-2671")


def redactor() -> Redactor:
    return Redactor(CONFIG, Metrics(), KEY)


def _plant(text: str) -> str:
    for word, planted in PLANTS:
        text = text.replace(word, planted)
    return text


def _base64_ids(node: Any) -> Any:
    """The capture's hex ids back as OTLP/JSON's protobuf mapping reads bytes: base64."""
    import base64

    if isinstance(node, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
            else _base64_ids(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_base64_ids(v) for v in node]
    return node


def _protobuf(request: dict[str, Any], message: type[Any]) -> bytes:
    parsed = json_format.Parse(json.dumps(_base64_ids(json.loads(_plant(json.dumps(request))))), message())
    body: bytes = parsed.SerializeToString()
    return body


def captured_requests(client: str) -> Iterator[tuple[str, bytes]]:
    """("traces" | "logs", an OTLP/HTTP protobuf body) of each request the client sent, secrets planted."""
    requests = json.loads(gzip.decompress((CAPTURES / f"{client}.json.gz").read_bytes()))
    for request in requests["traces"]:
        yield "traces", _protobuf(request, ExportTraceServiceRequest)
    for request in requests["logs"]:
        yield "logs", _protobuf(request, ExportLogsServiceRequest)


def decode(signal: str, body: bytes) -> DecodedBatch:
    """What ingest decodes a body into, as a decoder returns it (protobuf spans screened, as wire bytes)."""
    if signal == "traces":
        return otlp_body.decode_body(body, json_body=False, encoding="", tenant="default", limit=1 << 30)
    return otlp_logs.decode_logs_body(body, json_body=False, encoding="", tenant="default", limit=1 << 30)


def unpacked(items: Sequence[AnySpan]) -> list[Span | LogEvent]:
    out: list[Span | LogEvent] = []
    for item in items:
        if isinstance(item, WireSpan):
            item = otlp_protobuf.span_from_wire(item, DecodedBatch())
        elif isinstance(item, PackedSpan):
            item = item.unpack()
        out.append(item)
    return out


def by_trace(items: Sequence[AnySpan]) -> dict[str, list[AnySpan]]:
    groups: dict[str, list[AnySpan]] = {}
    for item in items:
        groups.setdefault(item.trace_id, []).append(item)
    return groups


def built(items: Sequence[AnySpan]) -> RagTrace:
    return build_trace(unpacked(items), partial=not any(i.is_root for i in items), prices=PRICES, now=NOW)


def archived(items: Sequence[AnySpan]) -> tuple[list[AnySpan], bytes]:
    """The items as the span archive keeps and gives them back, and the bytes it keeps."""
    codec = OtlpSpanCodec()
    spans, events = codec.encode(items)
    return codec.decode(items[0].tenant, spans, events), spans + events


def differences(got: RagTrace, expected: RagTrace) -> dict[str, tuple[Any, Any]]:
    a, b = got.model_dump(mode="json"), expected.model_dump(mode="json")
    return {name: (a[name], b[name]) for name in a if a[name] != b[name]}


def check_commutes(batches: Sequence[DecodedBatch]) -> list[tuple[RagTrace, RagTrace]]:
    """For each trace of these decoded requests: (raw trace, its redaction), after asserting that the
    trace built from the span-level-redacted items, kept by the archive and read back, then redacted, is
    that redaction, and that the archive keeps no secret."""
    raw_items = [item for batch in batches for item in batch.spans]
    redaction = SpanRedaction(CONFIG, KEY)
    redacted_items: list[AnySpan] = []
    for batch in batches:
        copy = DecodedBatch(spans=list(batch.spans))
        redaction.redact(copy)
        redacted_items += copy.spans
    out = []
    raw_groups, redacted_groups = by_trace(raw_items), by_trace(redacted_items)
    assert raw_groups.keys() == redacted_groups.keys()
    for trace_id, items in raw_groups.items():
        raw = built(items)
        expected = redactor().trace(raw)
        kept, stored = archived(redacted_groups[trace_id])
        assert not [s for s in SECRETS if s.encode() in stored], (
            f"trace {trace_id}: the archive keeps a secret"
        )
        got = redactor().trace(built(kept))
        assert differences(got, expected) == {}, f"trace {trace_id}"
        out.append((raw, expected))
    return out


# -- the captures of real libraries -------------------------------------------------------------------


def test_the_captures_are_there() -> None:
    assert len(CLIENTS) == 12, CLIENTS


@pytest.mark.parametrize("client", CLIENTS)
def test_redacting_spans_first_gives_the_same_trace_for_every_library(client: str) -> None:
    batches = [decode(signal, body) for signal, body in captured_requests(client)]
    traces = check_commutes(batches)
    raw_text = "".join(raw.model_dump_json() for raw, _ in traces)
    redacted_text = "".join(redacted.model_dump_json() for _, redacted in traces)
    # the secrets reached the traces (else "the same" would prove little), and none is left
    assert [s for s in SECRETS if s in raw_text], "nothing planted reached a trace"
    assert [s for s in SECRETS if s in redacted_text] == []
    assert "[REDACTED:" in redacted_text


# -- hand-made shapes, one rule at a time -------------------------------------------------------------

TRACE = "5e1f0c3a9b8d7e6f00112233445566aa"
T0 = 1_764_000_000_000_000_000
MS = 1_000_000
QUESTION = "Where is my parcel?\nWrite to ann@leak.example.org or call +44 20 7946 0958."
RESOURCE = {"service.name": "shop/app@leak.example.org", "service.version": "v1+rel@leak.example.org"}


def span(
    n: int,
    parent: int | None,
    name: str,
    attributes: dict[str, Any],
    events: list[SpanEvent] | None = None,
    resource: dict[str, Any] | None = None,
) -> Span:
    return Span(
        trace_id=TRACE,
        span_id=f"{n:016x}",
        parent_span_id=f"{parent:016x}" if parent is not None else None,
        name=name,
        start_ns=T0 + n * MS,
        end_ns=T0 + (n + 100) * MS,
        attributes=attributes,
        events=events or [],
        resource=RESOURCE if resource is None else resource,
    )


def wire(spans: Sequence[Span]) -> DecodedBatch:
    """The spans as ingest has them after screening their protobuf: one request, wire bytes."""
    request = ExportTraceServiceRequest()
    for s in spans:
        group = request.resource_spans.add()
        group.resource.attributes.extend(key_values(s.resource))
        group.scope_spans.add().spans.append(PbSpan.FromString(span_bytes(s)))
    return decode("traces", request.SerializeToString())


def documents(*docs: tuple[str | None, str, str | None]) -> dict[str, Any]:
    """OpenInference `retrieval.documents.N.*` of (id or None, content, metadata JSON or None)."""
    out: dict[str, Any] = {}
    for n, (doc_id, content, metadata) in enumerate(docs):
        prefix = f"retrieval.documents.{n}.document."
        if doc_id is not None:
            out[prefix + "id"] = doc_id
        out[prefix + "content"] = content
        out[prefix + "score"] = 0.9 - n / 10
        if metadata is not None:
            out[prefix + "metadata"] = metadata
    return out


def openinference_trace() -> list[Span]:
    """An OpenInference app that uses every reading the rules name."""
    metadata = {
        "user_id": "never-read-the-span-attribute-wins",
        "session_id": "meta-session/s@leak.example.org",
        "intent": "refund/ann@leak.example.org",
        "release": 4155552671,
        "probe_run_id": "run-2026-4155552671",  # looks like a phone number: kept all the same
        "k": 3,
        "nested": {"owner@leak.example.org": ["p@leak.example.org", 4155552671, 0.123456789012]},
    }
    root = span(
        1,
        None,
        "rag",
        {
            "openinference.span.kind": "CHAIN",
            "input.value": json.dumps({"question": QUESTION, "history": ["call me:\n4155552671"]}),
            "input.mime_type": "application/json",
            "output.value": "It ships today, ann@leak.example.org.",
            "output.mime_type": "text/plain",
            "metadata": json.dumps(metadata),
            "user.id": "   ",
            "enduser.id": "user/u@leak.example.org",
            "session.id": 4155552671,
            "ragmon.probe.question_id": "q-4155552671",
            # a key that changes with redaction changes the order of the filter's sorted keys
            "ragmon.retrieval.filter": {"owner@leak.example.org": "o", "phone": 4155552671, "b": "z"},
            "ragmon.cited_chunk_ids": [4155552671, "c-1/c@leak.example.org"],
            "ragmon.retrieval.excluded_ids": json.dumps(["x@leak.example.org", 4111111111111111]),
            "app.raw": b"call ann@leak.example.org",
            "app.unread": "sk-proj-abcdefghijklmnop1234 and 4111 1111 1111 1111",
            "key ann@leak.example.org": "a key holds a secret",
        },
        events=[SpanEvent("note for ann@leak.example.org", T0 + 5 * MS, {"detail": "+44 20 7946 0958"})],
    )
    retriever = span(
        2,
        1,
        "retrieve/r@leak.example.org",
        {
            "openinference.span.kind": "RETRIEVER",
            "input.value": QUESTION,
            **documents(
                (None, "Parcels to ann@leak.example.org ship on Monday.", None),
                (None, "Parcels to bob@leak.example.org ship on Monday.", None),
                (
                    None,
                    "Returns: call +44 20 7946 0958.",
                    json.dumps({"chunk_id": "c-3/ann@leak.example.org"}),
                ),
                # JSON the builder takes as it is: an escape next to a number decides whether it is one
                (
                    "doc-4/d@leak.example.org",
                    '{"owner": "ann@leak.example.org", "tel": "call:\\n4155552671"}',
                    None,
                ),
                (None, "No secret here.", None),
            ),
        },
    )
    embedding = span(
        3,
        1,
        "embed",
        {
            "openinference.span.kind": "EMBEDDING",
            "embedding.model_name": "eve@leak.example.org/text-embedding-3-small",
            "embedding.embeddings.0.embedding.text": "Parcels for bob@leak.example.org",
            "embedding.embeddings.0.embedding.vector": [0.5, 0.5, 0.5],
            "embedding.embeddings.1.embedding.text": QUESTION,
            "embedding.embeddings.1.embedding.vector": [0.1, 0.2, 0.3],
        },
    )
    llm = span(
        4,
        1,
        "llm",
        {
            "openinference.span.kind": "LLM",
            "llm.model_name": "eve@leak.example.org/gpt-4o-mini",
            "llm.input_messages.0.message.role": "user",
            "llm.input_messages.0.message.content": QUESTION,
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": '{"answer": "ann@leak.example.org", "n": 4155552671}',
            "llm.token_count.prompt": 30,
            "llm.token_count.completion": 8,
        },
    )
    return [root, retriever, embedding, llm]


def openllmetry_trace() -> list[Span]:
    """OpenLLMetry: association properties, Python-literal and JSON payloads with LangChain documents,
    flattened prompts, tags; the SDK's default service name beside a Phoenix project name."""
    # the SDK's default name (an address right after it, so that only its prefix says it is the default)
    resource = {
        "service.name": "unknown_service.ann@leak.example.org",
        "openinference.project.name": "proj/p@leak.example.org",
    }
    lc_docs = {
        "documents": [
            {
                "id": "doc/x@leak.example.org",
                "page_content": "Ships to ann@leak.example.org\nor +44 20 7946 0958",
            },
            {
                "page_content": "Caf\u00e9 \u2603 list: bob@leak.example.org",
                "metadata": {"o": "o@leak.example.org"},
            },
        ]
    }
    workflow = span(
        1,
        None,
        "workflow",
        {
            "traceloop.span.kind": "workflow",
            "traceloop.entity.input": repr({"question": f"Where? {QUESTION}", "n": 4155552671}),
            "traceloop.entity.output": json.dumps(lc_docs, ensure_ascii=True),
            "traceloop.association.properties.user_id": 4155552671,
            "metadata": json.dumps({"user_id": "ignored: the association property is read first"}),
            "traceloop.association.properties.session_id": "s/s@leak.example.org",
            "traceloop.association.properties.probe_question_id": "q-1",
            "traceloop.association.properties.route": 4111111111111111,
            "tag.tags": json.dumps(["release:r/ann@leak.example.org", "regenerate"]),
        },
        resource=resource,
    )
    retriever = span(
        2,
        1,
        "retriever",
        {
            "traceloop.span.kind": "task",
            "gen_ai.operation.name": "vector_db_retrieve",
            "traceloop.entity.output": json.dumps(lc_docs),
            "db.chroma.query.where": "owner = 'ann@leak.example.org'",
        },
        resource=resource,
    )
    llm = span(
        3,
        1,
        "openai.chat",
        {
            "llm.request.type": "chat",
            "gen_ai.request.model": "eve@leak.example.org/gpt-4o-mini",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": json.dumps([{"type": "text", "text": QUESTION}]),
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": "It ships, ann@leak.example.org.",
            "gen_ai.usage.input_tokens": 10,
            "gen_ai.usage.output_tokens": 4,
        },
        resource=resource,
    )
    return [workflow, retriever, llm]


def genai_items() -> tuple[list[Span], list[LogEvent]]:
    """OTel GenAI: a chat span whose content comes as log records, one of them for a span that never
    came; a JSON string holding JSON (escaped twice)."""
    chat = span(
        1,
        None,
        "chat eve@leak.example.org/gpt-4o-mini",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "eve@leak.example.org/gpt-4o-mini",
            "gen_ai.conversation.id": "conv/c@leak.example.org",
            "metadata": json.dumps({"user_id": "meta/u@leak.example.org"}),
            "input.value": json.dumps(json.dumps({"query": "x\u00e9 ann@leak.example.org\nline"})),
            "input.mime_type": "application/json",
        },
    )
    resource = {"service.name": "genai/g@leak.example.org"}

    def event(span_id: str, name: str, at: int, attributes: dict[str, Any]) -> LogEvent:
        return LogEvent(TRACE, span_id, name, T0 + at * MS, attributes, resource)

    return [chat], [
        event(chat.span_id, "gen_ai.user.message", 2, {"content": QUESTION}),
        event(
            chat.span_id,
            "gen_ai.choice",
            90,
            {"index": 0, "message": {"role": "assistant", "content": "It ships, ann@leak.example.org."}},
        ),
        event(
            f"{99:016x}",
            "gen_ai.choice",
            95,
            {"message": {"role": "assistant", "content": "bob@leak.example.org"}},
        ),
    ]


@pytest.mark.parametrize("shape", ["openinference", "openllmetry"])
@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_each_rule_commutes_and_leaves_nothing_in_the_archive(shape: str, encoding: str) -> None:
    spans = openinference_trace() if shape == "openinference" else openllmetry_trace()
    batch = wire(spans) if encoding == "protobuf" else DecodedBatch(spans=spans)
    [(raw, redacted)] = check_commutes([batch])
    assert re.search("leak.example.org", raw.model_dump_json())
    assert "leak.example.org" not in redacted.model_dump_json()
    if shape == "openinference":
        assert redacted.probe_run_id == "run-2026-4155552671"  # kept, as the trace keeps it
        assert redacted.probe_question_id == "q-4155552671"
        assert raw.user_hash is not None and redacted.user_hash == raw.user_hash
        ids = [chunk.id for chunk in redacted.retrieval.chunks]
        assert len(set(ids)) == 5 and ids[0].startswith("sha256:") and ids[1].startswith("sha256:")
        assert raw.query_embedding is not None and raw.query_embedding.vector == (0.1, 0.2, 0.3)
        assert redacted.query == "Where is my parcel?\nWrite to [REDACTED:email] or call [REDACTED:phone]."
        assert redacted.session_id is not None and re.fullmatch(
            r"\[REDACTED:phone:[a-p]{16}\]", redacted.session_id
        )
    else:
        assert redacted.probe_question_id == "q-1"
        assert raw.app == "proj/p@leak.example.org" and redacted.app.startswith("proj/[REDACTED:email:")


def test_log_events_and_escaped_json_commute() -> None:
    spans, events = genai_items()
    [(raw, redacted)] = check_commutes([wire(spans), DecodedBatch(spans=list(events))])
    assert (
        raw.answer == "It ships, ann@leak.example.org." and redacted.answer == "It ships, [REDACTED:email]."
    )
    assert raw.query == QUESTION
    assert raw.user_hash == hashlib.sha256(b"meta/u@leak.example.org").hexdigest() == redacted.user_hash


def test_redacting_twice_changes_nothing_and_a_clean_span_is_not_re_encoded() -> None:
    redaction = SpanRedaction(CONFIG, KEY)
    once = wire(openinference_trace())
    redaction.redact(once)
    twice = DecodedBatch(spans=list(once.spans))
    redaction.redact(twice)
    assert [item.raw for item in twice.spans] == [item.raw for item in once.spans]  # type: ignore[union-attr]
    assert twice.redactions == {}  # and nothing counted the second time
    assert once.redactions["email"] > 10 and once.redactions["phone"] > 3
    clean = wire(
        [span(1, None, "rag", {"input.value": "nothing personal"}, resource={"service.name": "shop"})]
    )
    before = list(clean.spans)
    redaction.redact(clean)
    assert clean.spans[0] is before[0]


def test_a_decoder_process_gets_the_redaction_with_each_call_and_keeps_one() -> None:
    import pickle

    redaction = SpanRedaction(RedactionConfig(enabled=True, patterns={"ticket": r"TCK-\d+"}), KEY)
    copy = pickle.loads(pickle.dumps(redaction))
    assert pickle.loads(pickle.dumps(redaction)) is copy  # one per configuration in a process
    batch = DecodedBatch(spans=[span(1, None, "TCK-42", {"a": "TCK-7 ann@leak.example.org"})])
    copy.redact(batch)
    [redacted] = batch.spans
    assert isinstance(redacted, Span) and redacted.name.startswith("[REDACTED:ticket:")
    assert batch.redactions == {"email": 3, "ticket": 2}  # the resource holds two


MARK = r"\[REDACTED:(?:email|phone|card|api_key):[a-p]{16}\]"
HASHED = r"\[REDACTED:user:[a-p]{64}\]"


def test_what_the_archive_keeps_of_ids_users_filters_and_metadata() -> None:
    batch = wire(openinference_trace())
    SpanRedaction(CONFIG, KEY).redact(batch)
    kept, _ = archived(batch.spans)
    root = next(item for item in unpacked(kept) if isinstance(item, Span) and item.is_root)
    a = root.attributes
    assert re.fullmatch(MARK, str(a["session.id"]))  # an integer id, redacted as its digits
    assert re.fullmatch(MARK, str(a["ragmon.cited_chunk_ids"][0]))  # type: ignore[index]
    assert re.fullmatch(r"c-1/" + MARK, str(a["ragmon.cited_chunk_ids"][1]))  # type: ignore[index]
    assert re.fullmatch(HASHED, str(a["enduser.id"])) and a["user.id"] == "   "  # blank: no user id
    assert a["ragmon.probe.question_id"] == "q-4155552671"
    assert isinstance(a["ragmon.retrieval.filter"], str) and "4155552671" not in a["ragmon.retrieval.filter"]
    metadata = json.loads(str(a["metadata"]))
    assert re.fullmatch(HASHED, metadata["user_id"]) and re.fullmatch(MARK, metadata["release"])
    assert metadata["probe_run_id"] == "run-2026-4155552671" and metadata["k"] == 3
    assert not [key for key in a if "@" in key]
    assert re.fullmatch("note for " + MARK, root.events[0].name)
    assert (
        a["app.raw"]
        == b"call [REDACTED:email:" + re.search(r"[a-p]{16}", str(a["app.raw"])).group().encode() + b"]"
    )  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "text",
    [
        # escapes before and around the secrets, a surrogate pair, an escaped slash, a number
        '{"a": "x\\u00e9\\n415-555-2671", "b": "\\ud83d\\ude00 ann@leak.example.org",'
        ' "c": "\\/ b@leak.example.org", "n": 4155552671,'
        ' "ann@leak.example.org": [true, null, "\\"q\\" 4111 1111 1111 1111"]}',
        # JSON in a JSON string in JSON
        json.dumps({"m": json.dumps({"content": "hi\tann@leak.example.org", "t": "\\u0040"})}),
        # a JSON string
        json.dumps("caf\u00e9 ann@leak.example.org"),
    ],
)
def test_json_is_redacted_string_by_string_where_each_string_is(text: str) -> None:
    r = redactor()

    def by_structure(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return (
                    json.dumps(by_structure(json.loads(value))) if value[:1] in "{[" else r.identifier(value)
                )
            except ValueError:
                return r.identifier(value)
        if isinstance(value, list):
            return [by_structure(v) for v in value]
        if isinstance(value, dict):
            return {r.identifier(k): by_structure(v) for k, v in value.items()}
        return value

    batch = DecodedBatch(spans=[span(1, None, "s", {"app.payload": text}, resource={})])
    SpanRedaction(CONFIG, KEY).redact(batch)
    [item] = batch.spans
    assert isinstance(item, Span)
    redacted = str(item.attributes["app.payload"])
    assert "leak.example.org" not in redacted and "555-2671" not in redacted and "4111 1111" not in redacted
    # what a reader parses is each string redacted; nested JSON compared as what it parses to
    parsed, expected = json.loads(redacted), by_structure(json.loads(text))
    if isinstance(parsed, dict) and "m" in parsed:
        assert json.loads(parsed["m"]) == json.loads(expected["m"])
    else:
        assert parsed == expected
    # and the text around the redacted strings is as it was: escapes and all
    for kept in ("\\u00e9", "\\ud83d\\ude00", "\\/", "4155552671", '\\"q\\"'):
        assert (kept in redacted) == (kept in text)


def test_a_python_literal_is_read_and_written_back_and_plain_text_is_redacted_whole() -> None:
    literal = repr({"q": "ann@leak.example.org", "t": (1, "b@leak.example.org"), "x": b"raw"})
    not_json = "[note] call 415-555-2671 or {ann@leak.example.org}"
    batch = DecodedBatch(spans=[span(1, None, "s", {"a": literal, "b": not_json}, resource={})])
    SpanRedaction(CONFIG, KEY).redact(batch)
    [item] = batch.spans
    assert isinstance(item, Span)
    import ast

    value = ast.literal_eval(str(item.attributes["a"]))
    r = redactor()
    assert value == {
        "q": r.identifier("ann@leak.example.org"),
        "t": (1, r.identifier("b@leak.example.org")),
        "x": b"raw",
    }
    assert item.attributes["b"] == r.identifier(not_json) and "555" not in str(item.attributes["b"])
