"""`ragmon serve` owns its ports: a second process on a taken HTTP or gRPC port exits with one line.

grpc sets SO_REUSEPORT by default, so without ("grpc.so_reuseport", 0) a second
server bound the same gRPC port silently and the kernel split the connections
between the two processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _serve(tmp_path: Path, name: str, port: int, grpc_port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
    env.update({"RAGMON_JUDGING__ENABLED": "false", "RAGMON_SERVER__INGEST_PROCESSES": "0"})
    args = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--grpc-port", str(grpc_port)]
    args += ["--data-dir", str(tmp_path / name)]
    return subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _wait_ready(url: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("first server not ready")


def test_a_second_server_on_a_taken_port_exits_with_one_clear_line(tmp_path: Path) -> None:
    http_port, grpc_port = free_port(), free_port()
    first = _serve(tmp_path, "a", http_port, grpc_port)
    try:
        _wait_ready(f"http://127.0.0.1:{http_port}", first)
        for port, grpc, what in (
            (free_port(), grpc_port, f"OTLP/gRPC port 127.0.0.1:{grpc_port}"),
            (http_port, free_port(), f"HTTP port 127.0.0.1:{http_port}"),
        ):
            second = _serve(tmp_path, "b", port, grpc)
            _, err = second.communicate(timeout=60)
            assert second.returncode == 1, err
            lines = [line for line in err.splitlines() if line.strip()]
            assert lines == [f"ragmon serve: {what} is not available (Address already in use)"], err
        assert first.poll() is None  # the first one is untouched and still serves
        assert httpx.get(f"http://127.0.0.1:{http_port}/readyz", timeout=5).status_code == 200
    finally:
        first.terminate()
        first.communicate(timeout=30)


def test_the_grpc_receiver_refuses_a_port_another_grpc_server_holds() -> None:
    """Two gRPC servers with grpc's defaults would share the port; ragmon's receiver does not."""
    import asyncio

    import grpc

    from service.ingest.grpc_receiver import OtlpGrpcReceiver

    async def run() -> None:
        other = grpc.aio.server()  # grpc's default options: SO_REUSEPORT on
        port = other.add_insecure_port("127.0.0.1:0")
        await other.start()
        try:
            receiver = OtlpGrpcReceiver(None, None, "127.0.0.1", port, 1 << 20)  # type: ignore[arg-type]
            with pytest.raises(OSError, match="is in use"):
                await receiver.start()
        finally:
            await other.stop(0)

    asyncio.run(run())


def test_port_0_serves_on_a_port_the_system_chose_and_says_which(tmp_path: Path) -> None:
    """4318 is often an OTel collector's: `--port 0` must start anyway and print the real port."""
    server = _serve(tmp_path, "zero", 0, 0)
    try:
        assert server.stderr is not None
        deadline = time.monotonic() + 60
        line = ""
        while "ragmon listening" not in line:
            assert time.monotonic() < deadline and server.poll() is None, "no 'ragmon listening' line"
            line = server.stderr.readline()
        url = line.split("API ", 1)[1].split(",", 1)[0]
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0"), line
        assert "no OTLP/gRPC" in line  # --grpc-port 0: no gRPC receiver
        _wait_ready(url, server)
    finally:
        server.terminate()
        server.communicate(timeout=30)
