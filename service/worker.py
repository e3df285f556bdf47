"""`ragmon worker`: the process that runs sinks, judge workers and the drift scheduler in distributed mode.

Roles (`--role`, repeatable; default `worker.roles`):

* `sinks`: a `KafkaReceiver` in the `kafka.sinks_group` consumer group feeding
  the same sinks as embedded mode (`StoreSink` → `Fanout[MetricsSink,
  JudgeQueueSink, DriftWindowSink]`). Spans from the spans topic are
  assembled here (`SpanAssembler`, then `RequestFilter` and `ReaskDetector`),
  so the spans of one trace that reached different ingest replicas become
  one trace; their offsets are committed once the trace is stored
  (`service.bus.span_offsets`). Trace metrics are counted here, once
  per trace id: the store reports which rows are new and only those reach
  `MetricsSink`, so a redelivered batch changes no counter. On shutdown the
  traces still open are not stored: they were not committed, and the
  partitions' next owner assembles them whole.
* `judge`: judge workers claiming from the shared SQL judge queue, the
  faithfulness estimator and its human correction. The queue is durable:
  while the judge endpoint is down, the items wait there.
* `drift`: may run the drift detectors, gated by a leader lock
  (`service.bus.leader`), so one replica at a time runs them. Drift windows live
  in the memory of the process that consumes the traces, so every `sinks`
  worker flushes its windows on schedule whatever its roles.

The topology is `Pipeline`'s (service/pipeline.py); a worker starts the parts
of it its roles need. Each worker serves `/metrics`, `/healthz` and `/readyz` on
`worker.host:worker.port`: `/healthz` (liveness) answers 503 once a sinks worker's consume loop
has ended or is stuck in one turn (`Worker.alive`), `/readyz` also while the store does not
answer. Start-up waits for the store (PostgreSQL may be restarting); once running, every stage
retries on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from sqlalchemy import exc as sa_exc
from starlette.responses import JSONResponse, Response

from service.bus.leader import leader_lock
from service.bus.outage_log import OutageLog
from service.config import RagmonConfig, WorkerRole
from service.errors import StoreUnavailable
from service.ingest.responses import readiness_response
from service.metrics import Metrics
from service.pipeline import Pipeline
from service.runtime import tune_for_service
from service.scrape import scrape_response

if TYPE_CHECKING:
    from service.bus.kafka import KafkaReceiver

__all__ = ["DRIFT_LOCK", "STUCK_TURNS", "Worker", "create_worker_app", "main"]

log = logging.getLogger(__name__)

DRIFT_LOCK = "drift-scheduler"
# a consume-loop turn this many times `kafka.max_poll_interval_s` old fails liveness: one interval is
# what the broker allows a batch; the second keeps a slow batch that finishes from a needless restart
STUCK_TURNS = 2
_SCHEMA_RETRY_S = 1.0


class Worker:
    """The roles of one `ragmon worker` process, started and stopped together."""

    def __init__(
        self, config: RagmonConfig, roles: Sequence[WorkerRole], metrics: Metrics | None = None
    ) -> None:
        if not roles:
            raise ValueError("a worker needs at least one role")
        self.roles = frozenset(roles)
        if "sinks" in self.roles and config.bus.kind != "kafka":
            raise ValueError("the sinks role consumes from Kafka: set bus.kind to kafka")
        self.config = config
        self.pipeline = Pipeline(config, metrics, process="ragmon-worker")
        self.metrics = self.pipeline.metrics
        self.receiver: KafkaReceiver | None = None
        if "sinks" in self.roles:
            # here, not at the top: kafka-python comes with the `kafka` extra, and `ragmon worker` names
            # that extra when it is missing instead of failing on import
            from service.bus.kafka import KafkaReceiver

            self.receiver = KafkaReceiver(
                config.kafka,
                self.pipeline.sinks,
                self.metrics,
                spans=self.pipeline,
                offsets=self.pipeline.span_offsets,
                dead_letters=self.pipeline.sinks.dead_letter,
            )
        self.leader = leader_lock(self.pipeline.store.engine, DRIFT_LOCK)
        self._drift_started = False
        self.started = False

    async def _wait_for_store(self) -> None:
        # one line when the store is down at start, one per `REPORT_EVERY_S` while it stays down
        outage = OutageLog(log, "the store (at start)")
        while True:
            try:
                await asyncio.to_thread(self.pipeline.create_schema)
                outage.recovered()
                return
            except (StoreUnavailable, sa_exc.OperationalError, sa_exc.IntegrityError) as exc:
                outage.failed(exc)
                await asyncio.sleep(_SCHEMA_RETRY_S)

    def _drift_gate(self) -> Callable[[], bool]:
        if "drift" in self.roles:
            return self.leader.acquire
        return lambda: False

    async def start(self) -> None:
        await self._wait_for_store()
        p = self.pipeline
        if "judge" in self.roles:
            # judgments are annotated onto Phoenix (when configured) by the process that makes them
            await p.phoenix_annotations.start()
            for judge_worker in p.judge_workers:
                await judge_worker.start()
            await p.estimator.start()
            await p.correction.start()
        if self.config.drift.enabled and self.roles & {"sinks", "drift"}:
            p.drift.gate = self._drift_gate()
            await p.drift.start()
            self._drift_started = True
        if self.receiver is not None:
            await p.assembler.start()
            await self.receiver.start()
            if p.kafka_backlog is not None:  # the group's backlog from the broker, as ingest measures it
                await p.kafka_backlog.start()
            # the fan-out a crash or a failed sink left unfinished (service/outbox.py) runs where the
            # sinks run; taken rows are stamped, so sinks workers sweeping together split the work
            await p.outbox_sweep.start()
            await p.span_expiry.start()
        self.started = True

    async def stop(self) -> None:
        """Leave the consumer group, flush drift windows, stop judging, release the lock. Safe twice."""
        self.started = False
        p = self.pipeline
        await p.outbox_sweep.stop()
        await p.span_expiry.stop()
        if self.receiver is not None:
            if p.kafka_backlog is not None:
                await p.kafka_backlog.stop()
            await self.receiver.stop()
            if p.span_offsets is not None:
                p.span_offsets.close()
            # what is still open is not stored here: it was not committed, the next owner reads it again
            await p.assembler.abandon()
        await p.sinks.stop()
        if self._drift_started:
            await p.drift.stop()
            self._drift_started = False
        await p.estimator.stop()
        await p.correction.stop()
        for judge_worker in p.judge_workers:
            await judge_worker.stop()
        await p.phoenix_annotations.stop()
        await asyncio.to_thread(self.leader.release)
        await p.release_budget()
        await asyncio.to_thread(p.store.close)

    async def ready(self) -> tuple[bool, str]:
        """Ready to do its work: started, its Kafka consume loop alive (sinks role), and the
        store answering. Not a matter of load: a worker that is behind still consumes."""
        if not self.started:
            return False, "starting"
        if self.receiver is not None and not self.receiver.running:
            return False, "kafka consumer stopped"
        problem = await self.pipeline.store_problem()
        return (False, problem) if problem else (True, "ok")

    def alive(self) -> tuple[bool, str]:
        """Liveness: False once the Kafka consume loop of a started sinks worker has ended, or while
        one turn of it has run longer than `STUCK_TURNS` x `kafka.max_poll_interval_s` (a call that
        never returns: a frozen database answers no statement, and its kernel still acknowledges
        the bytes, so no timeout of ours fires). Nothing restarts that loop in the process, and its
        consumer may still hold partitions that nobody then consumes: the pod must be restarted
        (the chart's livenessProbe on /healthz)."""
        receiver = self.receiver
        if not self.started or receiver is None:
            return True, "ok"
        if not receiver.running:
            return False, f"kafka consume loop ended ({receiver.failure})"
        limit = STUCK_TURNS * self.config.kafka.max_poll_interval_s
        age = receiver.turn_age_s()
        if age > limit:
            return False, (
                f"kafka consume loop stuck: its current turn has run {age:.0f}s, over "
                f"{STUCK_TURNS} x kafka.max_poll_interval_s ({limit:g}s)"
            )
        return True, "ok"

    def health(self) -> dict[str, Any]:
        assigned = sorted(self.receiver.assigned) if self.receiver is not None else []
        alive, detail = self.alive()
        return {
            "status": ("ok" if alive else "dead") if self.started else "starting",
            "detail": detail,
            "roles": sorted(self.roles),
            "partitions": [f"{topic}/{partition}" for topic, partition in assigned],
            "batches": self.receiver.batches if self.receiver is not None else 0,
            "consume_turn_s": round(self.receiver.turn_age_s(), 1) if self.receiver is not None else 0.0,
            "drift_leader": self.leader.held,
        }


def create_worker_app(
    config: RagmonConfig, roles: Sequence[WorkerRole], metrics: Metrics | None = None
) -> FastAPI:
    """The worker's HTTP face: `/healthz` (roles, assigned partitions, leadership), `/readyz` and
    `/metrics`."""
    metrics = metrics or Metrics(config.metrics, tenants=config.auth.tenants)
    worker = Worker(config, roles, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await worker.start()
        try:
            yield
        finally:
            await worker.stop()

    app = FastAPI(title="ragmon worker", lifespan=lifespan)
    app.state.worker = worker

    @app.get(
        "/healthz",
        tags=["ops"],
        summary="Liveness (503 once the consume loop ended or is stuck), roles, partitions",
    )
    async def healthz() -> Response:
        health = worker.health()
        if health["status"] == "dead":
            log.error("liveness failed: %s", health["detail"])
        return JSONResponse(health, 503 if health["status"] == "dead" else 200)

    @app.get("/readyz", tags=["ops"], summary="Readiness: started, consuming, store reachable")
    async def readyz() -> Response:
        return readiness_response(*await worker.ready())

    @app.get(
        "/metrics", tags=["ops"], summary="Prometheus metrics of this worker (`name[]` to ask for some only)"
    )
    async def prometheus_metrics(request: Request) -> Response:
        return await scrape_response(request, metrics, config.metrics.scrape_token)

    return app


def main(args: argparse.Namespace, config: RagmonConfig) -> int:
    """Run a worker until SIGINT/SIGTERM; returns the exit code."""
    import uvicorn

    if args.metrics_port is not None:
        config = config.model_copy(
            update={"worker": config.worker.model_copy(update={"port": args.metrics_port})}
        )
    roles: list[WorkerRole] = args.role or list(config.worker.roles)
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        app = create_worker_app(config, roles)
    except ValueError as exc:
        print(f"ragmon worker: {exc}", flush=True)
        return 2
    print(
        f"ragmon worker {','.join(sorted(set(roles)))}: /metrics on "
        f"http://{config.worker.host}:{config.worker.port}, store {config.store_url_masked}",
        flush=True,
    )
    tune_for_service()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.worker.host,
            port=config.worker.port,
            log_level=config.log_level,
            access_log=False,
            lifespan="on",
        )
    )
    server.run()
    return 0
