"""DSPy RAG program, traced by openinference-instrumentation-dspy over OTLP/HTTP.

The RAG module of DSPy's tutorials: `dspy.Retrieve` over a `dspy.ColBERTv2` search server (the
stub's `/colbertv2`, which the app indexes with the corpus during set-up) and a
`dspy.ChainOfThought` that answers from the passages through `dspy.LM("openai/...")` and the
ChatAdapter. The streamed question goes through `dspy.streamify` with a listener on `answer`.
Caches are off, so every question reaches the search server and the model.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import sys
import tempfile
import urllib.request
from pathlib import Path

# dspy opens its disk cache at import: keep it out of the home directory (it is switched off below)
if "DSPY_CACHEDIR" not in os.environ:
    os.environ["DSPY_CACHEDIR"] = tempfile.mkdtemp(prefix="dspy-cache-")
    atexit.register(shutil.rmtree, os.environ["DSPY_CACHEDIR"], ignore_errors=True)
# litellm fetches its model price map from the internet at the first call (three tries, some 12 s
# offline) unless told to use the copy it ships
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dspy
from common import CHAT_MODEL, DOCS, QUESTIONS, SYSTEM_PROMPT, TOP_K, Record, Run, stub_url
from openinference.instrumentation.dspy import DSPyInstrumentor
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


class GenerateAnswer(dspy.Signature):
    __doc__ = SYSTEM_PROMPT

    context: list[str] = dspy.InputField(desc="retrieved passages")
    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class RAG(dspy.Module):
    def __init__(self) -> None:
        super().__init__()
        self.retrieve = dspy.Retrieve(k=TOP_K)
        self.generate_answer = dspy.ChainOfThought(GenerateAnswer)

    def forward(self, question: str) -> dspy.Prediction:
        context = self.retrieve(question).passages
        prediction = self.generate_answer(context=context, question=question)
        return dspy.Prediction(context=context, answer=prediction.answer)


def index_corpus(url: str) -> None:
    """What building a ColBERT index is for a real server: done once, before any request."""
    body = json.dumps({"passages": [{"pid": doc_id, "text": text} for doc_id, text in DOCS]}).encode()
    request = urllib.request.Request(
        f"{url}/index", data=body, headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        if json.load(response)["indexed"] != len(DOCS):
            raise AssertionError("the ColBERTv2 stub did not index the corpus")


def ask_streamed(rag: RAG, question: str) -> tuple[str, list[str]]:
    """(the final prediction's answer, the context) of a streamed run, checking the streamed text."""
    listener = dspy.streaming.StreamListener(signature_field_name="answer")
    program = dspy.streamify(rag, stream_listeners=[listener], async_streaming=False)
    pieces: list[str] = []
    final = None
    for value in program(question=question):
        if isinstance(value, dspy.streaming.StreamResponse):
            pieces.append(value.chunk)
        elif isinstance(value, dspy.Prediction):
            final = value
    if final is None:
        raise AssertionError("streamify ended without a prediction")
    if not pieces or "".join(pieces).strip() != final.answer:
        raise AssertionError(f"streamed {''.join(pieces)!r}, prediction {final.answer!r}")
    return final.answer, list(final.context)


def record_result(run: Run, record: Record, answer: str, context: list[str]) -> None:
    """Ids and scores from what the search server served: `Retrieve` returns only the passages."""
    searches = run.searches()
    if len(searches) != 1:
        raise AssertionError(f"expected one ColBERTv2 search, the stub served {len(searches)}")
    topk = searches[0]["topk"]
    if [p["text"] for p in topk] != context:
        raise AssertionError(f"Retrieve returned {context!r}, the server served {topk!r}")
    record.result(answer=answer, docs=[(p["pid"], p["score"], p["text"]) for p in topk])


def main() -> None:
    run = Run("dspy")
    provider = TracerProvider(resource=Resource.create({"service.name": run.app}))
    provider.add_span_processor(run.roots)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    DSPyInstrumentor().instrument(tracer_provider=provider)

    # DSPy imports litellm at the first model call; do it here, so the first request is not slower
    import litellm  # noqa: F401

    colbert_url = f"{stub_url()}/colbertv2"
    index_corpus(colbert_url)
    dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)
    lm = dspy.LM(f"openai/{CHAT_MODEL}", api_base=run.base_url, api_key="sk-conformance", cache=False)
    # track_usage: DSPy then asks a streamed call for its usage chunk (stream_options.include_usage)
    dspy.configure(lm=lm, rm=dspy.ColBERTv2(url=colbert_url), track_usage=True)
    rag = RAG()
    run.end_setup()

    for question in QUESTIONS:
        with run.question(question) as record:
            if question.stream:
                answer, context = ask_streamed(rag, question.text)
            else:
                prediction = rag(question=question.text)
                answer, context = prediction.answer, list(prediction.context)
            record_result(run, record, answer, context)

    provider.shutdown()
    run.write()


if __name__ == "__main__":
    main()
