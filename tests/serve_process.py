"""`ragmon serve` as a child process of a test, on a data directory of its own, and its readiness."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def start_serve(data_dir: Path, port: int, settings: Mapping[str, str]) -> subprocess.Popen[str]:
    """`python -m service.cli serve` on 127.0.0.1:`port` (gRPC on a free port) with `data_dir`, the
    `RAGMON_*` environment variables in `settings` over this process's environment. Its stderr is
    piped, so `wait_ready` can show it when it exits."""
    args = ["serve", "--port", str(port), "--grpc-port", "0", "--data-dir", str(data_dir)]
    return subprocess.Popen(
        [sys.executable, "-m", "service.cli", *args],
        cwd=ROOT,
        env={**os.environ, **settings},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_ready(url: str, process: subprocess.Popen[str], timeout_s: float = 90) -> None:
    """Wait until `url`/readyz answers 200; AssertionError (with its stderr) if `process` exits first,
    or after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, (
            f"ragmon serve exited: {process.stderr.read() if process.stderr else ''}"
        )
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("ragmon serve never became ready")
