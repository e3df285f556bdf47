"""What the OpenAI-speaking test servers share: the chat completion they answer with, and a uvicorn
app run in a background thread on a free loopback port.

`tests/fake_openai.py` (scripted replies), `tests/local_model.py` (a local model that judges what it
is asked) and `tests/conformance/openai_stub.py` (answers that are a pure function of the request)
build their replies with `chat_completion` and run as a `LoopbackServer`.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Self

import uvicorn
from fastapi import FastAPI

__all__ = ["KEEP_ALIVE_S", "LoopbackServer", "chat_completion", "token_usage"]

# Longer than any pause between a client's bursts: uvicorn's default (5 s) closes pooled connections that a
# client may be reusing at that instant, and the client then sees a read error the real API would not cause.
KEEP_ALIVE_S = 120


def token_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A reply's `usage`, with the total the API adds."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def chat_completion(
    *,
    call_id: str,
    created: int,
    model: str,
    content: str | None,
    usage: dict[str, int] | None,
    finish_reason: str = "stop",
    refusal: str | None = None,
    system_fingerprint: str | None = None,
) -> dict[str, Any]:
    """A non-streaming `chat.completion` body with one choice, the assistant's `content`; without a
    `usage` member when `usage` is None (as some servers answer)."""
    body: dict[str, Any] = {"id": call_id, "object": "chat.completion", "created": created, "model": model}
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    body["choices"] = [
        {
            "index": 0,
            "finish_reason": finish_reason,
            "logprobs": None,
            "message": {"role": "assistant", "content": content, "refusal": refusal},
        }
    ]
    if usage is not None:
        body["usage"] = usage
    return body


class LoopbackServer:
    """`app` served by uvicorn in a background thread on a free 127.0.0.1 port; a context manager.

    `url` is the server's root, `base_url` its OpenAI API root (`/v1`). `name` says which server did
    not start, if one does not within 10 s."""

    def __init__(self, app: FastAPI, *, name: str) -> None:
        self.name = name
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.base_url = f"{self.url}/v1"
        config = uvicorn.Config(
            app, log_level="warning", lifespan="off", ws="none", timeout_keep_alive=KEEP_ALIVE_S
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    def start(self) -> Self:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
