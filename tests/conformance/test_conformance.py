"""Conformance: real, unmodified instrumentation libraries -> a real ragmon -> exactly what it stored.

Each client (tests/conformance/clients/<venv>/app.py) is a small RAG app written the library's
own way, run in its own virtualenv (build them with tests/conformance/build_venvs.sh) against a
real ragmon server and the deterministic OpenAI stub. It asks three questions (one streamed) and
writes a manifest of what a correct monitor must have seen; this module compares that with what
ragmon stored, field by field.

`EXPECT` says, per client, which facts its instrumentation actually sends (read off the captures
of `python -m tests.conformance.harness capture`): a monitor cannot store a score, a TTFT or a
query vector that was never sent, and must not invent one, so those are asserted to be absent.
Everything that is sent must be stored exactly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.harness import CLIENTS, Client, client_env, run_client
from tests.conformance.openai_stub import FIRST_TOKEN_DELAY_S, Stub
from tests.live_server import LiveServer, live_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent.parent
PRICES = json.loads((ROOT / "service" / "conventions" / "prices.json").read_text())["models"]
STORE_WAIT_S = 20


@dataclass(frozen=True)
class Expect:
    """What the client's instrumentation sends, beyond query, answer, documents, model and tokens."""

    scores: bool  # retrieval scores
    ttft: bool  # a first-token time on the streamed LLM call
    query_vector: bool  # the query's embedding vector
    embedding_tokens: bool  # token usage of the query's embedding call, inside the request's trace
    top_k: bool  # the retriever's k
    llm_tokens: bool = True  # token counts on the LLM call
    streamed_llm_tokens: bool = True  # token counts on the streamed LLM call
    documents: bool = True  # the retrieved documents (ids, contents); without them no scores either


EXPECT = {
    # OpenInference LangChain: the retriever reports contents (ids only in output.value's JSON), no
    # scores; LangChain's embeddings are not runnables, so there is no embedding span at all
    "langchain": Expect(scores=False, ttft=False, query_vector=False, embedding_tokens=False, top_k=False),
    # OpenInference LlamaIndex: documents with ids and scores, the query vector, a "First Token
    # Stream Event" on the streamed LLM span; embedding spans carry no token counts
    "llamaindex": Expect(scores=True, ttft=True, query_vector=True, embedding_tokens=False, top_k=False),
    # OpenLLMetry on LangChain: `vector_db_retrieve` span with contents in traceloop.entity.output
    # (ids only in the workflow span's output), the retriever's openai.embeddings span with tokens
    "traceloop": Expect(scores=False, ttft=False, query_vector=False, embedding_tokens=True, top_k=False),
    # OTel contrib openai-v2 + the app's GenAI retrieval span (gen_ai.retrieval.documents,
    # gen_ai.request.top_k); the answer only in log records; no TTFT attribute on streams
    "openai_v2_http": Expect(scores=True, ttft=False, query_vector=False, embedding_tokens=True, top_k=True),
    "openai_v2_grpc": Expect(scores=True, ttft=False, query_vector=False, embedding_tokens=True, top_k=True),
    "openai_v2_latest": Expect(
        scores=True, ttft=False, query_vector=False, embedding_tokens=True, top_k=True
    ),
    # phoenix.otel.register + OpenInference OpenAI: vectors, token counts on embeddings, TTFT event
    "phoenix_openai": Expect(scores=True, ttft=True, query_vector=True, embedding_tokens=True, top_k=False),
    # OpenInference Haystack: documents with ids and scores, the query vector; no embedding tokens
    # (only inside output.value's meta), no first-token event
    "haystack": Expect(scores=True, ttft=False, query_vector=True, embedding_tokens=False, top_k=False),
    # OpenInference DSPy: `Retrieve.forward` (passages only) around `ColBERTv2.__call__` (pid as id,
    # score, text); no embedding call at all (ColBERT searches server-side); the `LM.__call__` span
    # has the model and messages but no token counts, so its cost is unknown, not zero
    "dspy": Expect(
        scores=True, ttft=False, query_vector=False, embedding_tokens=False, top_k=False, llm_tokens=False
    ),
    # OpenLIT: Chroma's query is a `vectordb` span named `GET` with `db.vector.query.top_k` and
    # nothing of what it returned; the query from the embedding span's input messages; TTFT as
    # `gen_ai.server.time_to_first_token` (on every call: read on streamed ones); tokens everywhere
    "openlit": Expect(
        scores=False, ttft=True, query_vector=False, embedding_tokens=True, top_k=True, documents=False
    ),
    # Pydantic AI + the app's GenAI retrieval span: TTFT as `gen_ai.client.operation.time_to_first_chunk`,
    # the query vector in the embedding span's `embeddings` (input_type "query"), tokens everywhere
    "pydantic_ai": Expect(scores=True, ttft=True, query_vector=True, embedding_tokens=True, top_k=True),
    # OpenInference OpenAI for Node + the app's OpenInference RETRIEVER span: vectors (mixed int/double
    # arrays) but no token counts on embeddings, no first-token event, and no token counts on the
    # streamed call although the app asked for usage and got it: unknown usage
    "node_openai": Expect(
        scores=True,
        ttft=False,
        query_vector=True,
        embedding_tokens=False,
        top_k=False,
        streamed_llm_tokens=False,
    ),
    # OpenInference LangChain.js: contents and metadata (the scores the retriever put there); ids only
    # in output.value (`pageContent` documents); embeddings are not runnables, so no embedding span
    "node_langchain": Expect(
        scores=True, ttft=False, query_vector=False, embedding_tokens=False, top_k=False
    ),
}


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with Stub() as running:
        yield running


@pytest.fixture
def ragmon(tmp_path: Path) -> Iterator[LiveServer]:
    # one server per client: nothing another client sent can be counted for this one
    with live_server(tmp_path / "ragmon") as live:
        yield live


def stored_traces(server: LiveServer) -> list[dict[str, Any]]:
    with server.client() as http:
        response = http.get("/api/v1/traces", params={"limit": 1000})
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json()["items"]
    return items


def wait_stored(server: LiveServer, want: set[str]) -> list[dict[str, Any]]:
    """Every stored trace, once the wanted ids are all stored (or the wait is over)."""
    deadline = time.monotonic() + STORE_WAIT_S
    while True:
        server.flush()
        items = stored_traces(server)
        if want <= {t["trace_id"] for t in items} or time.monotonic() > deadline:
            return items
        time.sleep(0.2)


def cost(model: str, input_tokens: int, output_tokens: int) -> float:
    price_in, price_out = PRICES[model]
    return float(input_tokens * price_in + output_tokens * price_out) / 1e6


def check_question(
    record: dict[str, Any], question: dict[str, Any], manifest: dict[str, Any], expect: Expect
) -> list[str]:
    """Every way the stored trace differs from what the client sent, one line each."""
    problems: list[str] = []

    def same(what: str, got: Any, want: Any) -> None:
        if got != want:
            problems.append(f"{what}: stored {got!r}, want {want!r}")

    context = record.get("context", {})
    same("app", record["app"], manifest["app"])
    same("query", record["query"], question["query"])
    same("answer", record["answer"], question["answer"])
    same("flags.partial", record["flags"]["partial"], False)

    docs = question["docs"] if expect.documents else []
    same("chunk_ids (row)", record["chunk_ids"], [d["id"] for d in docs])
    chunks = context.get("chunks", [])
    same("chunk ids", [c["id"] for c in chunks], [d["id"] for d in docs])
    same("chunk ranks", [c["rank"] for c in chunks], list(range(len(docs))))
    same("chunk contents", [c["content"] for c in chunks], [d["content"] for d in docs])
    if expect.scores and docs:
        got_scores = [c["score"] for c in chunks]
        want_scores = [d["score"] for d in docs]
        if len(got_scores) != len(want_scores) or any(
            g is None or abs(g - w) > 1e-9 for g, w in zip(got_scores, want_scores, strict=False)
        ):
            problems.append(f"chunk scores: stored {got_scores!r}, want {want_scores!r}")
        if record["top1_score"] is None or abs(record["top1_score"] - want_scores[0]) > 1e-9:
            problems.append(f"top1_score: stored {record['top1_score']!r}, want {want_scores[0]!r}")
    else:
        same("chunk scores (none sent)", [c["score"] for c in chunks], [None] * len(docs))
    if expect.top_k:
        same("retrieval k", context.get("k"), manifest["top_k"])

    llm = [u for u in context.get("usage", []) if u["kind"] == "llm"]
    if expect.llm_tokens and (expect.streamed_llm_tokens or not question["stream"]):
        want_llm = [
            {
                "model": question["model"],
                "kind": "llm",
                "input_tokens": question["prompt_tokens"],
                "output_tokens": question["completion_tokens"],
                "cost_usd": cost(question["model"], question["prompt_tokens"], question["completion_tokens"]),
                "cost_source": "price_table",
            }
        ]
    else:
        # the call is known (its model too), its usage is not: unknown tokens, an unknown cost
        unknown = {
            "input_tokens": None,
            "output_tokens": None,
            "cost_usd": None,
            "cost_source": "unknown_usage",
        }
        want_llm = [{"model": question["model"], "kind": "llm", **unknown}]
    same("llm usage", _rounded(llm), _rounded(want_llm))
    embedding = [u for u in context.get("usage", []) if u["kind"] == "embedding"]
    input_tokens = want_llm[0]["input_tokens"]
    output_tokens = want_llm[0]["output_tokens"]
    total_cost = want_llm[0]["cost_usd"]
    if expect.embedding_tokens:
        tokens = question["embedding"]["tokens"]
        model = question["embedding"]["model"]
        want_embedding = [
            {
                "model": model,
                "kind": "embedding",
                "input_tokens": tokens,
                "output_tokens": 0,
                "cost_usd": cost(model, tokens, 0),
                "cost_source": "price_table",
            }
        ]
        same("embedding usage", _rounded(embedding), _rounded(want_embedding))
        input_tokens = None if input_tokens is None else input_tokens + tokens
        total_cost = None if total_cost is None else total_cost + want_embedding[0]["cost_usd"]
    else:
        same("embedding tokens (none sent)", sum(u["input_tokens"] or 0 for u in embedding), 0)
    same("input_tokens", record["input_tokens"], input_tokens)
    same("output_tokens", record["output_tokens"], output_tokens)
    same("cost_usd", _round(record["cost_usd"]), _round(total_cost))
    # every model here has a price: a call without token counts is unknown usage, not unpriced
    same("unpriced", record["unpriced"], False)
    same("usage_unknown", record["usage_unknown"], output_tokens is None)

    timings = record["timings"]
    for stage in ("total_s", "retrieval_s", "generation_s"):
        if not (isinstance(timings[stage], float) and timings[stage] > 0):
            problems.append(f"timings.{stage}: stored {timings[stage]!r}, want > 0")
    if all(isinstance(timings[s], float) for s in ("total_s", "retrieval_s", "generation_s")):
        if timings["retrieval_s"] > timings["total_s"] or timings["generation_s"] > timings["total_s"]:
            problems.append(f"timings: a stage is longer than the request: {timings}")
        if timings["retrieval_s"] + timings["generation_s"] > timings["total_s"] + 1e-3:
            problems.append(f"timings: retrieval and generation overlap: {timings}")
    if question["stream"]:
        # the stub holds the first chunk back FIRST_TOKEN_DELAY_S, so streamed generation took at least that
        generation = timings["generation_s"]
        if not (isinstance(generation, float) and generation >= FIRST_TOKEN_DELAY_S):
            problems.append(
                f"timings.generation_s (streamed): stored {generation!r}, want >= {FIRST_TOKEN_DELAY_S}"
            )
    ttft = timings["ttft_s"]
    if question["stream"] and expect.ttft:
        generation = timings["generation_s"] or 0.0
        if not (isinstance(ttft, float) and FIRST_TOKEN_DELAY_S <= ttft <= generation):
            problems.append(
                f"timings.ttft_s: stored {ttft!r}, want within [{FIRST_TOKEN_DELAY_S}, {generation}]"
            )
    else:
        same("timings.ttft_s (none sent)", ttft, None)

    want_vector = {"model": manifest["embedding_model"], "dim": 16} if expect.query_vector else None
    same("query_embedding", context.get("query_embedding"), want_vector)
    return problems


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 12)


def _rounded(usage: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**u, "cost_usd": _round(u["cost_usd"])} for u in usage]


@pytest.mark.parametrize("client", CLIENTS, ids=[c.name for c in CLIENTS])
def test_conformance(client: Client, stub: Stub, ragmon: LiveServer, tmp_path: Path) -> None:
    if not client.built:
        pytest.skip(client.build_hint)
    expect = EXPECT[client.name]
    env = client_env(
        client,
        otlp_http=ragmon.url,
        otlp_grpc=f"http://{ragmon.grpc_target}",
        openai_base_url=stub.base_url,
    )
    manifest_path = tmp_path / "manifest.json"
    result = run_client(client, manifest_path, env)
    assert result.returncode == 0, (
        f"{client.name} app failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    manifest = json.loads(manifest_path.read_text())

    questions = manifest["questions"]
    assert [q["stream"] for q in questions] == [False, True, False]
    for q in questions:
        # the library's own shape, not ragmon's: one root span per request, tokens reported
        assert len(q["root_spans"]) == 1, f"{client.name} started {q['root_spans']} for {q['query']!r}"
        assert q["prompt_tokens"] is not None, f"{client.name} did not ask for usage on {q['query']!r}"
    wanted = {q["root_spans"][0]["trace_id"]: q for q in questions}

    stored = wait_stored(ragmon, set(wanted))
    by_id = {t["trace_id"]: t for t in stored}
    problems: list[str] = []
    missing = [f"{tid} ({q['query']!r})" for tid, q in wanted.items() if tid not in by_id]
    if missing:
        problems.append(f"requests not stored: {missing}")
    extra = sorted(set(by_id) - set(wanted))
    if extra:
        setup = {r["trace_id"]: r["name"] for r in manifest["setup_root_spans"]}
        described = [f"{tid} (set-up span {setup[tid]!r})" if tid in setup else tid for tid in extra]
        problems.append(f"{len(extra)} stored traces are not user requests: {described}")

    with ragmon.client() as http:
        for trace_id, question in wanted.items():
            if trace_id not in by_id:
                continue
            response = http.get(f"/api/v1/traces/{trace_id}")
            response.raise_for_status()
            for problem in check_question(response.json(), question, manifest, expect):
                problems.append(f"[{question['query'][:40]}] {problem}")

    assert not problems, f"{client.name}: {len(problems)} problems\n" + "\n".join(problems)
