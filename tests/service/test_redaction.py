"""Tests of service/redaction.py: what each built-in kind takes and leaves, and that a redacted trace is
what is stored, judged and shown (through a real server), counted by kind."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import pytest
import sqlalchemy as sa
from pydantic import BaseModel
from typing_extensions import TypeAliasType

from service.config import ConfigError, RedactionConfig, load_config
from service.metrics import Metrics
from service.redaction import FIELDS, ROOT_RECORDS, Redactor, fields_table, redaction_key
from service.report import cli as report_cli
from tests.live_server import live_server


def redactor(**config: object) -> Redactor:
    return Redactor(RedactionConfig(enabled=True, **config), Metrics())  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("mail jane.doe+x@example.co.uk now", "mail [REDACTED:email] now"),
        ("card 4111 1111 1111 1111 ok", "card [REDACTED:card] ok"),
        ("card 4111-1111-1111-1112 fails Luhn", "card 4111-1111-1111-1112 fails Luhn"),
        ("call +44 20 7946 0958 today", "call [REDACTED:phone] today"),
        ("order 12345 of 2026-12-01", "order 12345 of 2026-12-01"),
        ("call 415-555-2671", "call [REDACTED:phone]"),
        ("version 1.2.3.4 and 10.0.0.1", "version 1.2.3.4 and 10.0.0.1"),
        ("key sk-proj-abcdefghijklmnop1234 leaked", "key [REDACTED:api_key] leaked"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "aws [REDACTED:api_key] here"),
        ("header Bearer eyJhbGciOiJIUzI1NiJ9.payload", "header Bearer [REDACTED:api_key]"),
        ("nothing personal here", "nothing personal here"),
    ],
)
def test_builtin_kinds_take_what_they_name_and_leave_the_rest(text: str, expected: str) -> None:
    assert redactor().text(text) == expected


def test_kinds_and_patterns_are_chosen_and_counted() -> None:
    metrics = Metrics()
    only_email = Redactor(
        RedactionConfig(enabled=True, builtin=["email"], patterns={"ticket": r"TCK-\d+"}), metrics
    )
    out = only_email.text("a@b.io, b@c.io, TCK-991, +44 20 7946 0958")
    assert out == "[REDACTED:email], [REDACTED:email], [REDACTED:ticket], +44 20 7946 0958"
    assert metrics.registry.get_sample_value("ragmon_redactions_total", {"kind": "email"}) == 2
    assert metrics.registry.get_sample_value("ragmon_redactions_total", {"kind": "ticket"}) == 1


def test_redaction_and_the_raw_phoenix_tee_are_refused_together() -> None:
    with pytest.raises(ConfigError, match="Phoenix tee"):
        load_config(
            environ={},
            overrides={"redaction": {"enabled": True}, "phoenix": {"endpoint": "http://phoenix:6006"}},
        )
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        load_config(environ={}, overrides={"redaction": {"enabled": True, "patterns": {"bad": "(("}}})
    with pytest.raises(ConfigError, match="must be letters, digits"):
        load_config(environ={}, overrides={"redaction": {"enabled": True, "patterns": {'a"b': "x"}}})


def test_what_is_stored_and_shown_is_redacted(tmp_path: Path) -> None:
    settings = {"redaction": {"enabled": True}, "assembler": {"grace_s": 0.05}}
    record = {
        "trace_id": f"{7:032x}",
        "app": "pii-app",
        "query": "my card is 4111 1111 1111 1111, mail me at ann@example.com",
        "answer": "We emailed ann@example.com.",
        "retrieval": {"chunks": [{"id": "c1", "content": "Customer phone +1 (415) 555-2671"}]},
    }
    with live_server(tmp_path, **settings) as server:
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": [record]}).status_code == 200
            event = {"trace_id": record["trace_id"], "kind": "down", "text": "call me on +1 415 555 2671"}
            assert client.post("/api/v1/feedback", json=event).status_code == 200
        server.flush()
        with server.client() as client:
            stored = client.get(f"/api/v1/traces/{record['trace_id']}").json()
        with server.pipeline.store.engine.connect() as conn:
            rows = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM traces")).all()], default=str
            )
            contexts = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM trace_contexts")).all()]
            )
            feedback = json.dumps(
                [list(r) for r in conn.execute(sa.text("SELECT * FROM feedback")).all()], default=str
            )
        for text in (json.dumps(stored), rows, contexts, feedback):
            assert "4111 1111" not in text and "ann@example.com" not in text
            assert "555-2671" not in text and "555 2671" not in text  # (a bare "555" can be in a time)
        assert stored["query"] == "my card is [REDACTED:card], mail me at [REDACTED:email]"
        assert server.metric("ragmon_redactions_total", kind="email") == 2
        assert server.metric("ragmon_redactions_total", kind="phone") == 2


# -- the one list of fields, and every listed field redacted end to end --------------------------------

LEAK = "leak.example.org"
FOUND = re.compile(r"[\w.+-]+@leak\.example\.org")


def planted(field: str) -> str:
    """The secret planted in one field: an e-mail address naming the field, so a leak says where."""
    return f"{re.sub(r'[^A-Za-z0-9]', '-', field)}@{LEAK}"


def _leaves(annotation: Any) -> Iterator[Any]:
    """The types a field's annotation can hold, one level of containers and unions unpacked at a time."""
    if isinstance(annotation, TypeAliasType):  # JsonValue
        yield "json"
    elif get_origin(annotation) is Literal:
        yield from {type(arg) for arg in get_args(annotation)}
    elif get_args(annotation):
        for arg in get_args(annotation):
            yield from _leaves(arg)
    else:
        yield annotation


def _fields(record: type) -> dict[str, Any]:
    if issubclass(record, BaseModel):
        return {name: field.annotation for name, field in record.model_fields.items()}
    return get_type_hints(record)


def _is_record(tp: Any) -> bool:
    return isinstance(tp, type) and (issubclass(tp, BaseModel) or dataclasses.is_dataclass(tp))


def test_every_string_field_of_every_kept_record_is_in_the_one_list() -> None:
    """A new field that can hold a string fails here until `FIELDS` says how it is redacted (or why it
    is kept); an entry for a field that no longer exists fails too."""
    from service.model import Feedback, RagTrace
    from service.probes.golden import GoldenQuestion
    from service.review.records import Intake, ReviewIn

    roots: list[type] = [RagTrace, Feedback, ReviewIn, Intake, GoldenQuestion]
    assert [r.__name__ for r in roots] == list(ROOT_RECORDS)
    seen: set[str] = set()
    unclassified: list[str] = []
    stale: list[str] = []
    todo = list(roots)
    while todo:
        record = todo.pop()
        if record.__name__ in seen:
            continue
        seen.add(record.__name__)
        assert record.__name__ in FIELDS, f"{record.__name__} has no entry in FIELDS"
        rules = FIELDS[record.__name__]
        fields = _fields(record)
        stale += [f"{record.__name__}.{name}" for name in rules if name not in fields]
        for name, annotation in fields.items():
            leaves = list(_leaves(annotation))
            todo += [leaf for leaf in leaves if _is_record(leaf)]
            if (str in leaves or "json" in leaves) and name not in rules:
                unclassified.append(f"{record.__name__}.{name}")
    assert unclassified == [] and stale == []
    assert seen == set(FIELDS), set(FIELDS) - seen


def test_the_docs_list_the_fields() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
    assert fields_table() in docs, "run python scripts/update_readme.py"


def test_ids_stay_apart_alike_everywhere_and_marks_are_not_redacted_again() -> None:
    metrics = Metrics()
    one, other = (
        Redactor(RedactionConfig(enabled=True), metrics, key=b"k" * 32),
        Redactor(RedactionConfig(enabled=True), metrics, key=b"k" * 32),
    )
    a, b = one.identifier("4155552671"), one.identifier("4155552672")
    assert a != b and a is not None and re.fullmatch(r"\[REDACTED:phone:[a-p]{16}\]", a)
    assert other.identifier("4155552671") == a  # same key, same mark: a golden set meets its traces
    assert Redactor(RedactionConfig(enabled=True), metrics, key=b"x" * 32).identifier("4155552671") != a
    assert one.identifier(a) == a  # idempotent
    assert one.text(a) == "[REDACTED:phone]" == one.text(one.text(a))  # free text carries no digest
    text = one.text("mail ann@example.com or call 4155552671")
    assert text == "mail [REDACTED:email] or call [REDACTED:phone]" and one.text(text) == text
    assert one.identifier("doc-7#chunk-3") == "doc-7#chunk-3"  # an id with nothing to redact is unchanged


def _reference_redact(redactor: Redactor, value: str, keyed: bool) -> str:
    """One round of redaction as it worked before it reported where its replacements sit: kind after
    kind over the text between marks, each over what the kinds before it left."""
    pieces = re.split(r"(\[REDACTED:[^\[\]:]+(?::[a-p]{16})?\])", value)
    for index in range(0, len(pieces), 2):
        for kind, pattern, check, _ in redactor._rules:
            if not pieces[index]:
                break
            mark = redactor._keyed_mark(kind) if keyed else (lambda _, kind=kind: f"[REDACTED:{kind}]")
            out, end = [], 0
            for match in pattern.finditer(pieces[index]):
                if match.end() > match.start() and (check is None or check(match)):
                    out += (pieces[index][end : match.start()], mark(match.group(0)))
                    end = match.end()
            pieces[index] = "".join(out) + pieces[index][end:]
    if not keyed:  # a mark in free text loses its digest
        pieces[1::2] = [re.sub(r":[a-p]{16}\]$", "]", mark) for mark in pieces[1::2]]
    return "".join(pieces)


def _reference_fixpoint(redactor: Redactor, value: str, keyed: bool) -> str:
    """`_reference_redact` again and again until it changes nothing."""
    for _ in range(9):
        again = _reference_redact(redactor, value, keyed)
        if again == value:
            break
        value = again
    return value


def test_redaction_by_edits_is_redaction_kind_after_kind() -> None:
    """`Redactor.edits` says where each replacement goes; made, they are what redacting kind after kind,
    round after round until nothing more matches, gives, with custom patterns that match across the
    marks of the kinds before them too; and redacting is idempotent."""
    import random

    rng = random.Random(7)
    alphabet = ["a", "b", " ", "-", "4", "1", "@", ".", "x.io", "+44 ", "(", ")", "TCK-", "9", "\n", ":", "["]
    alphabet += [
        "ann@leak.io",
        "4111 1111 1111 1111",
        "sk-proj-abcdefghijklmnop1234",
        "Bearer abcdefghijklmnopq",
    ]
    alphabet += ["[REDACTED:email]", "[REDACTED:phone:abcdefghijklmnop]", "415-555-2671"]
    configs = [
        RedactionConfig(enabled=True),
        RedactionConfig(enabled=True, builtin=["phone", "email"], patterns={"ticket": r"TCK-\d+"}),
        # custom kinds that match inside and across marks (which the built-in kinds never do)
        RedactionConfig(enabled=True, patterns={"ticket": r"TCK-\d+", "bracket": r"\][^\[]{0,3}", "b": "b+"}),
    ]
    for config in configs:
        one = Redactor(config, Metrics(), key=b"k" * 32)
        for _ in range(150 if "bracket" in config.patterns else 800):  # its marks multiply
            value = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
            for keyed in (True, False):
                assert one._redact(value, keyed) == _reference_fixpoint(one, value, keyed), (
                    config.patterns,
                    value,
                )
                if "bracket" not in config.patterns:  # a kind that matches marks may never settle
                    assert one._redact(one._redact(value, keyed), keyed) == one._redact(value, keyed)
            # free text of an id's redaction is the free text of the raw: what lets spans be redacted
            # as ids before the trace is built (service/ingest/span_redaction.py)
            if not config.patterns:
                assert one.text(one.identifier(value)) == one.text(value), value


def test_a_chunk_named_by_its_text_is_named_by_its_redacted_text() -> None:
    from service.conventions.content import content_id
    from service.model import Chunk

    one = Redactor(RedactionConfig(enabled=True), Metrics(), key=b"k" * 32)
    raw = "Parcels to ann@leak.example.org ship on Monday."
    chunk = one.record(Chunk(id=content_id(raw), rank=0, content=raw))
    assert chunk.content == "Parcels to [REDACTED:email] ship on Monday."
    assert chunk.id == content_id(one.identifier(raw) or "") != content_id(raw)
    other = one.record(
        Chunk(id=content_id(raw.replace("ann", "bob")), rank=1, content=raw.replace("ann", "bob"))
    )
    assert other.id != chunk.id  # two texts, two ids
    assert one.record(chunk) == chunk  # and once only
    given = Chunk(id="sha256:feedfacecafebeef", rank=0, content=raw)  # an id the app gave: an id like any
    assert one.record(given).id == "sha256:feedfacecafebeef"
    clean = Chunk(id=content_id("no secret"), rank=0, content="no secret")
    assert one.record(clean) is clean


def _trace_record() -> dict[str, Any]:
    def chunk(name: str) -> dict[str, Any]:
        return {
            "id": planted(f"{name}.id"),
            "score": 0.8,
            "content": f"text of the chunk, owner {planted(f'{name}.content')}",
            "metadata": {planted(f"{name}.metadata.key"): {"owner": [planted(f"{name}.metadata.value")]}},
        }

    return {
        "trace_id": f"{0xA11:032x}",
        "app": planted("app"),
        "release": planted("release"),
        "intent": planted("intent"),
        "session_id": planted("session_id"),
        "user_id": planted("user_id"),
        "query": f"where is my parcel? I am {planted('query')}",
        "query_embedding": {"model": planted("query_embedding.model"), "vector": [0.1, 0.2, 0.3]},
        "retrieval": {
            "retriever": planted("retrieval.retriever"),
            "chunks": [chunk("retrieval.chunks")],
            "filter": f"owner = '{planted('retrieval.filter')}'",
            "excluded_ids": [planted("retrieval.excluded_ids")],
            "reranked": [chunk("retrieval.reranked")],
        },
        "answer": f"It is on its way, {planted('answer')}.",
        "cited_chunk_ids": [planted("cited_chunk_ids")],
        "usage": [{"model": planted("usage.model"), "input_tokens": 10, "output_tokens": 5}],
    }


GOLDEN_ROWS = [
    {
        "question_id": "q1",
        "question": f"where is my parcel, {planted('golden.question')}?",
        "gold_chunks": [{"chunk_id": planted("golden.gold_chunks.chunk_id")}],
        "expected_facts": [f"it ships to {planted('golden.expected_facts')}"],
        "category": planted("golden.category"),
        "reference_answer": f"write to {planted('golden.reference_answer')}",
        "source_trace_id": planted("golden.source_trace_id"),
        "reviewer": planted("golden.reviewer"),
    },
    {
        "question_id": "q2",
        "question": "and the refund?",
        "evidence": [
            {
                "evidence_id": planted("golden.evidence_id"),
                "chunk_ids": [planted("golden.evidence.chunk_ids")],
            }
        ],
    },
]


def _send_otlp(server: Any) -> int:
    """A GenAI chat span and its content as OTLP log records (the logs signal), by the real exporters."""
    from opentelemetry._logs import LogRecord
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    resource = Resource.create(
        {"service.name": planted("otlp.app"), "service.version": planted("otlp.release")}
    )
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{server.url}/v1/traces")))
    logs = LoggerProvider(resource=resource)
    logs.add_log_record_processor(SimpleLogRecordProcessor(OTLPLogExporter(f"{server.url}/v1/logs")))
    with tracer_provider.get_tracer("opentelemetry.instrumentation.openai_v2").start_as_current_span(
        "chat"
    ) as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", planted("otlp.model"))
        span.set_attribute("session.id", planted("otlp.session_id"))
        context = span.get_span_context()
    logger = logs.get_logger("opentelemetry.instrumentation.openai_v2")
    for name, body in (
        ("gen_ai.user.message", {"content": f"hi, I am {planted('otlp.log.question')}"}),
        (
            "gen_ai.choice",
            {"index": 0, "message": {"role": "assistant", "content": planted("otlp.log.answer")}},
        ),
    ):
        logger.emit(
            LogRecord(
                timestamp=time.time_ns(),
                trace_id=context.trace_id,
                span_id=context.span_id,
                trace_flags=context.trace_flags,
                body=body,
                event_name=name,
            )
        )
    logs.shutdown()
    tracer_provider.shutdown()
    return context.trace_id


def _rows_of_every_table(engine: sa.Engine) -> str:
    with engine.connect() as conn:
        return json.dumps(
            {
                table: [list(row) for row in conn.execute(sa.text(f'SELECT * FROM "{table}"')).all()]
                for table in sa.inspect(engine).get_table_names()
            },
            default=str,
        )


def test_a_secret_in_every_listed_field_is_found_nowhere(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="service")
    token = "reviewer-token-0123456789"
    settings = {
        "redaction": {"enabled": True},
        "assembler": {"grace_s": 0.05},
        "review": {"reviewers": {"ann": {"token": token}}},
    }
    record = _trace_record()
    feedback = {
        "trace_id": record["trace_id"],
        "kind": "down",
        "event_id": planted("feedback.event_id"),
        "app": planted("feedback.app"),
        "reason": planted("feedback.reason"),
        "text": f"wrong, write to {planted('feedback.text')}",
    }
    shown: list[str] = []
    with live_server(tmp_path / "data", **settings) as server:
        with server.client() as client:
            assert client.post("/api/v1/traces", json={"traces": [record]}).status_code == 200
            assert client.post("/api/v1/feedback", json=feedback).status_code == 200
            otlp_trace = _send_otlp(server)
            server.flush()
            for _ in range(100):  # the OTLP trace closes after its grace
                if client.get(f"/api/v1/traces/{otlp_trace:032x}").status_code == 200:
                    break
                server.flush()
                time.sleep(0.1)
            sent = client.post(
                "/api/v1/review/items",
                json={"trace_id": record["trace_id"], "note": f"see {planted('review.send.note')}"},
            )
            assert sent.status_code in (200, 201), sent.text  # the thumbs-down may have sent it first
            golden = client.post(
                "/api/v1/probes/golden",
                json={
                    "name": "parcels",
                    "jsonl": "\n".join(json.dumps(row) for row in GOLDEN_ROWS),
                    "source": planted("golden.source"),
                },
            )
            assert golden.status_code == 200, golden.text
            # a filter on the raw intent finds the trace stored with it redacted
            found = client.get("/api/v1/traces", params={"intent": record["intent"]}).json()["items"]
            assert [t["trace_id"] for t in found] == [record["trace_id"]]
            shown += [
                client.get(path).text
                for path in (
                    "/api/v1/traces",
                    f"/api/v1/traces/{record['trace_id']}",
                    f"/api/v1/traces/{otlp_trace:032x}",
                    "/api/v1/probes/golden",
                    "/api/v1/dead-letters",
                )
            ]
        with server.client() as reviewer:
            reviewer.get("/review/login")
            signed = reviewer.post(
                "/api/v1/review/session",
                json={"token": token},
                headers={"x-csrf-token": reviewer.cookies.get("ragmon_review_login") or ""},
            )
            assert signed.status_code == 200, signed.text
            csrf = {"x-csrf-token": reviewer.get("/api/v1/review/session").json()["csrf"]}
            item = sent.json()["item_id"]
            assert reviewer.post(f"/api/v1/review/items/{item}/claim", headers=csrf).status_code == 200
            review = {
                "verdict": "unfaithful",
                "expected_chunk_ids": [planted("review.expected_chunk_ids")],
                "reference_answer": f"write to {planted('review.reference_answer')}",
                "category": planted("review.category"),
                "note": f"called {planted('review.note')}",
            }
            answer = reviewer.post(f"/api/v1/review/items/{item}/review", json=review, headers=csrf)
            assert answer.status_code == 201, answer.text
            shown += [
                reviewer.get(path).text
                for path in (
                    "/api/v1/review/items?state=done",
                    f"/api/v1/review/items/{item}",
                    "/api/v1/review/export?format=review",
                    "/api/v1/review/export?format=golden",
                )
            ]
        with server.client() as client:
            metrics = client.get("/metrics").text
        assert (
            report_cli.main(
                argparse.Namespace(
                    since="7d", until="now", out=tmp_path / "report", app=None, tenant="default"
                ),
                server.config,
            )
            == 0
        )
        stored = _rows_of_every_table(server.pipeline.store.engine)
    kept_files = "".join(
        path.read_bytes().decode("utf-8", "replace")
        for root in (tmp_path / "data", tmp_path / "report")
        for path in root.rglob("*")
        # the write-ahead log holds requests as received until they are stored (docs/security.md)
        if path.is_file() and "wal" not in path.relative_to(root).parts
    )
    places = {
        "store": stored,
        "api": "\n".join(shown),
        "metrics": metrics,
        "files": kept_files,
        "logs": caplog.text,
    }
    leaks = {where: sorted(set(FOUND.findall(text))) for where, text in places.items()}
    assert leaks == {where: [] for where in places}
    # and what was redacted is marked, not dropped: the labels and rows carry the marks
    assert re.search(r'intent="\[REDACTED:email:[a-p]{16}\]"', metrics)
    assert re.search(r'release="\[REDACTED:email:[a-p]{16}\]"', metrics)
    # every path delivered what it was given (else "found nowhere" would prove nothing)
    for kept in (
        "where is my parcel? I am [REDACTED:email]",  # the JSON API's trace
        "hi, I am [REDACTED:email]",  # the question from an OTLP log record
        "wrong, write to [REDACTED:email]",  # feedback
        "see [REDACTED:email]",  # the note of a trace sent for review
        "called [REDACTED:email]",  # the reviewer's note
        "where is my parcel, [REDACTED:email]?",  # the golden set
    ):
        assert kept in stored, kept


def test_the_digest_key_is_kept_in_the_data_dir_or_required_in_distributed_mode(tmp_path: Path) -> None:
    config = load_config(environ={}, overrides={"data_dir": str(tmp_path), "redaction": {"enabled": True}})
    key = redaction_key(config)
    assert redaction_key(config) == key and len(key) >= 32  # the same across restarts
    assert (tmp_path / "redaction.key").stat().st_mode & 0o777 == 0o600
    given = load_config(environ={}, overrides={"redaction": {"enabled": True, "key": "k" * 20}})
    assert redaction_key(given) == b"k" * 20
    with pytest.raises(ConfigError, match=r"redaction\.key"):
        load_config(environ={}, overrides={"bus": {"kind": "kafka"}, "redaction": {"enabled": True}})
    kafka = {"bus": {"kind": "kafka"}, "redaction": {"enabled": True, "key": "k" * 20}}
    assert load_config(environ={}, overrides=kafka).redaction.key is not None


# -- spans are redacted before anything keeps them: late spans complete a trace from redacted spans ------


class _Clock:
    """One clock for the assembler (monotonic seconds) and the span archive (wall time), moved by the test."""

    def __init__(self) -> None:
        self.now = 10_000.0
        self.origin = datetime.now(UTC)

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.origin + timedelta(seconds=self.now - 10_000.0)


def test_a_trace_completed_by_late_spans_is_redacted_alike_and_nothing_raw_is_kept(tmp_path: Path) -> None:
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    from tests.rag_spans import RagRequest, body

    clock = _Clock()
    settings = {
        "redaction": {"enabled": True},
        "assembler": {"grace_s": 0.5, "idle_s": 120, "max_age_s": 900, "late_window_s": 1800},
    }
    request = RagRequest(
        duration_s=200,
        query=f"Refund for {planted('late.query')}? Call +44 20 7946 0958",
        answer=f"Refunds go to {planted('late.answer')}.",
    )
    retrieve, generate, root = request.retrieve, request.generate, request.root
    for key, value in (
        ("retrieval.documents.1.document.id", planted("late.chunk.id")),
        ("retrieval.documents.1.document.content", f"Ask {planted('late.chunk.content')}."),
    ):
        retrieve.attributes.append(KeyValue(key=key, value=AnyValue(string_value=value)))
    for attribute in generate.attributes:
        if attribute.key == "llm.model_name":  # a provider path before the name: priced alike
            attribute.value.string_value = f"{planted('late.model')}/gpt-4o-mini"

    def send(server: Any, *spans: Any) -> None:
        with server.client(headers={"content-type": "application/x-protobuf"}) as client:
            response = client.post("/v1/traces", content=body(*spans, app=planted("late.app")))
        assert response.status_code == 200, response.text

    def advance(server: Any, seconds: float) -> None:
        clock.now += seconds
        server.call(server.pipeline.assembler.flush_due())
        assert server.call(server.pipeline.bus.drain(10))

    def stored(server: Any) -> dict[str, Any]:
        with server.client() as client:
            response = client.get(f"/api/v1/traces/{request.trace_id}")
        assert response.status_code == 200, response.text
        record: dict[str, Any] = response.json()
        return record

    def archive(server: Any) -> str:
        """What `trace_spans` holds, its bytes as text, and the spans it gives back."""
        kept = server.pipeline.span_archive.kept("default", request.trace_id)
        with server.pipeline.store.engine.connect() as conn:
            row = conn.execute(sa.text("SELECT spans, events FROM trace_spans")).one()
        raw = b"".join(part or b"" for part in row).decode("utf-8", "replace")
        return raw + repr([otlp_item for otlp_item in kept])

    with live_server(tmp_path, **settings) as server:
        server.pipeline.assembler.clock = clock.monotonic
        server.pipeline.span_archive.clock = clock.wall
        send(server, retrieve)
        advance(server, 121)  # idle: flushed without its root, stored partial
        first = stored(server)
        assert (first["span_count"], first["flags"]["partial"], first["answer"]) == (1, True, None)
        assert FOUND.findall(archive(server)) == [] and "7946 0958" not in archive(server)
        advance(server, request.duration_s - 121)
        send(server, generate, root)  # the answer and the root come late, with secrets of their own
        advance(server, 0.6)
        record = stored(server)
        kept = archive(server)
        rows = _rows_of_every_table(server.pipeline.store.engine)
        assert server.metric("ragmon_late_spans_total") == 2
        assert server.metric("ragmon_redactions_total", kind="email") >= 6
    assert (record["span_count"], record["flags"]["partial"], record["context"]["revision"]) == (3, False, 3)
    # the completed trace is redacted with the marks of its first version
    assert record["query"] == first["query"] == "Refund for [REDACTED:email]? Call [REDACTED:phone]"
    assert [c["id"] for c in record["context"]["chunks"]] == [c["id"] for c in first["context"]["chunks"]]
    assert re.fullmatch(r"\[REDACTED:email:[a-p]{16}\]", record["context"]["chunks"][1]["id"])
    assert record["answer"] == "Refunds go to [REDACTED:email]."
    assert record["app"] == first["app"] and re.fullmatch(r"\[REDACTED:email:[a-p]{16}\]", record["app"])
    # nothing raw in the span archive (its bytes, and the spans it gives back), nor in any table
    assert FOUND.findall(kept) == [] and "7946 0958" not in kept and "[REDACTED:email:" in kept
    assert FOUND.findall(rows) == [] and "7946 0958" not in rows
