"""What every conformance client shares: the corpus, the questions and the manifest.

Standard library only: each client imports this from its own virtualenv. The corpus, the questions,
the models and the prompt are in `corpus.json`, which the Node clients' `common.mjs` reads too. Every
client app adds this folder to `sys.path` and does

    run = Run("langchain")                  # reads CONFORMANCE_MANIFEST / argv[1], OPENAI_BASE_URL
    provider.add_span_processor(run.roots)  # notes root spans; exports nothing, changes nothing
    for q in QUESTIONS:
        with run.question(q) as record:
            ...library call...
            record.result(answer=..., docs=[(id, score, content), ...])
    run.write()

The manifest says, per question, what a correct monitor must have stored: the query, the answer
the stub returned, the retrieved documents in order (scores where the library reports them), the
model and the token counts the stub reported (from the stub's own call log, the ground truth),
whether it streamed, and the trace ids of the root spans the library started for it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The corpus, questions, models and prompt, shared with the Node clients (common.mjs)
SPEC: dict[str, Any] = json.loads((Path(__file__).resolve().parent / "corpus.json").read_text("utf-8"))
CHAT_MODEL: str = SPEC["chat_model"]
EMBEDDING_MODEL: str = SPEC["embedding_model"]
APP_NAME_PREFIX: str = SPEC["app_name_prefix"]
TOP_K: int = SPEC["top_k"]

# Our own ids: a monitor that reports a library-made uuid or a content hash instead is wrong.
DOCS: list[tuple[str, str]] = [(d["id"], d["content"]) for d in SPEC["docs"]]


@dataclass(frozen=True)
class Question:
    text: str
    stream: bool


QUESTIONS = [Question(q["text"], stream=q["stream"]) for q in SPEC["questions"]]


def stub_url() -> str:
    base = os.environ["OPENAI_BASE_URL"].rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


def stub_calls(since: int = 0) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{stub_url()}/_stub/calls?since={since}", timeout=10) as response:
        calls: list[dict[str, Any]] = json.load(response)
        return calls


class RootSpans:
    """An OpenTelemetry span processor (duck-typed, so no SDK import here) that notes root spans.

    It only reads: the spans exported are exactly the library's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started: list[dict[str, str]] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if span.parent is None:
            with self._lock:
                self.started.append({"trace_id": f"{span.context.trace_id:032x}", "name": span.name})

    def on_end(self, span: Any) -> None:
        pass

    def _on_ending(self, span: Any) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def mark(self) -> int:
        with self._lock:
            return len(self.started)

    def since(self, mark: int) -> list[dict[str, str]]:
        with self._lock:
            return self.started[mark:]


class Record:
    def __init__(self, question: Question) -> None:
        self.question = question
        self.answer: str | None = None
        self.docs: list[dict[str, Any]] = []

    def result(self, *, answer: str, docs: list[tuple[str, float | None, str]]) -> None:
        self.answer = answer
        self.docs = [{"id": i, "score": s, "content": c} for i, s, c in docs]


class Run:
    def __init__(self, client: str) -> None:
        # the harness names the variant (openai_v2_http, openai_v2_grpc...), so each has its own app
        self.client = os.environ.get("CONFORMANCE_CLIENT", client)
        self.app = APP_NAME_PREFIX + self.client
        self.path = os.environ.get("CONFORMANCE_MANIFEST") or (sys.argv[1] if len(sys.argv) > 1 else "")
        if not self.path:
            raise SystemExit("usage: app.py MANIFEST_PATH (or CONFORMANCE_MANIFEST)")
        self.base_url = os.environ["OPENAI_BASE_URL"]
        self.roots = RootSpans()
        self.questions: list[dict[str, Any]] = []
        self.setup_roots: list[dict[str, str]] = []
        self._setup_mark = 0
        self._calls_seen = len(stub_calls())

    def end_setup(self) -> None:
        """Everything before this (index building, say) is not a user request."""
        self.setup_roots = self.roots.since(0)
        self._setup_mark = self.roots.mark()
        self._calls_seen = len(stub_calls())

    def searches(self) -> list[dict[str, Any]]:
        """The stub's ColBERTv2 searches in the question under way: the passages it served.

        A retriever that returns passages without their ids and scores (DSPy's `Retrieve`) leaves
        the app nothing else to say which documents it got."""
        return [c for c in stub_calls(self._calls_seen) if c["endpoint"] == "colbert"]

    @contextmanager
    def question(self, question: Question) -> Iterator[Record]:
        mark = self.roots.mark()
        record = Record(question)
        started = time.time()
        yield record
        calls = stub_calls(self._calls_seen)
        self._calls_seen += len(calls)
        chats = [c for c in calls if c["endpoint"] == "chat"]
        embeddings = [c for c in calls if c["endpoint"] == "embeddings"]
        if len(chats) != 1:
            raise AssertionError(f"expected one chat call for {question.text!r}, stub saw {len(chats)}")
        chat = chats[0]
        if record.answer != chat["answer"]:
            raise AssertionError(f"library returned {record.answer!r}, stub answered {chat['answer']!r}")
        if chat["stream"] != question.stream:
            raise AssertionError(f"{question.text!r}: stream={chat['stream']}, wanted {question.stream}")
        query_embeddings = [e for e in embeddings if e["input"] == [question.text]]
        self.questions.append(
            {
                "query": question.text,
                "stream": question.stream,
                "answer": record.answer,
                "model": chat["model"],
                "prompt_tokens": chat["prompt_tokens"] if chat["usage_reported"] else None,
                "completion_tokens": chat["completion_tokens"] if chat["usage_reported"] else None,
                "docs": record.docs,
                "embedding": {
                    "model": query_embeddings[0]["model"],
                    "tokens": query_embeddings[0]["prompt_tokens"],
                }
                if query_embeddings
                else None,
                "embedding_calls": len(embeddings),
                "root_spans": self.roots.since(mark),
                "wall_s": time.time() - started,
            }
        )

    def write(self) -> None:
        manifest = {
            "client": self.client,
            "app": self.app,
            "chat_model": CHAT_MODEL,
            "embedding_model": EMBEDDING_MODEL,
            "top_k": TOP_K,
            "corpus": [{"id": i, "content": c} for i, c in DOCS],
            "setup_root_spans": self.setup_roots,
            "questions": self.questions,
        }
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2)


class InMemoryStore:
    """The vector store of the clients without a framework: cosine similarity, brute force."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str, list[float]]] = []

    def add(self, ids: list[str], texts: list[str], vectors: list[list[float]]) -> None:
        self.items.extend(zip(ids, texts, vectors, strict=True))

    def search(self, vector: list[float], k: int) -> list[tuple[str, float, str]]:
        def cosine(a: list[float], b: list[float]) -> float:
            norm = (sum(x * x for x in a) * sum(y * y for y in b)) ** 0.5
            return sum(x * y for x, y in zip(a, b, strict=True)) / norm

        scored = [(doc_id, cosine(vector, vec), text) for doc_id, text, vec in self.items]
        return sorted(scored, key=lambda item: -item[1])[:k]


SYSTEM_PROMPT: str = SPEC["system_prompt"]


def user_prompt(question: str, contents: list[str]) -> str:
    return "Context:\n" + "\n\n".join(contents) + f"\n\nQuestion: {question}"


def chat_answer(client: Any, question: Question, contents: list[str]) -> str:
    """The answer of the chat model through an OpenAI SDK `client` (the clients that call the SDK
    themselves): the system prompt, then the question with the retrieved `contents`; streamed, with
    the usage chunk, when the question is."""
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(question.text, contents)},
    ]
    if not question.stream:
        completion = client.chat.completions.create(model=CHAT_MODEL, messages=messages)
        return str(completion.choices[0].message.content or "")
    answer = ""
    stream = client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            answer += chunk.choices[0].delta.content
    return answer
