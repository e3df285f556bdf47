"""The sinks group's backlog, measured from the broker, and whether the broker answers at all.

`ragmon_kafka_consumer_lag` (`lag.py`) is each worker's own view: the
records past its consumer's position. A spans record is past that position as
soon as it is read, though its trace is stored only later (it is *held*:
`span_offsets.py`), and a worker that dies takes its series with it. So that
gauge read 0 while thousands of acknowledged traces were not stored, and 0
while the broker was down.

The backlog is what the group has not stored: per partition, the high
watermark minus the group's committed offset (the log start when it has
none). Commits follow the store (a spans partition is committed up to its
oldest record whose trace is not stored; traces and feedback once the sinks
returned), so it counts what was read but not stored, and it is what a
restart of every worker would read again. It is measured from the broker, not
from a member's memory, so it stays true while a worker is dead and its
partitions have no owner yet.

Who measures: every ingest replica and every `sinks` worker, each on its own,
every `kafka.backlog_interval_s` (a `BacklogWatcher`). Each reports the same
numbers, so queries take `max without (instance)`; the series exist while at
least one ragmon process of the deployment runs and reaches the broker.

How: the group's committed offsets come from one OffsetFetch (admin client).
The high watermark comes from a fetch response, not from ListOffsets: tansu
answers ListOffsets(latest) with the base offset of the partition's last
batch plus one (RECIPES.md). A consumer of no group is placed at that answer
(the true end on Apache Kafka) and fetches with a one-byte limit, which costs
at most one batch per fetch response; the fetch response's high watermark is
the end. A partition whose fetch did not answer in time falls back to the
ListOffsets answer (a lower bound).

While the broker does not answer, the backlog cannot be measured: its series
are removed (absent, never a made-up 0), `ragmon_kafka_reachable` is 0 and
`ragmon_kafka_last_contact_timestamp_seconds` stops moving, so an alert can
say "broker unreachable" instead of reading an empty backlog. The watcher
does not log the outage: the producer (ingest) and the consume loop (workers)
already say it once (`outage_log.py`); its signal is the gauges.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from service.bus.kafka_client import client_settings
from service.config import KafkaConfig
from service.lifecycle import cancel_task
from service.metrics import Metrics

__all__ = ["BacklogWatcher", "partition_backlog"]

log = logging.getLogger(__name__)

Partition = tuple[str, int]  # (topic, partition)

# A fetch positioned at the end waits at most this long for records before it answers with none
# (and the high watermark).
_FETCH_WAIT_MS = 100


def partition_backlog(high_watermark: int, committed: int | None, log_start: int) -> int:
    """Records of one partition the group has not committed: from its committed offset (or, with
    none, the log start, where its consumers begin: auto_offset_reset=earliest) to the high
    watermark. Never negative (a committed offset past the end: the topic was recreated)."""
    start = log_start if committed is None or committed < 0 else committed
    return max(0, high_watermark - start)


class BacklogWatcher:
    """Measures one consumer group's backlog over its topics every `kafka.backlog_interval_s`
    (see the module docstring) and exports it with the broker's reachability:

    * `ragmon_kafka_backlog_records{group,topic,partition}`
    * `ragmon_kafka_reachable` (1 / 0)
    * `ragmon_kafka_last_contact_timestamp_seconds`

    Start and stop are safe twice and before start. Blocking client calls run on one thread of the
    watcher's own (kafka-python clients are not thread-safe); every call is bounded by
    `kafka.request_timeout_s`."""

    def __init__(
        self,
        config: KafkaConfig,
        metrics: Metrics,
        *,
        group: str | None = None,
        topics: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.group = group or config.sinks_group
        self.topics = tuple(topics or (config.spans_topic, config.traces_topic, config.feedback_topic))
        self.clock = clock
        self.backlog: dict[Partition, int] = {}
        self.reachable = False
        self.last_contact = 0.0  # Unix time of the latest successful measurement; 0: never
        self.measurements = 0  # successful ones
        self.failures = 0
        self._admin: KafkaAdminClient | None = None
        self._consumer: KafkaConsumer | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        state = metrics.state
        state.add_family(
            "ragmon_kafka_backlog_records",
            "records of the consumer group not yet stored, per partition: the high watermark minus the "
            "group's committed offset, which follows the store (what a restart would read again); "
            "measured from the broker by every ingest replica and sinks worker every "
            "kafka.backlog_interval_s (take max without (instance)); absent while the broker is unreachable",
            ("group", "topic", "partition"),
            self._series,
        )
        state.add(
            "ragmon_kafka_reachable",
            "1 while this process's latest backlog measurement reached the Kafka broker (every "
            "kafka.backlog_interval_s); 0 after a failed one, and before the first success",
            lambda: 1.0 if self.reachable else 0.0,
        )
        state.add(
            "ragmon_kafka_last_contact_timestamp_seconds",
            "when this process last reached the Kafka broker (its latest successful backlog measurement), "
            "Unix time; 0 if never",
            lambda: self.last_contact,
        )

    def _series(self) -> Iterable[tuple[tuple[str, ...], float]]:
        for (topic, partition), records in sorted(self.backlog.items()):
            yield (self.group, topic, str(partition)), float(records)

    @property
    def total(self) -> int:
        """The backlog summed over the group's partitions (as last measured)."""
        return sum(self.backlog.values())

    # -- on the watcher's thread ------------------------------------------------------------------

    def _open(self) -> tuple[KafkaAdminClient, KafkaConsumer]:
        c = self.config
        if self._admin is None:
            self._admin = KafkaAdminClient(client_id=f"{c.client_id}-backlog", **client_settings(c))
        if self._consumer is None:
            self._consumer = KafkaConsumer(
                group_id=None,  # reads offsets only: never joins, commits for, or moves the group
                client_id=f"{c.client_id}-backlog",
                enable_auto_commit=False,
                auto_offset_reset="latest",
                fetch_max_bytes=1,  # a fetch returns at most its first batch (KIP-74), or nothing
                max_partition_fetch_bytes=1,
                fetch_max_wait_ms=_FETCH_WAIT_MS,
                **client_settings(c),
            )
        return self._admin, self._consumer

    def _close(self) -> None:
        admin, self._admin = self._admin, None
        consumer, self._consumer = self._consumer, None
        timeout_ms = int(self.config.request_timeout_s * 1000)
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close(autocommit=False, timeout_ms=timeout_ms)
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()

    def measure(self) -> dict[Partition, int]:
        """The group's backlog per partition of its topics, from the broker (blocking; raises
        `KafkaError` or `OSError` when the broker does not answer). Topics that do not exist yet
        have no partitions here."""
        admin, consumer = self._open()
        timeout_ms = int(self.config.request_timeout_s * 1000)
        # first: it asks the broker every time, whatever the clients have cached
        committed_all = admin.list_group_offsets({self.group: None}).get(self.group, {})
        partitions = [
            TopicPartition(topic, p)
            for topic in self.topics
            for p in sorted(consumer.partitions_for_topic(topic))
        ]
        if not partitions:
            return {}
        committed: dict[TopicPartition, int | None] = {
            tp: (committed_all[tp].offset if tp in committed_all else None) for tp in partitions
        }
        consumer.unsubscribe()  # a fresh assignment: no high watermark left from the last round
        consumer.assign(partitions)
        ends: dict[TopicPartition, int] = consumer.end_offsets(partitions, timeout_ms)
        unstarted = [tp for tp, offset in committed.items() if offset is None or offset < 0]
        starts: dict[TopicPartition, int] = (
            consumer.beginning_offsets(unstarted, timeout_ms) if unstarted else {}
        )
        for tp in partitions:
            consumer.seek(tp, ends[tp])
        deadline = time.monotonic() + self.config.request_timeout_s
        while any(consumer.highwater(tp) is None for tp in partitions) and time.monotonic() < deadline:
            consumer.poll(timeout_ms=_FETCH_WAIT_MS * 2)  # the records are not wanted, only the end
        backlog: dict[Partition, int] = {}
        for tp in partitions:
            fetched = consumer.highwater(tp)
            high = max(ends[tp], fetched) if fetched is not None else ends[tp]
            backlog[(tp.topic, tp.partition)] = partition_backlog(high, committed[tp], starts.get(tp, 0))
        return backlog

    # -- on the event loop -------------------------------------------------------------------------

    async def refresh(self) -> bool:
        """Measure once now and update the gauges; True when the broker answered."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-backlog")
        pool = self._pool
        loop = asyncio.get_running_loop()
        try:
            backlog = await loop.run_in_executor(pool, self.measure)
        except (KafkaError, OSError) as exc:
            log.debug("Kafka backlog not measured: %s", exc)
            await self._failed(pool)
            return False
        except Exception:  # a client bug must not end the watcher; say so, since it is not an outage
            log.exception("Kafka backlog measurement failed")
            await self._failed(pool)
            return False
        self.backlog, self.reachable, self.last_contact = backlog, True, self.clock()
        self.measurements += 1
        return True

    async def _failed(self, pool: ThreadPoolExecutor) -> None:
        # a client that lost its broker does not always find it again: the next round starts anew
        await asyncio.get_running_loop().run_in_executor(pool, self._close)
        self.backlog, self.reachable = {}, False
        self.failures += 1

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.config.backlog_interval_s)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"kafka-backlog-{self.group}")

    async def stop(self) -> None:
        """Stop measuring and close the clients (after a measurement in flight, on their thread)."""
        task, self._task = self._task, None
        await cancel_task(task)
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.submit(self._close)
            pool.shutdown(wait=False)
        self.backlog, self.reachable = {}, False
