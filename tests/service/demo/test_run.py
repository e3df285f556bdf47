"""`ragmon demo` against a real local OTLP/HTTP receiver: what arrives on the wire."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from service.demo.cli import add_arguments as add_demo_arguments
from service.demo.corpus import word_set
from service.demo.run import FIRST_TOKEN_EVENT, REGENERATION_ATTRIBUTE, TTFT_ATTRIBUTE, main, run_demo
from service.demo.traffic import LOCAL_MODEL

APPS = {"support-bot", "docs-assistant", "hr-helper"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class WireSpan:
    trace_id: str
    span_id: str
    parent: str
    name: str
    start: int
    end: int
    attrs: dict[str, Any]
    events: list[tuple[str, int]]
    resource: dict[str, Any]


@dataclass
class Receiver:
    """What the fake ragmon got: decoded spans, feedback bodies and the auth headers that came with them."""

    url: str = ""
    spans: list[WireSpan] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    content_types: set[str] = field(default_factory=set)
    refuse_feedback: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()
            self.feedback.clear()
            self.auth.clear()
            self.refuse_feedback = False

    def traces(self) -> dict[str, list[WireSpan]]:
        by_trace: dict[str, list[WireSpan]] = defaultdict(list)
        for s in self.spans:
            by_trace[s.trace_id].append(s)
        return by_trace


def _receiver_app(rec: Receiver) -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        body = await request.body()
        msg = ExportTraceServiceRequest()
        msg.ParseFromString(body)
        decoded = []
        for rs in msg.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    decoded.append(
                        WireSpan(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent=s.parent_span_id.hex(),
                            name=s.name,
                            start=s.start_time_unix_nano,
                            end=s.end_time_unix_nano,
                            attrs={kv.key: _value(kv.value) for kv in s.attributes},
                            events=[(e.name, e.time_unix_nano) for e in s.events],
                            resource=resource,
                        )
                    )
        with rec.lock:
            rec.spans.extend(decoded)
            rec.auth.append(request.headers.get("authorization"))
            rec.content_types.add(request.headers.get("content-type", ""))
        return Response(ExportTraceServiceResponse().SerializeToString(), media_type="application/x-protobuf")

    @app.post("/api/v1/feedback")
    async def feedback(request: Request) -> Response:
        body = await request.json()
        with rec.lock:
            rec.auth.append(request.headers.get("authorization"))
            if rec.refuse_feedback:
                return Response(status_code=503, headers={"Retry-After": "1"})
            rec.feedback.append(body)
        return Response(status_code=202)

    return app


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    config = uvicorn.Config(_receiver_app(rec), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            pytest.fail("the test receiver did not start")
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    rec.url = f"http://127.0.0.1:{port}"
    yield rec
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def run(receiver: Receiver) -> Iterator[tuple[Any, Receiver]]:
    receiver.clear()
    summary = run_demo(receiver.url, requests=300, rate=0, seed=7, api_key="demo-key", shift_after=150)
    yield summary, receiver
    receiver.clear()


def _kind(s: WireSpan) -> str:
    return str(s.attrs.get("openinference.span.kind"))


def test_every_request_arrives_as_one_trace_of_instrumented_spans(run: tuple[Any, Receiver]) -> None:
    summary, rec = run
    traces = rec.traces()
    assert summary.traces == 300
    assert len(traces) == 300
    assert len(rec.spans) == summary.spans == summary.spans_exported
    assert summary.spans_failed == 0
    assert rec.content_types == {"application/x-protobuf"}
    reranked = 0
    for spans in traces.values():
        roots = [s for s in spans if not s.parent]
        assert len(roots) == 1
        root = roots[0]
        assert _kind(root) == "CHAIN"
        kinds = Counter(_kind(s) for s in spans if s.parent)
        assert kinds["EMBEDDING"] == kinds["RETRIEVER"] == kinds["LLM"] == 1
        assert kinds["RERANKER"] in (0, 1)
        reranked += kinds["RERANKER"]
        assert all(s.parent == root.span_id for s in spans if s.parent)
        for child in spans:
            assert root.start <= child.start <= child.end <= root.end
        assert root.attrs["input.value"] and root.attrs["output.value"]
        assert root.attrs["session.id"] and root.attrs["user.id"]
        assert json.loads(root.attrs["metadata"])["intent"]
        assert root.resource["service.name"] in APPS
        assert root.end <= time.time_ns()
    assert reranked == summary.reranked > 0
    assert {s.resource["service.name"] for s in rec.spans} == APPS
    assert sum(summary.by_app.values()) == 300


def test_retrieval_embedding_and_llm_attributes_are_complete(run: tuple[Any, Receiver]) -> None:
    summary, rec = run
    dims = set()
    models: Counter[str] = Counter()
    for s in rec.spans:
        kind = _kind(s)
        if kind == "RETRIEVER":
            for i in range(5):
                base = f"retrieval.documents.{i}.document."
                assert s.attrs[base + "id"]
                assert 0.0 <= s.attrs[base + "score"] <= 1.0
                assert 300 <= len(s.attrs[base + "content"]) <= 500
            assert "retrieval.documents.5.document.id" not in s.attrs
            scores = [s.attrs[f"retrieval.documents.{i}.document.score"] for i in range(5)]
            assert scores == sorted(scores, reverse=True)
        elif kind == "EMBEDDING":
            vector = s.attrs["embedding.embeddings.0.embedding.vector"]
            dims.add(len(vector))
            assert all(math.isfinite(x) for x in vector)
            assert math.isclose(math.fsum(x * x for x in vector), 1.0, rel_tol=1e-3)
            assert s.attrs["embedding.model_name"]
        elif kind == "RERANKER":
            assert s.attrs["reranker.output_documents.0.document.id"]
            assert "reranker.input_documents.4.document.id" in s.attrs
        elif kind == "LLM":
            models[s.attrs["llm.model_name"]] += 1
            prompt, completion = s.attrs["llm.token_count.prompt"], s.attrs["llm.token_count.completion"]
            assert prompt > 0 and completion > 0
            assert s.attrs["llm.token_count.total"] == prompt + completion
            first_token = [t for name, t in s.events if name == FIRST_TOKEN_EVENT]
            if first_token:
                assert s.start < first_token[0] < s.end
            else:
                assert 0 < s.attrs[TTFT_ATTRIBUTE] * 1e6 < s.end - s.start
    assert dims == {256}
    assert models["gpt-4o-mini"] > 0 and models["gpt-4o"] > 0
    assert models[LOCAL_MODEL] == summary.unpriced > 0


def test_feedback_and_regenerations_reach_the_feedback_api(run: tuple[Any, Receiver]) -> None:
    summary, rec = run
    traces = rec.traces()
    kinds = Counter(f["kind"] for f in rec.feedback)
    assert len(rec.feedback) == summary.feedback_sent
    assert kinds["down"] == summary.thumbs_down > 0
    assert kinds["up"] == summary.thumbs_up > 0
    assert kinds["regenerate"] == summary.regenerate_events > 0
    assert len({f["event_id"] for f in rec.feedback}) == len(rec.feedback)
    assert all(f["trace_id"] in traces for f in rec.feedback)
    assert all(f.get("reason") for f in rec.feedback if f["kind"] == "down")
    assert summary.feedback_failed == 0
    assert set(rec.auth) == {"Bearer demo-key"}

    roots = [s for spans in traces.values() for s in spans if not s.parent]
    flagged = [r for r in roots if r.attrs.get(REGENERATION_ATTRIBUTE) is True]
    assert len(flagged) == summary.regeneration_attributes > 0
    by_session: dict[str, list[WireSpan]] = defaultdict(list)
    for r in sorted(roots, key=lambda r: r.end):
        by_session[r.attrs["session.id"]].append(r)
    # each regenerated trace has a later trace in the same session asking the same question
    for f in (f for f in rec.feedback if f["kind"] == "regenerate"):
        original = next(s for s in traces[f["trace_id"]] if not s.parent)
        later = [r for r in by_session[original.attrs["session.id"]] if r.end > original.end]
        assert any(r.attrs["input.value"] == original.attrs["input.value"] for r in later)
    # implicit re-asks: consecutive near-identical questions in one session, without any flag
    reasks = 0
    for session in by_session.values():
        for prev, cur in itertools.pairwise(session):
            a, b = word_set(prev.attrs["input.value"]), word_set(cur.attrs["input.value"])
            same = cur.attrs["input.value"] == prev.attrs["input.value"]
            if not same and len(a & b) / len(a | b) >= 0.8 and REGENERATION_ATTRIBUTE not in cur.attrs:
                reasks += 1
    assert reasks == summary.reasks > 0


def test_topic_shift_changes_release_and_lowers_retrieval_scores(run: tuple[Any, Receiver]) -> None:
    summary, rec = run
    assert summary.shifted > 0
    top1: dict[str, list[float]] = defaultdict(list)
    for s in rec.spans:
        if _kind(s) == "RETRIEVER" and s.resource["service.name"] == "support-bot":
            top1[s.resource["service.version"]].append(s.attrs["retrieval.documents.0.document.score"])
    assert set(top1) == {"2.3.0", "2.4.0"}
    mean = {k: sum(v) / len(v) for k, v in top1.items()}
    assert mean["2.4.0"] < mean["2.3.0"]


def _content(rec: Receiver) -> list[tuple[str, str, str]]:
    rows = []
    for s in rec.spans:
        stable = {k: v for k, v in s.attrs.items() if k != "session.id"}
        rows.append((s.trace_id, s.name, json.dumps(stable, sort_keys=True)))
    return sorted(rows)


def test_same_seed_sends_the_same_traffic(receiver: Receiver) -> None:
    receiver.clear()
    run_demo(receiver.url, requests=40, rate=0, seed=11, fixed_ids=True)
    first, first_feedback = _content(receiver), list(receiver.feedback)
    receiver.clear()
    run_demo(receiver.url, requests=40, rate=0, seed=11, fixed_ids=True)
    assert _content(receiver) == first
    assert receiver.feedback == first_feedback
    receiver.clear()
    run_demo(receiver.url, requests=40, rate=0, seed=12, fixed_ids=True)
    assert _content(receiver) != first
    receiver.clear()


def test_trace_and_feedback_ids_are_fresh_per_run_by_default(receiver: Receiver) -> None:
    """A second `make demo` on the same data directory must not be deduplicated away."""
    receiver.clear()
    run_demo(receiver.url, requests=40, rate=0, seed=3)
    first, first_events = set(receiver.traces()), {f["event_id"] for f in receiver.feedback}
    receiver.clear()
    run_demo(receiver.url, requests=40, rate=0, seed=3)
    second, second_events = set(receiver.traces()), {f["event_id"] for f in receiver.feedback}
    receiver.clear()
    assert len(first) == len(second) == 40
    assert not first & second
    assert first_events and len(first_events) == len(second_events)
    assert not first_events & second_events


def test_refused_feedback_is_counted_and_the_cli_says_so(
    receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    args = parser.parse_args(["--target", receiver.url, "--requests", "60", "--rate", "0", "--seed", "5"])
    receiver.clear()
    assert main(args) == 0
    sent = _sent(capsys.readouterr().out)
    assert sent["requests sent (one trace each)"].startswith("60 (")
    assert sent["feedback refused"] == "0"
    down, up = (int(n) for n in sent["thumbs down / up sent"].split(" / "))
    regenerate_events = int(sent["regenerations asked for"].split("(")[1].split()[0])
    receiver.clear()
    receiver.refuse_feedback = True
    assert main(args) == 1
    # the same seed sends the same feedback, and every post of it was refused
    assert _sent(capsys.readouterr().out)["feedback refused"] == str(down + up + regenerate_events)
    assert len(receiver.traces()) == 60
    receiver.clear()


def _sent(out: str) -> dict[str, str]:
    """The "what the demo sent" lines, label -> value (they are separated by two spaces or more)."""
    rows = [line.strip().split("  ", 1) for line in out.splitlines() if line.startswith("  ")]
    return {label: value.strip() for label, value in rows}


def test_unreachable_target_is_a_connection_error(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # nothing listens on the port once the socket is closed
    with pytest.raises(ConnectionError, match="cannot reach"):
        run_demo(f"http://127.0.0.1:{port}", requests=5, rate=0, seed=0, timeout_s=2)
    parser = argparse.ArgumentParser()
    add_demo_arguments(parser)
    assert main(parser.parse_args(["--target", f"http://127.0.0.1:{port}", "--requests", "5"])) == 2
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("target", "kwargs"),
    [
        ("ftp://127.0.0.1:1", {}),
        ("http://127.0.0.1:1", {"rate": -1.0}),
        ("http://127.0.0.1:1", {"rate": math.inf}),
        ("http://127.0.0.1:1", {"requests": 0}),
        ("http://127.0.0.1:1", {"shift_after": -1}),
        ("http://127.0.0.1:1", {"timeout_s": 0}),
    ],
)
def test_bad_arguments_are_value_errors(target: str, kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"requests": 5, "rate": 0.0, "seed": 0, **kwargs}
    with pytest.raises(ValueError):
        run_demo(target, **args)
