"""A trace open for long (an agent, a streamed LLM call) does not keep the write-ahead log from shrinking:
its buffered spans are logged again as one record, the trace is held there, and the older segments go;
a crash replays that record with every span the trace had (service/ingest/durable.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

from service.assemble import SpanAssembler
from service.config import AssemblerConfig, WalConfig
from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.ingest import otlp, otlp_protobuf
from service.ingest.durable import DurableAcks
from service.ingest.pool import IngestPool
from service.ingest.wal import LoggedRequest, WriteAheadLog
from service.metrics import Metrics
from tests.consumers import SinkConsumer
from tests.rag_spans import RagRequest, body

PRICES = PriceTable.default()


def _logged(data: bytes) -> LoggedRequest:
    return LoggedRequest(
        "otlp_traces", "default", data, media_type="application/x-protobuf", receiver="otlp_http"
    )


async def test_an_open_trace_is_logged_again_and_the_older_segments_go(tmp_path: Path) -> None:
    metrics, sink = Metrics(), SinkConsumer()
    # every group commit in a segment of its own, so what the watermark passes can go at once
    config = WalConfig(segment_bytes=1, checkpoint_s=3600, relog_after_s=60)
    durable = DurableAcks(config, tmp_path / "wal", metrics, 1.0)
    assembler = SpanAssembler(
        AssemblerConfig(idle_s=600),
        sink,
        IngestPool(0, PRICES, metrics).build_traces,
        metrics,
        ledger=durable,
    )
    durable.open_items = assembler.open_items  # type: ignore[assignment]
    await durable.start(lambda record: None)  # type: ignore[arg-type,return-value]
    agent = RagRequest(duration_s=900)
    try:
        for part in (agent.retrieve, agent.step(1, 30)):  # the agent's first steps, in two requests
            data = body(part)
            await durable.log(_logged(data), [("default", agent.trace_id)])
            await assembler.consume_spans(otlp_protobuf.screen_protobuf(data, "default").spans)
        others = [RagRequest(duration_s=1) for _ in range(3)]
        for other in others:  # traffic that is stored meanwhile
            data = body(other.retrieve, other.root)
            await durable.log(_logged(data), [("default", other.trace_id)])
            durable.done([("default", other.trace_id)])
        assert await durable.relog_open(now=1000.0) == 0
        assert durable.checkpoint() == 0  # the agent's first request (seq 0) holds every segment
        assert await durable.relog_open(now=1061.0) == 1
        assert durable.checkpoint() == 5  # both of its requests and the three stored ones: gone
        assert metrics.registry.get_sample_value("ragmon_wal_relogged_traces_total") == 1
        shutil.copytree(tmp_path / "wal", tmp_path / "copy")  # what a crash now would leave
        assert await durable.relog_open(now=1062.0) == 0  # held at the new record now: not again
        durable.wal.segment_max_age_s = 0.0
        await assembler.stop()  # the agent's trace is flushed: its version carries the new record
        assert len(sink.traces) == 1 and durable.ledger.open_holds(("default", agent.trace_id)) == []
        snapshot = durable.wal.segments
        durable.done([("default", agent.trace_id)])
        assert durable.checkpoint() == snapshot and len(durable.ledger) == 0
    finally:
        await durable.wal.close()

    # a crash after the relog and before the flush replays one record, with both of the agent's spans
    replayed = WriteAheadLog(tmp_path / "copy").open()
    assert [(r.seq, r.receiver) for r in replayed] == [(5, "relog")]
    spans = otlp_protobuf.screen_protobuf(replayed[0].body, "default").spans
    built = build_trace(
        [otlp_protobuf.span_from_wire(s, otlp.DecodedBatch()) for s in spans], partial=True, prices=PRICES
    )
    assert (built.trace_id, built.span_count) == (agent.trace_id, 2)
