"""A deterministic OpenAI-compatible server for the conformance clients.

Endpoints: `POST /v1/chat/completions` (plain JSON and `stream=true` SSE, with the usage chunk
that `stream_options.include_usage` asks for), `POST /v1/embeddings` (float or base64),
`GET /v1/models`, a ColBERTv2 search server (`POST /colbertv2/index` with the corpus, then
`GET /colbertv2?query=..&k=..`, answering `{"topk": [{"pid", "text", "rank", "score", "prob"}]}`
as DSPy's `dspy.ColBERTv2` client reads it), and `GET /_stub/calls`, the log of every model and
search call served, with the answer, the token counts reported and the passages returned, so a
client's manifest can say what the monitor must have seen.

Everything is a pure function of the request, so two runs of a client produce the same traces:

* the answer is `Answer: <first sentence of the context> (ref <hash>)`, where the context is the
  text after the last `Context:` of the last user (else system) message, and the hash is of all
  messages, which keeps answers to different prompts apart;
* a prompt written by DSPy's ChatAdapter (its user message ends "Respond with the corresponding
  output fields, starting with the field `[[ ## a ## ]]`...") is answered in that format, each
  output field under its `[[ ## name ## ]]` marker, then `[[ ## completed ## ]]`; the `answer`
  field (else the last one) is that answer, from the first passage of the `[[ ## context ## ]]`
  input field;
* prompt tokens are the words of all messages plus 3 per message, completion tokens the words of
  the reply (`content` in the call log; `answer` is the same text except for a DSPy reply);
  embedding tokens the words of the input;
* an embedding is a hashed bag of words in `DIM` dimensions, unit length, so a question ranks
  the documents it shares words with first and cosine scores are reproducible; the ColBERTv2
  search ranks the indexed passages by that cosine (its `score`).

Run it in a thread (`Stub`, tests) or as a process from the repository root:
`python -m tests.conformance.openai_stub --port N`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import math
import re
import struct
import threading
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from tests.openai_wire import KEEP_ALIVE_S, LoopbackServer, chat_completion, token_usage

DIM = 16
CREATED = 1_764_000_000  # fixed, so the same request gets a byte-identical response
FIRST_TOKEN_DELAY_S = 0.15
CHUNK_DELAY_S = 0.01
_STOP_TEXT = (
    "a an and are at be by do does for from how in is it of on or the to was what when where "
    "which who why with you your"
)
_STOP_WORDS = frozenset(_STOP_TEXT.split())
_WORD = re.compile(r"[a-z0-9]+")
_CONTEXT = re.compile(r"context\s*:", re.IGNORECASE)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def embed(text: str) -> list[float]:
    """Unit vector of hashed, signed word counts, plus a small constant so no text maps to zero."""
    vec = [0.0] * DIM
    vec[0] = 0.1
    for word in words(text):
        if word in _STOP_WORDS:
            continue
        digest = hashlib.sha256(word.encode()).digest()
        vec[digest[0] % DIM] += 1.0 if digest[1] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    return [v / norm for v in vec]


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of content parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def first_sentence(text: str) -> str:
    text = " ".join(text.split())
    match = re.search(r"[.!?](\s|$)", text)
    return text[: match.end()].strip() if match else text


def answer_for(messages: list[dict[str, Any]]) -> str:
    by_role: dict[str, str] = {}
    for message in messages:
        by_role[str(message.get("role"))] = message_text(message)
    prompt = by_role.get("user", "")
    if not _CONTEXT.search(prompt):
        prompt = by_role.get("system", prompt)
    parts = _CONTEXT.split(prompt)
    context = parts[-1] if len(parts) > 1 else prompt
    ref = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:6]
    return f"Answer: {first_sentence(context)} (ref {ref})"


_DSPY_OUTPUTS = re.compile(r"Respond with the corresponding output fields, starting with the field (.*)")
_DSPY_MARKER = re.compile(r"\[\[ ## (\w+) ## \]\]")
_DSPY_PASSAGE = re.compile(r"^\[\d+\] «")


def dspy_output_fields(messages: list[dict[str, Any]]) -> list[str] | None:
    """The output fields a DSPy ChatAdapter prompt asks for, in order; None for any other prompt."""
    users = [message_text(m) for m in messages if m.get("role") == "user"]
    match = _DSPY_OUTPUTS.search(users[-1]) if users else None
    if match is None:
        return None
    return [name for name in _DSPY_MARKER.findall(match.group(1)) if name != "completed"]


def dspy_field(text: str, name: str) -> str:
    """The value of input field `name` in a ChatAdapter user message (up to the next marker)."""
    parts = re.split(r"^\[\[ ## (\w+) ## \]\]$", text, flags=re.MULTILINE)
    for field, value in zip(parts[1::2], parts[2::2], strict=True):
        if field == name:
            return value.strip()
    return ""


def first_passage(value: str) -> str:
    """The first passage of a ChatAdapter `list[str]` field: a JSON list, or `[1] «text»` lines."""
    try:
        parsed = json.loads(value)
    except ValueError:
        return _DSPY_PASSAGE.sub("", value)
    if isinstance(parsed, list) and parsed:
        return str(parsed[0])
    return value


def dspy_reply(messages: list[dict[str, Any]], fields: list[str]) -> tuple[str, str]:
    """(the whole reply, the answer field's text) for a ChatAdapter prompt asking for `fields`."""
    user = [message_text(m) for m in messages if m.get("role") == "user"][-1]
    context = first_passage(dspy_field(user, "context") or dspy_field(user, "question"))
    ref = hashlib.sha256(json.dumps(messages, sort_keys=True).encode()).hexdigest()[:6]
    answer = f"Answer: {first_sentence(context)} (ref {ref})"
    answer_field = "answer" if "answer" in fields else fields[-1]
    values = {
        name: answer if name == answer_field else f"The context says so (ref {ref})." for name in fields
    }
    reply = "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items())
    return reply + "[[ ## completed ## ]]", answer


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(message_text(m).split()) + 3 for m in messages)


def create_app() -> FastAPI:
    app = FastAPI()
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()

    def log(call: dict[str, Any]) -> None:
        with lock:
            call["seq"] = len(calls)
            calls.append(call)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        messages = body.get("messages") or []
        model = str(body.get("model") or "gpt-4o-mini")
        fields = dspy_output_fields(messages)
        if fields:
            content, answer = dspy_reply(messages, fields)
        else:
            content = answer = answer_for(messages)
        usage = token_usage(prompt_tokens(messages), len(content.split()))
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        call_id = "chatcmpl-" + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:24]
        log(
            {
                "endpoint": "chat",
                "id": call_id,
                "model": model,
                "stream": stream,
                "usage_reported": include_usage or not stream,
                "messages": messages,
                "answer": answer,
                "content": content,
                **usage,
            }
        )
        if not stream:
            return JSONResponse(
                chat_completion(
                    call_id=call_id,
                    created=CREATED,
                    model=model,
                    content=content,
                    usage=usage,
                    system_fingerprint="fp_stub",
                )
            )

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            data = {
                "id": call_id,
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": model,
                "system_fingerprint": "fp_stub",
                "choices": [choice],
            }
            if include_usage:
                data["usage"] = None
            return f"data: {json.dumps(data)}\n\n"

        async def events() -> AsyncIterator[str]:
            # A first-token delay well above scheduling noise, so a measured TTFT is clearly > 0
            # and below the generation time. It comes before the role chunk, as with the real API
            # (which sends the role chunk with the first token), so that an instrumentation that
            # times the first chunk and one that times the first content agree.
            await asyncio.sleep(FIRST_TOKEN_DELAY_S)
            yield chunk({"role": "assistant", "content": ""})
            pieces = re.findall(r"\S+\s*", content)
            for i, piece in enumerate(pieces):
                if i:
                    await asyncio.sleep(CHUNK_DELAY_S)
                yield chunk({"content": piece})
            yield chunk({}, "stop")
            if include_usage:
                data = {
                    "id": call_id,
                    "object": "chat.completion.chunk",
                    "created": CREATED,
                    "model": model,
                    "system_fingerprint": "fp_stub",
                    "choices": [],
                    "usage": usage,
                }
                yield f"data: {json.dumps(data)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        body = await request.json()
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) else list(raw or [])
        if any(not isinstance(i, str) for i in inputs):
            # token-id input (tiktoken-chunked): the stub cannot read it, and a client sending
            # it would need tiktoken's encodings from the internet anyway
            return JSONResponse({"error": {"message": "stub accepts text input only"}}, 400)
        model = str(body.get("model") or "text-embedding-3-small")
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for index, text in enumerate(inputs):
            vector = embed(text)
            value: Any = base64.b64encode(struct.pack(f"<{DIM}f", *vector)).decode() if as_base64 else vector
            data.append({"object": "embedding", "index": index, "embedding": value})
        tokens = sum(len(t.split()) for t in inputs)
        log({"endpoint": "embeddings", "model": model, "input": inputs, "prompt_tokens": tokens})
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        names = ["gpt-4o-mini", "text-embedding-3-small"]
        return {
            "object": "list",
            "data": [{"id": n, "object": "model", "created": CREATED, "owned_by": "stub"} for n in names],
        }

    corpus: list[tuple[str, str]] = []

    @app.post("/colbertv2/index")
    async def colbert_index(request: Request) -> dict[str, int]:
        """Replaces the searched corpus: `{"passages": [{"pid": ..., "text": ...}]}`."""
        body = await request.json()
        with lock:
            corpus[:] = [(str(p["pid"]), str(p["text"])) for p in body["passages"]]
            return {"indexed": len(corpus)}

    @app.get("/colbertv2")
    async def colbert_search(query: str, k: int = 10) -> dict[str, Any]:
        vector = embed(query)
        with lock:
            scored = [
                (sum(a * b for a, b in zip(vector, embed(text), strict=True)), pid, text)
                for pid, text in corpus
            ]
        scored.sort(key=lambda item: (-item[0], item[1]))
        total = sum(math.exp(score) for score, _, _ in scored[:k]) or 1.0
        topk = [
            {"text": text, "pid": pid, "rank": rank, "score": score, "prob": math.exp(score) / total}
            for rank, (score, pid, text) in enumerate(scored[:k], start=1)
        ]
        log({"endpoint": "colbert", "query": query, "k": k, "topk": topk})
        return {"topk": topk}

    @app.get("/_stub/calls")
    async def get_calls(since: int = 0) -> list[dict[str, Any]]:
        with lock:
            return calls[since:]

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


class Stub(LoopbackServer):
    """The stub in a background thread on a free loopback port; a context manager."""

    def __init__(self) -> None:
        super().__init__(create_app(), name="OpenAI stub")


def main() -> None:
    parser = argparse.ArgumentParser(description="deterministic OpenAI-compatible stub")
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args()
    uvicorn.run(
        create_app(), host="127.0.0.1", port=args.port, log_level="warning", timeout_keep_alive=KEEP_ALIVE_S
    )


if __name__ == "__main__":
    main()
