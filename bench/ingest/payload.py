"""OTLP protobuf request bodies for the ingest benchmark: identical RAG traces for every target.

One trace is four spans with OpenInference attributes: a CHAIN root, an
EMBEDDING span with a query vector, a RETRIEVER span with five documents of
about 500 characters, and an LLM span with token counts. A body holds
`traces_per_request` traces. `Batches(seed)` yields the same bodies, byte for
byte, on every call with the same arguments, apart from timestamps, which
are taken when a body is made so that traces look fresh to an assembler
that waits on span end times.

Bodies are built once as a protobuf template; each new body only rewrites
ids and timestamps, then serializes. That keeps the sender
from becoming the bottleneck of a 200k-trace run.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator

from openinference.semconv.trace import (
    DocumentAttributes,
    EmbeddingAttributes,
    OpenInferenceSpanKindValues,
    SpanAttributes,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, Span

from service.demo.corpus import TOPICS, build_corpus, embed_text

SPANS_PER_TRACE = 4
DOCS_PER_TRACE = 5
DOC_CHARS = 500
# (start, end) of the embedding, retrieval and LLM spans, in ns after the root starts
_CHILD_TIMES = ((2_000_000, 40_000_000), (45_000_000, 150_000_000), (160_000_000, 1_200_000_000))


def _kv(key: str, value: str | int | float | list[float]) -> KeyValue:
    if isinstance(value, bool):
        raise TypeError("booleans are not used in the benchmark payload")
    if isinstance(value, str):
        return KeyValue(key=key, value=AnyValue(string_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    any_value = AnyValue()
    any_value.array_value.values.extend(AnyValue(double_value=x) for x in value)
    return KeyValue(key=key, value=any_value)


class Batches:
    """Makes OTLP request bodies of `traces_per_request` four-span RAG traces each.

    Raises ValueError for non-positive sizes.
    """

    def __init__(self, *, seed: int = 0, traces_per_request: int = 100, dim: int = 256) -> None:
        if traces_per_request < 1 or dim < 8:
            raise ValueError("traces_per_request must be >= 1 and dim >= 8")
        self.seed = seed
        self.traces_per_request = traces_per_request
        self.dim = dim
        corpus = build_corpus(dim=dim)
        docs = corpus.documents
        # every document padded to ~500 characters with the text of its neighbour
        self._contents = [
            (d.content + " " + docs[(i + 1) % len(docs)].content)[:DOC_CHARS] for i, d in enumerate(docs)
        ]
        self._ids = [d.id for d in docs]
        rng = random.Random(seed)
        self._queries = []
        for _ in range(64):
            topic = TOPICS[rng.randrange(len(TOPICS))]
            binding = {k: v[rng.randrange(len(v))] for k, v in topic.slots.items()}
            query = topic.questions[rng.randrange(len(topic.questions))].format(**binding)
            self._queries.append((query, [round(x, 6) for x in embed_text(query, dim).tolist()]))
        self._template = self._build_template(rng)

    def _build_template(self, rng: random.Random) -> ExportTraceServiceRequest:
        request = ExportTraceServiceRequest()
        rs = request.resource_spans.add()
        rs.resource.attributes.extend([_kv("service.name", "bench-rag"), _kv("service.version", "1.0.0")])
        scope: ScopeSpans = rs.scope_spans.add()
        scope.scope.name = "ragmon.bench"
        kind = SpanAttributes.OPENINFERENCE_SPAN_KIND
        for t in range(self.traces_per_request):
            query, vector = self._queries[t % len(self._queries)]
            root = scope.spans.add(name="rag.query", kind=Span.SPAN_KIND_INTERNAL)
            root.attributes.extend(
                [
                    _kv(kind, OpenInferenceSpanKindValues.CHAIN.value),
                    _kv(SpanAttributes.INPUT_VALUE, query),
                    _kv(SpanAttributes.OUTPUT_VALUE, "According to the handbook, " + self._contents[t][:180]),
                    _kv(SpanAttributes.SESSION_ID, f"bench-session-{t % 17}"),
                    _kv(SpanAttributes.USER_ID, f"bench-user-{t % 23}"),
                    _kv(SpanAttributes.METADATA, json.dumps({"intent": TOPICS[t % len(TOPICS)].intent})),
                ]
            )
            embed = scope.spans.add(name="embed_query", kind=Span.SPAN_KIND_INTERNAL)
            base = f"{SpanAttributes.EMBEDDING_EMBEDDINGS}.0."
            embed.attributes.extend(
                [
                    _kv(kind, OpenInferenceSpanKindValues.EMBEDDING.value),
                    _kv(SpanAttributes.EMBEDDING_MODEL_NAME, "text-embedding-3-small"),
                    _kv(base + EmbeddingAttributes.EMBEDDING_TEXT, query),
                    _kv(base + EmbeddingAttributes.EMBEDDING_VECTOR, vector),
                ]
            )
            retrieve = scope.spans.add(name="retrieve", kind=Span.SPAN_KIND_INTERNAL)
            attrs = [
                _kv(kind, OpenInferenceSpanKindValues.RETRIEVER.value),
                _kv(SpanAttributes.INPUT_VALUE, query),
            ]
            picks = rng.sample(range(len(self._ids)), DOCS_PER_TRACE)
            for rank, doc in enumerate(picks):
                prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.{rank}."
                attrs += [
                    _kv(prefix + DocumentAttributes.DOCUMENT_ID, self._ids[doc]),
                    _kv(prefix + DocumentAttributes.DOCUMENT_SCORE, round(0.9 - 0.05 * rank, 3)),
                    _kv(prefix + DocumentAttributes.DOCUMENT_CONTENT, self._contents[doc]),
                ]
            retrieve.attributes.extend(attrs)
            llm = scope.spans.add(name="generate", kind=Span.SPAN_KIND_INTERNAL)
            llm.attributes.extend(
                [
                    _kv(kind, OpenInferenceSpanKindValues.LLM.value),
                    _kv(SpanAttributes.LLM_MODEL_NAME, "gpt-4o-mini"),
                    _kv(SpanAttributes.INPUT_VALUE, query),
                    _kv(SpanAttributes.OUTPUT_VALUE, "According to the handbook, " + self._contents[t][:180]),
                    _kv(SpanAttributes.LLM_TOKEN_COUNT_PROMPT, 700 + t),
                    _kv(SpanAttributes.LLM_TOKEN_COUNT_COMPLETION, 60 + t % 40),
                    _kv(SpanAttributes.LLM_TOKEN_COUNT_TOTAL, 760 + t + t % 40),
                ]
            )
        return request

    def bodies(self, count: int) -> Iterator[bytes]:
        """`count` serialized request bodies; trace and span ids follow from the seed and never repeat."""
        rng = random.Random(self.seed * 1_000_003 + 7)
        spans = self._template.resource_spans[0].scope_spans[0].spans
        for _ in range(count):
            now = time.time_ns()
            for t in range(self.traces_per_request):
                trace_id = rng.getrandbits(128).to_bytes(16, "big")
                root, embed, retrieve, llm = spans[t * SPANS_PER_TRACE : (t + 1) * SPANS_PER_TRACE]
                start = now - 1_500_000_000
                root.trace_id = trace_id
                root.span_id = rng.getrandbits(64).to_bytes(8, "big")
                root.start_time_unix_nano = start
                root.end_time_unix_nano = start + 1_250_000_000
                for child, (begin, end) in zip((embed, retrieve, llm), _CHILD_TIMES, strict=True):
                    child.trace_id = trace_id
                    child.span_id = rng.getrandbits(64).to_bytes(8, "big")
                    child.parent_span_id = root.span_id
                    child.start_time_unix_nano = start + begin
                    child.end_time_unix_nano = start + end
            yield self._template.SerializeToString()
