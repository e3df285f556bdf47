"""A local model server for the judge's tests: OpenAI-compatible chat completions on loopback, the way
Ollama, vLLM and llama.cpp's server answer them, with no network and no key.

It does not script replies: it reads the judge's data block (`<data>{...}</data>` in the user
message) and judges the answer itself, crudely (each sentence a claim, supported when its longer
words are all in the context), so whatever the judge asks, the reply is a function of it. What it
does with `response_format` is set by its mode:

* `structured`: honours `response_format` of type `json_schema`, as vLLM's guided decoding and
  llama.cpp's grammar do: the reply is built for the schema the request sent and validated against
  it (jsonschema) before it is sent; a request without such a schema gets a 400;
* `prose`: ignores `response_format`, as an older server or a model without structured output
  does, and answers in sentences ("The answer looks supported by the context.");
* `fenced`: ignores `response_format` but writes the verdict as JSON in a ```json fence after a
  sentence of prose, as chat-tuned models do when they are asked for JSON in words only.

`GET /_local/requests` lists every chat request received; `PUT /_local/mode` changes the mode.
`LocalModel` runs it in a background thread on a free port; a context manager (`openai_wire.py`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

import httpx
import jsonschema
from fastapi import FastAPI, Request, Response

from tests.openai_wire import LoopbackServer, chat_completion, token_usage

__all__ = ["LocalModel", "Mode"]

Mode = Literal["structured", "prose", "fenced"]
_DATA = re.compile(r"<data>\s*(\{.*\})\s*</data>", re.DOTALL)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z0-9]+")


def _judge(data: dict[str, Any]) -> dict[str, Any]:
    """A verdict in the judge's schema: each answer sentence a claim, supported when every word of
    four letters or more (digits: any) is in the context."""
    context = set(_WORD.findall(" ".join(data.get("context") or []).lower()))
    claims = [s.strip() for s in _SENTENCE.split(str(data.get("answer") or "")) if s.strip()]
    supported, unsupported = [], []
    for i, claim in enumerate(claims):
        needed = [w for w in _WORD.findall(claim.lower()) if len(w) >= 4 or w.isdigit()]
        (supported if all(w in context for w in needed) else unsupported).append(i)
    return {
        "claims": claims,
        "supported": supported,
        "unsupported": unsupported,
        "outcome": "scored" if claims else "no_claims",
        "failure_mode": "fabrication" if unsupported else "none",
        "context_sufficient": bool(context),
        "rationale": f"{len(supported)} of {len(claims)} sentences found in the context",
    }


def _completion(model: str, content: str, prompt_tokens: int) -> dict[str, Any]:
    return chat_completion(
        call_id=f"chatcmpl-local-{time.monotonic_ns()}",
        created=int(time.time()),
        model=model,
        content=content,
        usage=token_usage(prompt_tokens, len(content.split())),
    )


def create_app(state: dict[str, Any]) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        state["requests"].append(body)
        messages = body.get("messages") or []
        user = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        found = _DATA.search(user)
        verdict = _judge(json.loads(found.group(1)) if found else {})
        prompt_tokens = sum(len(str(m.get("content") or "").split()) for m in messages)
        model = str(body.get("model", "local"))
        mode: Mode = state["mode"]
        if mode == "prose":
            text = (
                f"The answer makes {len(verdict['claims'])} claims. "
                f"{len(verdict['supported'])} of them are supported by the context."
            )
        elif mode == "fenced":
            text = f"Here is my assessment:\n```json\n{json.dumps(verdict, indent=2)}\n```\nHope this helps."
        else:
            response_format = body.get("response_format") or {}
            schema = (response_format.get("json_schema") or {}).get("schema")
            if response_format.get("type") != "json_schema" or not isinstance(schema, dict):
                return Response(
                    json.dumps({"error": {"message": "this test server wants a json_schema"}}), 400
                )
            jsonschema.validate(verdict, schema)  # a reply outside the schema fails the request loudly
            state["validated"] += 1
            text = json.dumps(verdict)
        return Response(json.dumps(_completion(model, text, prompt_tokens)), media_type="application/json")

    @app.get("/_local/requests")
    async def requests() -> list[dict[str, Any]]:
        return list(state["requests"])

    @app.put("/_local/mode")
    async def set_mode(request: Request) -> dict[str, str]:
        state["mode"] = (await request.json())["mode"]
        return {"mode": state["mode"]}

    return app


class LocalModel(LoopbackServer):
    """The server in a background thread on a free loopback port (see the module docstring)."""

    def __init__(self, mode: Mode = "structured") -> None:
        self.state: dict[str, Any] = {"mode": mode, "requests": [], "validated": 0}
        super().__init__(create_app(self.state), name="local model server")

    def set_mode(self, mode: Mode) -> None:
        """Through the HTTP endpoint, like any other client of the server."""
        httpx.put(f"{self.url}/_local/mode", json={"mode": mode}).raise_for_status()

    @property
    def validated(self) -> int:
        """Replies validated against the schema the request sent."""
        return int(self.state["validated"])

    def requests(self) -> list[dict[str, Any]]:
        return list(self.state["requests"])
