"""A real Arize Phoenix server (`phoenix serve`) on loopback with its own SQLite directory, per test session.

Phoenix runs from its own virtual environment (its dependency set is far larger
than ragmon's): `$RAGMON_PHOENIX_BIN`, else `/tmp/phoenix-venv/bin/phoenix`,
else `phoenix` on PATH. Tests that need it are skipped with a message when
none is installed. `$RAGMON_TEST_PHOENIX_URL` reuses an already running
Phoenix instead (each test writes to its own project, so runs do not mix).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.live_server import free_port

_START_TIMEOUT_S = 300.0  # the first start runs every database migration (about a minute on 2 cores)


def phoenix_executable() -> str | None:
    for candidate in (os.environ.get("RAGMON_PHOENIX_BIN"), "/tmp/phoenix-venv/bin/phoenix"):
        if candidate and Path(candidate).is_file():
            return candidate
    return shutil.which("phoenix")


@dataclass(frozen=True)
class PhoenixServer:
    url: str


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoenixServer]:
    running = os.environ.get("RAGMON_TEST_PHOENIX_URL")
    if running:
        yield PhoenixServer(running.rstrip("/"))
        return
    executable = phoenix_executable()
    if executable is None:
        pytest.skip(
            "Arize Phoenix is not installed: python3 -m venv /tmp/phoenix-venv && "
            "/tmp/phoenix-venv/bin/pip install arize-phoenix (or set RAGMON_PHOENIX_BIN)"
        )
    workdir = tmp_path_factory.mktemp("phoenix")
    port = free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",
    }
    log = (workdir / "phoenix.log").open("wb")
    process = subprocess.Popen(
        [executable, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"phoenix serve exited with {process.returncode}; see {workdir / 'phoenix.log'}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"phoenix serve did not answer within {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.5)
        yield PhoenixServer(url)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        log.close()
