"""A real OpenAI-compatible HTTP server for tests and benchmarks, scripted over HTTP.

It speaks `POST /v1/chat/completions` (non-streaming) on 127.0.0.1 and answers
from a script. Control endpoints:

* `POST /_control/replies` `{"replies": [Reply, ...]}` queues replies, used in order;
* `PUT /_control/default` `Reply | null` answers when the queue is empty (else 500
  "no reply scripted", so a test never passes on an answer it did not ask for);
* `PUT /_control/gullible` `Gullible | null` simulates a model that obeys injected
  text (see `Gullible`);
* `GET /_control/requests` lists every chat request received (body and headers);
* `POST /_control/reset` forgets all of the above.

`FakeOpenAI` runs it in a background thread (tests); `python -m tests.fake_openai
--port N` (from the repository root) runs it as its own process (benchmarks).
Replies can be delayed, carry any status and headers, omit usage, or be a raw
non-JSON body.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections import deque
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from tests.openai_wire import KEEP_ALIVE_S, LoopbackServer, chat_completion, token_usage

__all__ = ["FakeOpenAI", "Gullible", "Reply", "create_app"]


class Reply(BaseModel):
    """One scripted answer of the fake model."""

    model_config = ConfigDict(extra="forbid")

    status: int = 200
    content: str | None = Field(default=None, description="assistant message text of a 200 chat completion")
    raw_body: str | None = Field(default=None, description="sent as-is instead of a chat completion")
    headers: dict[str, str] = Field(default_factory=dict)
    delay_s: float = Field(default=0.0, ge=0)
    usage: bool = True
    prompt_tokens: int = 120
    completion_tokens: int = 30
    finish_reason: str = "stop"
    refusal: str | None = None


class Gullible(BaseModel):
    """A fake model that obeys `trigger` unless the prompt keeps it inside a well-formed data block.

    Like a naive reader, it takes the data block to run from the first `open_tag`
    to the first `close_tag` of the user message. If the trigger appears in the
    system message, outside that block, or inside a block that is not valid JSON
    (the data broke out of its string), the model obeys and answers `obeyed`.
    Otherwise the trigger is data, and the request takes the next scripted reply.
    """

    model_config = ConfigDict(extra="forbid")

    trigger: str
    open_tag: str
    close_tag: str
    obeyed: Reply

    def fooled(self, messages: list[dict[str, Any]]) -> bool:
        needle = self.trigger.casefold()
        for message in messages:
            text = str(message.get("content") or "")
            if message.get("role") != "user":
                if needle in text.casefold():
                    return True
                continue
            start = text.find(self.open_tag)
            end = text.find(self.close_tag, start + len(self.open_tag)) if start >= 0 else -1
            if start < 0 or end < 0:
                if needle in text.casefold():
                    return True
                continue
            outside = text[:start] + text[end + len(self.close_tag) :]
            if needle in outside.casefold():
                return True
            inside = text[start + len(self.open_tag) : end]
            try:
                json.loads(inside)
            except ValueError:
                if needle in inside.casefold():
                    return True
        return False


class _State:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.default: Reply | None = None
        self.gullible: Gullible | None = None
        self.requests: list[dict[str, Any]] = []


def _completion(reply: Reply, model: str) -> dict[str, Any]:
    return chat_completion(
        call_id=f"chatcmpl-{uuid.uuid4().hex[:16]}",
        created=int(time.time()),
        model=model,
        content=reply.content,
        usage=token_usage(reply.prompt_tokens, reply.completion_tokens) if reply.usage else None,
        finish_reason=reply.finish_reason,
        refusal=reply.refusal,
    )


def create_app() -> FastAPI:
    """A fresh fake server with its own script and request log."""
    app = FastAPI()
    state = _State()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        state.requests.append({"body": body, "headers": dict(request.headers)})
        reply: Reply | None
        if state.gullible is not None and state.gullible.fooled(body.get("messages", [])):
            reply = state.gullible.obeyed
        elif state.replies:
            reply = state.replies.popleft()
        else:
            reply = state.default
        if reply is None:
            return Response(json.dumps({"error": {"message": "no reply scripted"}}), 500)
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.raw_body is not None:
            content = reply.raw_body
        elif reply.status != 200:
            content = json.dumps({"error": {"message": f"scripted {reply.status}", "type": "fake"}})
        else:
            content = json.dumps(_completion(reply, str(body.get("model", "fake"))))
        return Response(content, reply.status, headers=reply.headers, media_type="application/json")

    @app.post("/_control/replies")
    async def add_replies(request: Request) -> dict[str, int]:
        state.replies.extend(Reply.model_validate(r) for r in (await request.json())["replies"])
        return {"queued": len(state.replies)}

    @app.put("/_control/default")
    async def set_default(request: Request) -> dict[str, bool]:
        raw = await request.json()
        state.default = None if raw is None else Reply.model_validate(raw)
        return {"ok": True}

    @app.put("/_control/gullible")
    async def set_gullible(request: Request) -> dict[str, bool]:
        raw = await request.json()
        state.gullible = None if raw is None else Gullible.model_validate(raw)
        return {"ok": True}

    @app.get("/_control/requests")
    async def requests() -> list[dict[str, Any]]:
        return state.requests

    @app.post("/_control/reset")
    async def reset() -> dict[str, bool]:
        state.__init__()  # type: ignore[misc]
        return {"ok": True}

    @app.get("/healthz")
    async def healthz() -> dict[str, bool]:
        return {"ok": True}

    return app


class FakeOpenAI(LoopbackServer):
    """The fake server in a background thread on a free loopback port; a context manager.

    Control methods go through the HTTP control endpoints, like any other client.
    """

    def __init__(self) -> None:
        super().__init__(create_app(), name="fake OpenAI server")
        self._control = httpx.Client(base_url=self.url, timeout=10.0)

    def stop(self) -> None:
        super().stop()
        self._control.close()

    def script(self, *replies: Reply) -> None:
        self._control.post(
            "/_control/replies", json={"replies": [r.model_dump() for r in replies]}
        ).raise_for_status()

    def set_default(self, reply: Reply | None) -> None:
        self._control.put("/_control/default", json=reply.model_dump() if reply else None).raise_for_status()

    def set_gullible(self, gullible: Gullible | None) -> None:
        self._control.put(
            "/_control/gullible", json=gullible.model_dump() if gullible else None
        ).raise_for_status()

    def requests(self) -> list[dict[str, Any]]:
        response = self._control.get("/_control/requests")
        response.raise_for_status()
        result: list[dict[str, Any]] = response.json()
        return result

    def reset(self) -> None:
        self._control.post("/_control/reset").raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=29300)
    args = parser.parse_args()
    uvicorn.run(
        create_app(),
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        lifespan="off",
        ws="none",
        timeout_keep_alive=KEEP_ALIVE_S,
    )


if __name__ == "__main__":
    main()
