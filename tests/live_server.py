"""A real ragmon server (uvicorn + gRPC) in a background thread, on free loopback ports."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from service.api.app import create_app
from service.api.http_server import uvicorn_config
from service.config import RagmonConfig, load_config
from service.pipeline import Pipeline


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class LiveServer:
    url: str
    grpc_target: str
    config: RagmonConfig
    server: uvicorn.Server
    loop: asyncio.AbstractEventLoop

    @property
    def pipeline(self) -> Pipeline:
        pipeline: Pipeline = self.server.config.app.state.pipeline  # type: ignore[attr-defined]
        return pipeline

    def call(self, coro: Any, timeout: float = 30) -> Any:
        """Run a coroutine on the server's loop (to reach the pipeline from a test)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def flush(self, timeout: float = 30) -> None:
        """Emit open traces and wait until everything queued is stored and counted."""
        if not self.call(self.pipeline.flush(timeout), timeout + 5):
            raise TimeoutError("pipeline did not drain")

    def metric(self, name: str, **labels: str) -> float:
        value = self.server.config.app.state.metrics.registry.get_sample_value(name, labels)  # type: ignore[attr-defined]
        return float(value or 0.0)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10, **kwargs)


@contextmanager
def live_server(data_dir: Path, **overrides: Any) -> Iterator[LiveServer]:
    http_port, grpc_port = free_port(), free_port()
    settings: dict[str, Any] = {
        "data_dir": str(data_dir),
        "server": {"host": "127.0.0.1", "port": http_port, "grpc_port": grpc_port},
    }
    for key, value in overrides.items():
        if isinstance(value, dict):
            settings[key] = {**settings.get(key, {}), **value}
        else:
            settings[key] = value
    config = load_config(environ={}, overrides=settings)
    app = create_app(config)
    server = uvicorn.Server(uvicorn_config(app, config, log_level="warning", lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("ragmon test server did not start")
        time.sleep(0.02)
    try:
        yield LiveServer(f"http://127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", config, server, loop)
    finally:
        server.should_exit = True
        thread.join(20)
        loop.close()


def post_accepted(client: httpx.Client, path: str, body: Any, deadline_s: float = 60.0) -> httpx.Response:
    """POST as a well-behaved client does: a 503 (ragmon is behind: explicit back-pressure) is retried
    after its Retry-After until `deadline_s`; any other answer is returned as it is."""
    deadline = time.monotonic() + deadline_s
    while True:
        response = client.post(path, json=body)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(min(float(response.headers.get("retry-after", "1")), 2.0))
