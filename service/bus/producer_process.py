"""Ingest's Kafka producer: a thread of the server (`ThreadProducer`) or processes (`ProducerGroup`).

Why processes of their own: kafka-python is pure Python, and one producer
compresses every batch (gzip at level 9, which kafka-python does not let one
change) in its one sender thread, between its turns on the network. That
thread, not the server process nor the broker, bounded one ingest replica: with
the producer moved to a process of its own the server used a third of a core
and the rate did not move, while two plain producers side by side sent 1.5x
what one sends (bench/RESULTS.md, issue 36). So `ProducerGroup` runs several
`ProcessProducer`s, each batching and compressing the partitions it owns.

`KafkaBus` (kafka_bus.py) drives every kind the same way, from its one
client thread: `send_many` hands records over, each one's outcome (the
broker's acknowledgement, or an exception) comes back through `report` on
another thread; `partition_count` asks the broker for metadata (the probe
after an outage); `abort` gives the producer up without waiting for what it
holds; `close` flushes and ends it. What the bus guarantees (a 200 only for
acknowledged records; one record per trace in flight; failures send
everything unacknowledged again) is the bus's, and holds with either kind:
the process only moves the work.

The process's protocol: one pipe each way, each message one pickled tuple.
Server -> producer: ("send", [(token, topic, key, value, headers, partition),
...]), ("probe", topic), ("close", timeout_s). Producer -> server: ("ready",
the codec it compresses with) or ("failed", text) once at start, ("outcomes", [(token, error text or None),
...]) as acknowledgements come (batched by a writer thread), ("probed", the
topic's partition count, error text or None), ("closed",). Errors cross as text and come back as
`ProducerProcessError` (a `KafkaError`): the bus only needs to know that a
record failed, and the text for its log line.

Faults: a producer process that dies (killed, out of memory) shows as end of
file on its outcome pipe; every record it held is reported failed, which
makes the bus give that producer up and send them again through a new one,
as after any failed send. The producer process ends on end of file of its
command pipe, so it never outlives the server, however the server ends.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import pickle
import signal
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError

from service.bus.kafka_client import compression_of, new_producer, quiet_client_logs
from service.bus.murmur2 import partition_of
from service.processes import main_module_hidden, widen_pipe, worker_context

__all__ = [
    "ProcessProducer",
    "Producer",
    "ProducerGroup",
    "ProducerProcessError",
    "Record",
    "Report",
    "ThreadProducer",
]

log = logging.getLogger(__name__)

# one record to send: the caller's context for it, then topic, key, value, headers and the partition
# (None: the producer's own partitioner chooses, by key)
Record = tuple[Any, str, bytes, bytes, tuple[tuple[str, bytes], ...], int | None]
# called with (context, outcome) once per record: outcome is the record's metadata or an exception
Report = Callable[[Any, Any], None]

_START_TIMEOUT_S = 60.0  # starting the process and importing kafka-python; the bootstrap has its own
_KILL_WAIT_S = 5.0


class ProducerProcessError(KafkaError):  # type: ignore[misc]  # kafka-python has no types
    """A failure reported by the producer process (or its end), carried as text."""


class Producer(Protocol):
    @property
    def compression(self) -> str:
        """The codec its batches are compressed with (new_producer may have fallen back to gzip)."""
        ...

    def send_many(self, records: Sequence[Record], report: Report) -> None: ...

    def partition_count(self, topic: str) -> int: ...

    def abort(self) -> threading.Thread | None: ...

    def close(self, timeout_s: float) -> None: ...


class ThreadProducer:
    """A `KafkaProducer` in this process (`kafka.producer_processes: 0`, the default on one usable CPU)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self._producer = new_producer(settings)
        self.compression = compression_of(self._producer)
        self._close_timeout_s = settings["request_timeout_ms"] / 1000

    def send_many(self, records: Sequence[Record], report: Report) -> None:
        _send_each(self._producer, records, report, KafkaError)

    def partition_count(self, topic: str) -> int:
        """The topic's partitions, from the broker (raises when it does not answer)."""
        return len(self._producer.partitions_for(topic))

    def abort(self) -> threading.Thread | None:
        """Close without waiting; returns the thread still closing it, if any (join it at stop)."""
        try:
            self._producer.close(timeout=0)
        except KafkaError:
            # kafka-python's close flushes first and raises, leaving the producer open, while records
            # are pending (they would be retried until the delivery timeout). Its sender's force_close
            # aborts them (what they report is stale to the bus); the close then completes on a thread
            # of its own, so the next producer need not wait for it.
            self._producer._sender.force_close()
            closer = threading.Thread(target=self._close_quietly, name="kafka-producer-close", daemon=True)
            closer.start()
            return closer
        return None

    def _close_quietly(self) -> None:
        with contextlib.suppress(Exception):
            self._producer.close(timeout=self._close_timeout_s)

    def close(self, timeout_s: float) -> None:
        self._producer.close(timeout=timeout_s)


class ProcessProducer:
    """A `KafkaProducer` in a process of its own, used like `ThreadProducer` (module docstring)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        context = worker_context()
        command_reader, self._commands = context.Pipe(duplex=False)
        self._outcomes, outcome_writer = context.Pipe(duplex=False)
        # a request's records (~375 KB for 50 traces) cross in one write instead of six 64 KiB ones
        widen_pipe(self._commands.fileno())
        widen_pipe(outcome_writer.fileno())
        self._process: BaseProcess = context.Process(  # type: ignore[attr-defined]
            target=_serve,
            args=(settings, command_reader, outcome_writer),
            name="ragmon-kafka-producer",
            daemon=True,
        )
        try:
            with main_module_hidden():
                self._process.start()
        finally:
            # the process has its own copies now; an end kept here would hide its death
            command_reader.close()
            outcome_writer.close()
        self._tokens = itertools.count()
        self._pending: dict[int, tuple[Any, Report]] = {}  # token -> (context, report)
        self._lock = threading.Lock()  # _pending, between the sending and the reading thread
        self._write_lock = threading.Lock()
        self._replies: list[tuple[Any, ...]] = []  # answers to probe / close, in order
        self._replied = threading.Condition(self._lock)
        self._ended = False
        try:
            started = self._start_answer()
        except BaseException:
            self.abort()
            raise
        if started[0] == "failed":
            self.abort()
            raise ProducerProcessError(started[1])
        self.compression: str = started[1]
        self._reader = threading.Thread(target=self._read, name="kafka-producer-outcomes", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _write(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        try:
            with self._write_lock:
                self._commands.send_bytes(data)
        except OSError as exc:  # the process ended: the reader reports what it held
            raise ProducerProcessError(f"the Kafka producer process ended ({exc})") from None

    def send_many(self, records: Sequence[Record], report: Report) -> None:
        batch = []
        with self._lock:
            if self._ended:
                error = ProducerProcessError("the Kafka producer process ended")
                for record in records:
                    report(record[0], error)
                return
            for context, topic, key, value, headers, partition in records:
                token = next(self._tokens)
                self._pending[token] = (context, report)
                batch.append((token, topic, key, value, headers, partition))
        with contextlib.suppress(ProducerProcessError):  # the reader reports what it held as failed
            self._write(("send", batch))

    def partition_count(self, topic: str) -> int:
        """The topic's partitions, from the broker (raises when it does not answer)."""
        self._write(("probe", topic))
        _, count, error = self._wait_reply(("probed",), None)
        if error is not None:
            raise ProducerProcessError(error)
        return int(count)

    def abort(self) -> threading.Thread | None:
        """End the process now: what it held is reported failed (stale to the bus, which gave it up)."""
        self._process.kill()
        self._process.join(_KILL_WAIT_S)
        self._commands.close()
        return None

    def close(self, timeout_s: float) -> None:
        """Flush what the producer holds (up to `timeout_s`) and end the process."""
        try:
            self._write(("close", timeout_s))
            self._wait_reply(("closed",), timeout_s + _KILL_WAIT_S)
        except ProducerProcessError:
            pass
        finally:
            self._process.join(_KILL_WAIT_S)
            if self._process.exitcode is None:
                self.abort()
            self._commands.close()

    # -- answers from the process ----------------------------------------------------------------

    def _start_answer(self) -> tuple[Any, ...]:
        """("ready", codec) or ("failed", text): read here, before the reading thread runs."""
        if not self._outcomes.poll(_START_TIMEOUT_S):
            raise ProducerProcessError("the Kafka producer process did not start in time")
        try:
            return pickle.loads(self._outcomes.recv_bytes())  # type: ignore[no-any-return]
        except (EOFError, OSError):
            raise ProducerProcessError("the Kafka producer process ended while starting") from None

    def _wait_reply(self, kinds: tuple[str, ...], timeout_s: float | None) -> tuple[Any, ...]:
        """The next answer to a probe or close, which must be one of `kinds`."""
        with self._replied:
            if not self._replied.wait_for(lambda: self._replies or self._ended, timeout_s):
                raise ProducerProcessError("the Kafka producer process did not answer in time")
            if not self._replies:
                raise ProducerProcessError("the Kafka producer process ended")
            reply = self._replies.pop(0)
        if reply[0] not in kinds:
            raise ProducerProcessError(f"unexpected answer from the Kafka producer process: {reply[0]}")
        return reply

    def _read(self) -> None:
        try:
            while True:
                message = pickle.loads(self._outcomes.recv_bytes())
                if message[0] == "outcomes":
                    self._deliver(message[1])
                else:
                    with self._replied:
                        self._replies.append(message)
                        self._replied.notify_all()
        except (EOFError, OSError):
            pass
        finally:
            self._outcomes.close()
            with self._replied:
                self._ended = True
                held, self._pending = self._pending, {}
                self._replied.notify_all()
            if held:
                log.warning(
                    "the Kafka producer process ended (exit code %s) holding %d records; they are sent again",
                    self._process.exitcode,
                    len(held),
                )
            error = ProducerProcessError("the Kafka producer process ended")
            for context, report in held.values():
                report(context, error)

    def _deliver(self, outcomes: list[tuple[int, str | None]]) -> None:
        with self._lock:
            found = [(self._pending.pop(token, None), error) for token, error in outcomes]
        for entry, error in found:
            if entry is None:
                continue
            context, report = entry
            report(context, True if error is None else ProducerProcessError(error))


class ProducerGroup:
    """`count` producer processes used as one producer, side by side: kafka-python compresses in one
    sender thread a producer, which is what bounds a single producer on a broker that answers fast
    enough (bench/RESULTS.md, issue 36).

    Each record goes to the process that owns its partition (partition modulo `count`), the
    partition chosen here as kafka-python's default partitioner chooses it (murmur2 of the key over
    the topic's partitions: murmur2.py), so every record of a trace lands on the partition it would with one
    producer, and each partition's records are batched by one process: two processes write no more,
    smaller batches than one. One process that fails fails the group: the bus gives the whole group
    up and opens a new one."""

    def __init__(self, settings: dict[str, Any], count: int) -> None:
        self.members: list[ProcessProducer] = []
        self._partitions: dict[str, int] = {}  # topic -> partition count, asked once per group
        try:
            for _ in range(count):
                self.members.append(ProcessProducer(settings))
        except BaseException:
            self.abort()
            raise

    @property
    def compression(self) -> str:
        return self.members[0].compression

    @property
    def pids(self) -> list[int | None]:
        return [member.pid for member in self.members]

    def send_many(self, records: Sequence[Record], report: Report) -> None:
        count = len(self.members)
        if count == 1:
            self.members[0].send_many(records, report)
            return
        shares: list[list[Record]] = [[] for _ in range(count)]
        for context, topic, key, value, headers, _ in records:
            partitions = self._partitions.get(topic)
            if partitions is None:
                partitions = self._partitions[topic] = self.members[0].partition_count(topic)
            partition = partition_of(key, partitions)
            shares[partition % count].append((context, topic, key, value, headers, partition))
        for member, share in zip(self.members, shares, strict=True):
            if share:
                member.send_many(share, report)

    def partition_count(self, topic: str) -> int:
        """Every member asked (the probe after an outage: each must reach the broker)."""
        counts = [member.partition_count(topic) for member in self.members]
        return counts[0]

    def abort(self) -> threading.Thread | None:
        for member in self.members:
            member.abort()
        return None

    def close(self, timeout_s: float) -> None:
        for member in self.members:
            member.close(timeout_s)


# ---------------------------------------------------------------- in the producer process


class _Outbox:
    """Outcomes reported by kafka-python's sender thread, written to the pipe in batches by one
    thread (a write per record would wake the server once per record)."""

    def __init__(self, pipe: Connection) -> None:
        self._pipe = pipe
        self._items: list[tuple[int, str | None]] = []
        self._ready = threading.Condition()
        self._write_lock = threading.Lock()
        threading.Thread(target=self._flush_forever, name="outcomes", daemon=True).start()

    def outcome(self, token: int, outcome: Any) -> None:
        error = repr(outcome) if isinstance(outcome, BaseException) else None
        with self._ready:
            self._items.append((token, error))
            if len(self._items) == 1:
                self._ready.notify()

    def send(self, message: tuple[Any, ...]) -> None:
        data = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        with self._write_lock:
            self._pipe.send_bytes(data)

    def flush(self) -> None:
        with self._ready:
            items, self._items = self._items, []
        if items:
            self.send(("outcomes", items))

    def _flush_forever(self) -> None:
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._items))
            try:
                self.flush()
            except OSError:  # the server has gone
                os._exit(0)


def _serve(settings: dict[str, Any], commands: Connection, outcomes: Connection) -> None:
    """The producer process's whole life: make the producer, then follow commands until the pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ending it is the server's job
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    quiet_client_logs()
    outbox = _Outbox(outcomes)
    try:
        producer = new_producer(settings)
    except Exception as exc:
        outbox.send(("failed", repr(exc)))
        return
    outbox.send(("ready", compression_of(producer)))
    while True:
        try:
            message = pickle.loads(commands.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the server has gone: nothing it held was answered with a 200
        kind = message[0]
        if kind == "send":
            # any failure of a send is the record's, reported to the server: this loop must go on
            _send_each(producer, message[1], outbox.outcome, Exception)
        elif kind == "probe":
            try:
                count = len(producer.partitions_for(message[1]))
                outbox.send(("probed", count, None))
            except Exception as exc:
                outbox.send(("probed", 0, repr(exc)))
        elif kind == "close":
            with contextlib.suppress(Exception):
                producer.close(timeout=message[1])
            outbox.flush()
            outbox.send(("closed",))
            return


def _send_each(
    producer: KafkaProducer, records: Sequence[Record], report: Report, failure: type[Exception]
) -> None:
    """Hand `records` to `producer`; `report(context, outcome)` once each. A send that raises
    `failure` (no metadata within max_block_s, or the producer is closed) fails it and the rest,
    which would wait as long."""
    for i, (context, topic, key, value, headers, partition) in enumerate(records):
        try:
            future = producer.send(
                topic, key=key, value=value, headers=list(headers) or None, partition=partition
            )
        except failure as exc:
            for rest in records[i:]:
                report(rest[0], exc)
            return
        future.add_both(report, context)
