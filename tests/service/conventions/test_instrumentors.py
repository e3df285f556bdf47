"""Spans from unmodified instrumentation: `phoenix.otel.register` and the OpenInference OpenAI instrumentor.

The app under test is a tiny RAG function: a hand-instrumented retriever and a
real OpenAI SDK call (to a local OpenAI-compatible server) that the
OpenInference instrumentor records. Everything goes to ragmon through
`phoenix.otel.register(endpoint=...)`, exactly as a Phoenix user would point
their app at ragmon.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from openinference.semconv.trace import DocumentAttributes, OpenInferenceSpanKindValues, SpanAttributes
from phoenix.otel import register

from tests.fake_openai import FakeOpenAI, Reply
from tests.live_server import LiveServer, live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("ragmon"), assembler={"grace_s": 0.05}) as live:
        yield live


@pytest.fixture(scope="module")
def fake_openai() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


def test_phoenix_register_and_openai_instrumentor(server: LiveServer, fake_openai: FakeOpenAI) -> None:
    fake_openai.set_default(
        Reply(content="The warranty lasts two years.", prompt_tokens=321, completion_tokens=9)
    )
    provider = register(
        endpoint=f"{server.url}/v1/traces",
        project_name="warranty-bot",
        set_global_tracer_provider=False,
        batch=False,
        verbose=False,
    )
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        tracer = provider.get_tracer("warranty-bot")
        client = OpenAI(
            api_key="test", base_url=fake_openai.base_url, max_retries=0, http_client=httpx.Client(timeout=10)
        )
        question = "How long is the warranty?"
        with tracer.start_as_current_span("answer") as root:
            root.set_attribute(
                SpanAttributes.OPENINFERENCE_SPAN_KIND, OpenInferenceSpanKindValues.CHAIN.value
            )
            root.set_attribute(SpanAttributes.INPUT_VALUE, question)
            with tracer.start_as_current_span("retrieve") as retriever:
                retriever.set_attribute(
                    SpanAttributes.OPENINFERENCE_SPAN_KIND, OpenInferenceSpanKindValues.RETRIEVER.value
                )
                prefix = f"{SpanAttributes.RETRIEVAL_DOCUMENTS}.0."
                retriever.set_attribute(prefix + DocumentAttributes.DOCUMENT_ID, "warranty-policy")
                retriever.set_attribute(prefix + DocumentAttributes.DOCUMENT_SCORE, 0.88)
                retriever.set_attribute(prefix + DocumentAttributes.DOCUMENT_CONTENT, "Warranty: two years.")
            completion = client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {"role": "system", "content": "Context: Warranty: two years."},
                    {"role": "user", "content": question},
                ],
            )
            answer = completion.choices[0].message.content or ""
            root.set_attribute(SpanAttributes.OUTPUT_VALUE, answer)
            trace_id = f"{root.get_span_context().trace_id:032x}"
        provider.force_flush()
    finally:
        instrumentor.uninstrument()
        provider.shutdown()

    server.flush()
    deadline = time.monotonic() + 10
    with server.client() as http:
        while (response := http.get(f"/api/v1/traces/{trace_id}")).status_code != 200:
            if time.monotonic() > deadline:
                pytest.fail(f"trace {trace_id} never stored: {response.text}")
            time.sleep(0.05)
            server.flush()
    record = response.json()
    text = json.dumps(record)
    assert question in text and "The warranty lasts two years." in text
    assert "warranty-policy" in text
    # the instrumentor's token counts reached the model usage and the metrics
    assert server.metric("ragmon_tokens_total", app="warranty-bot", model="gpt-4o-mini", kind="input") == 321
    assert server.metric("ragmon_tokens_total", app="warranty-bot", model="gpt-4o-mini", kind="output") == 9
    assert server.metric("ragmon_stage_duration_seconds_count", app="warranty-bot", stage="generation") == 1
