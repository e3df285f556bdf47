"""What redacting spans where ingest decodes them costs: CPU microseconds a trace, in one process.

The decoder's work on the bench payload (`payload.Batches`: four-span OpenInference RAG traces, five
documents of ~500 characters, a 256-float query vector), three ways:

* off: `otlp_body.decode_body`, what a decoder does with redaction off (unchanged by span redaction);
* on: `SpanRedaction.decode_traces`, the payload as it is (nothing to redact but the user id, hashed);
* on, secrets: the same with an e-mail address and a phone number in every question and document.

and, for scale, what a builder spends decoding and building the traces (`build_trace`), off and on
(re-encoded spans), and what the trace-level redaction (`Redactor.trace`, on the event loop) costs on
a trace built from raw spans (the JSON API's case, and every trace's before) and from redacted ones.

    python bench/ingest/span_redaction_bench.py [--bodies 20] [--traces-per-request 100] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from payload import Batches

from service.config import RedactionConfig
from service.conventions.pricing import PriceTable
from service.conventions.semconv import build_trace
from service.conventions.spans import AnySpan, WireSpan
from service.ingest import otlp_body, otlp_protobuf
from service.ingest.decoded import DecodedBatch
from service.ingest.span_redaction import SpanRedaction
from service.metrics import Metrics
from service.redaction import Redactor

KEY = b"bench-redaction-key-0123456789abcdef"
LIMIT = 1 << 30


def with_secrets(body: bytes) -> bytes:
    request = ExportTraceServiceRequest.FromString(body)
    for group in request.resource_spans:
        for scope in group.scope_spans:
            for span in scope.spans:
                for attribute in span.attributes:
                    if (
                        attribute.value.WhichOneof("value") == "string_value"
                        and len(attribute.value.string_value) > 20
                    ):
                        attribute.value.string_value += " Mail ann.lee@example.com or call +44 20 7946 0958."
    out: bytes = request.SerializeToString()
    return out


def per_trace_us(work: Callable[[], object], traces: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.process_time()
        work()
        times.append(time.process_time() - start)
    return statistics.median(times) / traces * 1e6


def build_all(batches: list[DecodedBatch]) -> list[object]:
    prices = PriceTable.default()
    groups: dict[str, list[AnySpan]] = {}
    for batch in batches:
        for item in batch.spans:
            groups.setdefault(item.trace_id, []).append(item)
    problems = DecodedBatch()
    return [
        build_trace(
            [otlp_protobuf.span_from_wire(i, problems) if isinstance(i, WireSpan) else i for i in items],  # type: ignore[misc]
            partial=False,
            prices=prices,
        )
        for items in groups.values()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--bodies", type=int, default=20)
    parser.add_argument("--traces-per-request", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    bodies = list(Batches(traces_per_request=args.traces_per_request).bodies(args.bodies))
    secret_bodies = [with_secrets(body) for body in bodies]
    traces = args.bodies * args.traces_per_request
    redaction = SpanRedaction(RedactionConfig(enabled=True), KEY)

    def decode(items: list[bytes]) -> list[DecodedBatch]:
        return [
            otlp_body.decode_body(b, json_body=False, encoding="", tenant="default", limit=LIMIT)
            for b in items
        ]

    def redacted(items: list[bytes]) -> list[DecodedBatch]:
        return [
            redaction.decode_traces(b, json_body=False, encoding="", tenant="default", limit=LIMIT)
            for b in items
        ]

    rows = [
        ("decode, redaction off", per_trace_us(lambda: decode(bodies), traces, args.repeat)),
        ("decode, redaction on", per_trace_us(lambda: redacted(bodies), traces, args.repeat)),
        ("decode, redaction on, secrets", per_trace_us(lambda: redacted(secret_bodies), traces, args.repeat)),
    ]
    off, on = decode(secret_bodies), redacted(secret_bodies)
    rows += [
        ("build, redaction off (secrets)", per_trace_us(lambda: build_all(off), traces, args.repeat)),
        ("build, redaction on (secrets)", per_trace_us(lambda: build_all(on), traces, args.repeat)),
    ]
    trace_level = Redactor(RedactionConfig(enabled=True), Metrics(), KEY)
    for name, batches in (("raw spans", off), ("redacted spans", on)):
        built = build_all(batches)
        rows.append(
            (
                f"trace-level redaction, {name}",
                per_trace_us(lambda built=built: [trace_level.trace(t) for t in built], traces, args.repeat),  # type: ignore[misc]
            )
        )
    print(f"{traces} traces ({args.bodies} bodies of {args.traces_per_request}), median of {args.repeat}")
    for name, us in rows:
        print(f"  {name:34s} {us:8.1f} us/trace")


if __name__ == "__main__":
    main()
