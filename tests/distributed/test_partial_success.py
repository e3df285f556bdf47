"""The same OTLP bytes get the same answer, and leave the same rows, embedded and distributed.

The issue behind it: in Kafka mode one span with a 10 MB attribute in a
50-trace request got 413 for all 50 (OTel exporters do not retry a 413, so 49
good traces were lost at the sender) while the embedded mode stored all 50;
and values out of range were changed silently (a token count of 1e30 stored
as 0, a NaN score as null), counted nowhere. Now both modes cut the oversize
text to fit (`service/ingest/span_size.py`) and drop each value out of range
on its own (`service/ingest/otlp.py`), and say so in `partial_success`.

Embedded: a real server in this process (SQLite). Distributed: `ragmon serve`
publishing to a real broker (tansu) and `ragmon worker` storing into real
PostgreSQL.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from sqlalchemy.pool import NullPool

from service.ingest.span_size import MAX_SPAN_BYTES, truncation_note
from tests.distributed.conftest import (
    PROTOBUF,
    IngestProcess,
    WorkerProcess,
    count_rows,
    distributed_settings,
    until,
)
from tests.distributed.traffic import otlp_body, trace_ids
from tests.live_server import live_server

pytestmark = pytest.mark.slow

ASSEMBLER = {"grace_s": 0.5, "timeout_s": 10}
BIG = 10 * 2**20  # bytes of the oversize attribute


def _oversize_request(ids: list[str]) -> bytes:
    """50 traces; the root span of the 8th carries a 10 MB answer (`output.value`)."""
    request = ExportTraceServiceRequest.FromString(otlp_body(ids))
    root = request.resource_spans[0].scope_spans[0].spans[7 * 3]  # root, retriever, LLM per trace
    assert root.trace_id.hex() == ids[7] and not root.parent_span_id
    for kv in root.attributes:
        if kv.key == "output.value":
            kv.value.string_value = "x" * BIG
    body: bytes = request.SerializeToString()
    return body


def _out_of_range_request(ids: list[str]) -> bytes:
    """5 traces: a token count of 1e30, a NaN and an infinite score, a negative time to first token,
    and one span whose end is before its start (that span alone is rejected)."""
    request = ExportTraceServiceRequest.FromString(otlp_body(ids))
    spans = request.resource_spans[0].scope_spans[0].spans
    retriever_0, llm_0, retriever_1 = spans[1], spans[2], spans[4]
    llm_0.attributes.add(key="llm.model_name").value.string_value = "gpt-4o-mini"
    llm_0.attributes.add(key="llm.token_count.prompt").value.double_value = 1e30
    llm_0.attributes.add(key="llm.token_count.completion").value.int_value = 40
    llm_0.attributes.add(key="ragmon.ttft_ms").value.double_value = -5.0
    for span, score in ((retriever_0, math.nan), (retriever_1, math.inf)):
        for kv in span.attributes:
            if kv.key == "retrieval.documents.0.document.score":
                kv.value.double_value = score
    late = spans[8]  # trace 2's LLM span
    late.end_time_unix_nano = late.start_time_unix_nano - 1
    body: bytes = request.SerializeToString()
    return body


def _post(client: httpx.Client, url: str, body: bytes) -> tuple[int, int, str]:
    """(HTTP status, partial_success.rejected_spans, partial_success.error_message)."""
    response = client.post(f"{url}/v1/traces", content=body, headers=PROTOBUF)
    answer = ExportTraceServiceResponse.FromString(response.content) if response.status_code == 200 else None
    if answer is None:
        return response.status_code, -1, response.text[:300]
    partial = answer.partial_success
    return response.status_code, partial.rejected_spans, partial.error_message


def _rows(url: str) -> dict[str, dict[str, Any]]:
    """Every stored trace by id, all columns but when it was stored."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT * FROM traces")).mappings().all()
    finally:
        engine.dispose()
    return {
        str(row["trace_id"]): {
            # SQLite hands JSON columns back as text, PostgreSQL as values
            k: json.loads(v) if k in ("chunk_ids", "chunk_scores") and isinstance(v, str) else v
            for k, v in row.items()
            if k not in ("created_at", "start_time")
        }
        for row in rows
    }


def test_the_same_bytes_get_the_same_answer_and_rows_embedded_and_distributed(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    ingests: Callable[[dict[str, Any]], IngestProcess],
    workers: Callable[..., WorkerProcess],
) -> None:
    oversize_ids, range_ids = trace_ids(55)[:50], trace_ids(55)[50:]
    oversize, out_of_range = _oversize_request(oversize_ids), _out_of_range_request(range_ids)
    assert len(oversize) > BIG

    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path, assembler=ASSEMBLER)
    ingest = ingests(settings)
    worker = workers(settings, "sinks")
    ingest.wait_ready()
    with httpx.Client(timeout=60) as client:
        distributed = [_post(client, ingest.url, oversize), _post(client, ingest.url, out_of_range)]
    until(lambda: count_rows(pg_url) == 55, timeout=90, what="55 traces stored by the worker")

    with live_server(tmp_path / "embedded", assembler={"grace_s": 0.05}) as live:
        with httpx.Client(timeout=60) as client:
            embedded = [_post(client, live.url, oversize), _post(client, live.url, out_of_range)]
        live.flush()
        embedded_rows = _rows(live.config.store_url)
        embedded_out_of_range = live.metric("ragmon_ingest_rejected_total", reason="out_of_range")
        embedded_truncated = live.metric("ragmon_ingest_truncated_values_total")
        embedded_invalid_time = live.metric("ragmon_ingest_rejected_total", reason="invalid_time")

    # the answers: 200 with partial_success, byte for byte the same in both modes
    assert embedded == distributed
    (status, rejected, message), (range_status, range_rejected, range_message) = embedded
    assert (status, rejected) == (200, 0)
    assert message.startswith("truncated 1 oversize attribute value: span ")
    assert f"output.value of {BIG:,} bytes was truncated to fit the {MAX_SPAN_BYTES:,}-byte limit" in message
    assert (range_status, range_rejected) == (200, 1)
    assert range_message.startswith(
        "rejected 1 of 15 spans (invalid_time=1); dropped 4 invalid attribute values (out_of_range=4)"
    )
    for field in ("llm.token_count.prompt", "ragmon.ttft_ms", "retrieval.documents.0.document.score"):
        assert field in range_message

    # what is stored: every trace, the same rows in both modes
    distributed_rows = _rows(pg_url)
    assert set(embedded_rows) == set(distributed_rows) == set(oversize_ids) | set(range_ids)
    differing = {
        (trace_id, column): (value, distributed_rows[trace_id][column])
        for trace_id, row in embedded_rows.items()
        for column, value in row.items()
        if distributed_rows[trace_id][column] != value
    }
    assert differing == {}
    big = embedded_rows[oversize_ids[7]]
    assert big["answer"].startswith("x" * 400_000) and big["answer"].endswith(truncation_note(BIG))
    assert len(big["answer"].encode()) < MAX_SPAN_BYTES
    assert all(embedded_rows[i]["answer"] == f"a {n}" for n, i in enumerate(oversize_ids) if n != 7)
    bad = embedded_rows[range_ids[0]]
    # the 1e30 count and the NaN score are absent, not 0: tokens unknown, so the call is not priced
    assert (bad["input_tokens"], bad["output_tokens"], bad["cost_usd"], bad["unpriced"]) == (
        0,
        40,
        None,
        True,
    )
    assert bad["chunk_scores"] == [None] and bad["ttft_s"] is None
    assert embedded_rows[range_ids[1]]["chunk_scores"] == [None]
    assert embedded_rows[range_ids[2]]["span_count"] == 2  # its LLM span alone was rejected
    assert embedded_rows[range_ids[3]]["chunk_scores"] == [0.9]

    # counted once, where the request was answered: never again by the worker that built the traces
    assert embedded_out_of_range == ingest.metric("ragmon_ingest_rejected_total", reason="out_of_range") == 4
    assert embedded_truncated == ingest.metric("ragmon_ingest_truncated_values_total") == 1
    assert embedded_invalid_time == ingest.metric("ragmon_ingest_rejected_total", reason="invalid_time") == 1
    assert worker.metric("ragmon_ingest_rejected_total", reason="out_of_range") == 0
    assert worker.metric("ragmon_ingest_truncated_values_total") == 0
    assert worker.metric("ragmon_traces_total") == 55
    # the operator is told, by trace and field, never by value
    log = ingest.log_path.read_text(errors="replace")
    assert "ingest dropped or truncated 1 attribute value, e.g. 'output.value' of span" in log
    assert "x" * 100 not in log


def test_a_json_api_record_too_large_for_one_kafka_record_is_rejected_alone(
    kafka_bootstrap: str,
    pg_url: str,
    tmp_path: Path,
    ingests: Callable[[dict[str, Any]], IngestProcess],
    workers: Callable[..., WorkerProcess],
) -> None:
    """Such a record used to reach the producer, fail its send (over `max_request_size`), mark the bus
    unavailable and keep ingest answering 503 for the whole batch. Now it alone is refused, with why."""
    settings = distributed_settings(kafka_bootstrap, pg_url, tmp_path, assembler=ASSEMBLER)
    ingest = ingests(settings)
    workers(settings, "sinks")
    ingest.wait_ready()
    ids = trace_ids(4)
    records = [
        {"trace_id": trace_id, "app": "shop", "query": f"q {n}", "answer": f"a {n}"}
        for n, trace_id in enumerate(ids)
    ]
    records[1]["retrieval"] = {"chunks": [{"id": f"c{i}", "content": "x" * 400_000} for i in range(3)]}
    with httpx.Client(timeout=60) as client:
        first = client.post(f"{ingest.url}/api/v1/traces", json={"traces": records[:3]})
        second = client.post(f"{ingest.url}/api/v1/traces", json={"traces": records[3:]})
    assert first.status_code == 200, first.text
    out = first.json()
    assert out["accepted"] == 2 and [r["index"] for r in out["rejected"]] == [1]
    assert "over the 900,000-byte limit of one trace" in out["rejected"][0]["error"]
    assert second.status_code == 200 and second.json()["accepted"] == 1
    until(lambda: count_rows(pg_url) == 3, timeout=60, what="3 traces stored")
    assert ingest.metric("ragmon_ingest_rejected_total", reason="too_large") == 1
