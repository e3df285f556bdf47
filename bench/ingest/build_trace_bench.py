"""Micro-benchmark of `service.conventions.semconv.build_trace`: microseconds per trace, before and after.

The traces are recorded with the real OpenTelemetry SDK, exported with the
SDK's own protobuf encoder (`encode_spans`) and read back with ragmon's
decoder (`service.ingest.otlp.decode_protobuf`), so `build_trace` sees exactly what
the ingest path gives it. One trace is four spans, as OpenInference's
LangChain and OpenAI instrumentors write them: a CHAIN root (JSON input,
metadata, session and user), an EMBEDDING span with a 384-float query vector,
a RETRIEVER span with five documents of about 500 characters, and an LLM span
with chat messages and token counts.

`--baseline REV` (default: the last commit before the fast path) loads
`service/conventions/semconv.py` as it was at that git revision into a private module and
times it on the same traces; the script first checks that both give equal
traces, so the two numbers measure the same work.

    python bench/ingest/build_trace_bench.py [--traces 2000] [--repeat 5] [--baseline REV|none]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    MessageAttributes,
    OpenInferenceMimeTypeValues,
    OpenInferenceSpanKindValues,
    SpanAttributes,
)
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.baseline import load_module_at  # noqa: E402
from service.conventions.pricing import PriceTable  # noqa: E402
from service.conventions.semconv import build_trace  # noqa: E402
from service.conventions.spans import Span  # noqa: E402
from service.ingest.otlp_protobuf import decode_protobuf  # noqa: E402
from service.model import RagTrace  # noqa: E402

BASELINE_REV = "2946de3"  # service/conventions/semconv.py before it was split and made fast
KIND = SpanAttributes.OPENINFERENCE_SPAN_KIND
DIM = 384
DOCS = 5
DOC_CHARS = 500
NOW = datetime(2030, 1, 1, tzinfo=UTC)
BuildFn = Callable[..., RagTrace]
_WORDS = (
    *("refund", "order", "parcel", "invoice", "delivery", "warranty", "account", "password", "card"),
    *("shipping", "return", "policy", "customer", "support", "days", "window", "store", "credit"),
    *("exchange", "label", "courier", "tracking", "address"),
)


def _sentence(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    length = 0
    while length < chars:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)[:chars]


def record_traces(n: int, seed: int) -> list[list[Span]]:
    """`n` four-span RAG traces, recorded by the OTel SDK and decoded by ragmon, grouped by trace."""
    rng = random.Random(seed)
    memory = InMemorySpanExporter()
    provider = TracerProvider(
        resource=Resource.create({"service.name": "bench-rag", "service.version": "1.0"})
    )
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    for i in range(n):
        query = f"question {i}: " + _sentence(rng, 60)
        answer = _sentence(rng, 300)
        contents = [_sentence(rng, DOC_CHARS) for _ in range(DOCS)]
        with tracer.start_as_current_span("rag") as root:
            root.set_attribute(KIND, OpenInferenceSpanKindValues.CHAIN.value)
            root.set_attribute(SpanAttributes.INPUT_VALUE, json.dumps({"query": query, "history": []}))
            root.set_attribute(SpanAttributes.INPUT_MIME_TYPE, OpenInferenceMimeTypeValues.JSON.value)
            root.set_attribute(SpanAttributes.SESSION_ID, f"session-{i % 97}")
            root.set_attribute(SpanAttributes.USER_ID, f"user-{i % 53}@example.com")
            root.set_attribute(SpanAttributes.METADATA, json.dumps({"intent": "refunds", "release": "r-7"}))
            with tracer.start_as_current_span("embed") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.EMBEDDING.value)
                span.set_attribute(SpanAttributes.EMBEDDING_MODEL_NAME, "text-embedding-3-small")
                prefix = f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0."
                span.set_attribute(prefix + EmbeddingAttributes.EMBEDDING_TEXT, query)
                span.set_attribute(
                    prefix + EmbeddingAttributes.EMBEDDING_VECTOR, [rng.uniform(-1, 1) for _ in range(DIM)]
                )
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 14)
            with tracer.start_as_current_span("retrieve") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.RETRIEVER.value)
                span.set_attribute(SpanAttributes.INPUT_VALUE, query)
                for d, content in enumerate(contents):
                    prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{d}."
                    span.set_attribute(
                        prefix + DocumentAttributes.DOCUMENT_ID, f"doc-{rng.randrange(10_000)}"
                    )
                    span.set_attribute(prefix + DocumentAttributes.DOCUMENT_SCORE, round(0.9 - d * 0.1, 3))
                    span.set_attribute(prefix + DocumentAttributes.DOCUMENT_CONTENT, content)
                    span.set_attribute(
                        prefix + DocumentAttributes.DOCUMENT_METADATA, json.dumps({"source": f"kb/{d}.md"})
                    )
            with tracer.start_as_current_span("generate") as span:
                span.set_attribute(KIND, OpenInferenceSpanKindValues.LLM.value)
                span.set_attribute(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini-2024-07-18")
                messages = (
                    (
                        SpanAttributes.LLM_INPUT_MESSAGES,
                        0,
                        "system",
                        "Answer from the context.\n" + contents[0],
                    ),
                    (SpanAttributes.LLM_INPUT_MESSAGES, 1, "user", query),
                    (SpanAttributes.LLM_OUTPUT_MESSAGES, 0, "assistant", answer),
                )
                for key, index, role, content in messages:
                    span.set_attribute(f"{key}.{index}.{MessageAttributes.MESSAGE_ROLE}", role)
                    span.set_attribute(f"{key}.{index}.{MessageAttributes.MESSAGE_CONTENT}", content)
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 900)
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, 80)
                span.set_attribute(SpanAttributes.LLM_TOKEN_COUNT_TOTAL, 980)
                span.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
    provider.shutdown()
    body = encode_spans(memory.get_finished_spans()).SerializeToString()
    batch = decode_protobuf(body, "default")
    if batch.rejections:
        raise RuntimeError(f"decoder refused benchmark spans: {batch.error_message}")
    traces: dict[str, list[Span]] = {}
    for decoded in batch.spans:
        traces.setdefault(decoded.trace_id, []).append(decoded)
    return list(traces.values())


def load_baseline(rev: str) -> BuildFn:
    """`build_trace` from `service/conventions/semconv.py` (earlier `service/semconv.py`) at `rev`."""
    module = load_module_at(rev, "semconv_baseline", "service/conventions/semconv.py", "service/semconv.py")
    build: BuildFn = module.build_trace
    return build


def us_per_trace(
    candidates: Sequence[tuple[str, BuildFn]], traces: Sequence[list[Span]], prices: PriceTable, repeat: int
) -> list[tuple[str, float]]:
    """Best of `repeat` passes over all traces per candidate, in CPU microseconds per trace.

    Passes alternate between candidates and count this process's CPU time, not
    wall time, so a busy machine slows both alike instead of whichever ran
    while a neighbour was busy.
    """
    best = [float("inf")] * len(candidates)
    for _ in range(repeat):
        for i, (_, build) in enumerate(candidates):
            started = time.process_time()
            for spans in traces:
                build(spans, partial=False, prices=prices, now=NOW)
            best[i] = min(best[i], time.process_time() - started)
    return [
        (label, seconds / len(traces) * 1e6) for (label, _), seconds in zip(candidates, best, strict=True)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--baseline", default=BASELINE_REV, help="git revision to compare with, or 'none'")
    args = parser.parse_args(argv)
    traces = record_traces(args.traces, args.seed)
    prices = PriceTable.default()
    spans_per_trace = sum(len(t) for t in traces) / len(traces)
    print(f"{len(traces)} traces, {spans_per_trace:.1f} spans each, CPU time, best of {args.repeat} passes")
    candidates: list[tuple[str, BuildFn]] = []
    if args.baseline != "none":
        candidates.append((f"before ({args.baseline})", load_baseline(args.baseline)))
    candidates.append(("after (working tree)", build_trace))
    if len(candidates) == 2:
        (_, before), (_, after) = candidates
        for spans in traces:
            if before(spans, partial=False, prices=prices, now=NOW) != after(
                spans, partial=False, prices=prices, now=NOW
            ):
                raise RuntimeError("baseline and current build_trace disagree on a benchmark trace")
    results = us_per_trace(candidates, traces, prices, args.repeat)
    for label, us in results:
        print(f"{label:<24} {us:8.1f} us/trace  {1e6 / us:8.0f} traces/s per core")
    if len(results) == 2:
        print(f"speed-up {results[0][1] / results[1][1]:.1f}x")


if __name__ == "__main__":
    main()
