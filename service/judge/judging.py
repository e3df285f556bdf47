"""Judging in the running service: the sink that samples traces into the judge queue, and the worker.

    new traces ──▶ JudgeQueueSink ──sampler──▶ SqlJudgeQueue ──claim──▶ JudgeWorker ──▶ judge
    new feedback ─▶ (thumbs-down raises a trace's inclusion probability)          │
                                                        JudgmentStore ◀──────────┘ (+ flags, metrics)

Delivery is at least once: a worker claims items with a lease, judges,
stores the judgment keyed by (tenant, trace_id, judge_version) and only then
completes the item. A worker that dies mid-batch loses its leases, which
expire and return the items; a judgment stored twice is stored once. When
the judge endpoint is unavailable the item goes back to the queue with the
endpoint's retry delay; after `max_attempts` it ends `failed`, visible in the
queue and counted, never silently gone. The judge budget is asked as items are
claimed, in fair shares of the tenants with work waiting (`sampler.fair`);
what it has no room for waits in the queue, deferred, and a deferral older
than `budget.max_deferral_s` ends skipped (`expired`), counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sampler import (
    GROUPINGS,
    FaithfulnessEstimate,
    Grouping,
    SqlJudgeQueue,
    TraceSampler,
    TraceSummary,
    estimate_cells_by,
)
from sampler.estimate import SampleCell
from sampler.queue import Admission, ItemKey, QueueRecord
from service.config import JudgingConfig
from service.corrections import TraceUpdate, judged_digest
from service.errors import JudgeUnavailable, StoreUnavailable
from service.judge.judgment import Judge, Judgment
from service.judge.store import READINGS, JudgmentStore, Reading
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.model import Feedback, RagTrace
from service.store.rows import rag_trace_from_record
from service.store.trace_store import Store

__all__ = [
    "FaithfulnessEstimator",
    "JudgeQueueSink",
    "JudgeWorker",
    "rag_trace_from_record",
    "summary_from_record",
]

log = logging.getLogger(__name__)

_EXPIRY_EVERY_S = 10.0


def summary_from_record(record: dict[str, Any]) -> TraceSummary:
    """The sampler's view of a stored trace, with the feedback stored with it."""
    flags = record.get("flags", {})
    feedback = record.get("feedback") or []
    return TraceSummary(
        trace_id=record["trace_id"],
        tenant=record["tenant"],
        app=record["app"],
        start_time=datetime.fromisoformat(record["start_time"]),
        release=record.get("release"),
        intent=record.get("intent"),
        top1_score=record.get("top1_score"),
        is_regeneration=bool(flags.get("is_regeneration")),
        is_probe=bool(flags.get("probe_run_id") or flags.get("probe_question_id")),
        thumbs_down=any(f.get("kind") == "down" for f in feedback),
        text_chars=len(record.get("query") or "") + len(record.get("answer") or ""),
    )


class JudgeQueueSink:
    """Sink: decides which new traces are judged and enqueues them; reconsiders on thumbs-down feedback."""

    def __init__(
        self,
        sampler: TraceSampler,
        queue: SqlJudgeQueue,
        store: Store,
        metrics: Metrics,
        on_new_work: Callable[[], None] | None = None,
    ) -> None:
        """`on_new_work` is called on the event loop after a batch put new items in the queue (the
        judge workers of this process: `JudgeWorker.wake`)."""
        self.sampler = sampler
        self.queue = queue
        self.store = store
        self.metrics = metrics
        self.on_new_work = on_new_work

    def _enqueue(self, items: Sequence[Any]) -> int:
        """Queue `items`; returns how many were new work."""
        if not items:
            return 0
        # counted once a trace: a late thumbs-down that raises a queued trace's probability (or a
        # fan-out run again from the outbox) offers the same key again and is not a second sample
        new_work, _ = self.queue.enqueue_new(items)
        for item in items:
            if item.key in new_work:
                self.metrics.judge_sampled.labels(stratum=item.stratum).inc()
        return len(new_work)

    def _queued(self, new_work: int) -> None:
        if new_work and self.on_new_work is not None:
            self.on_new_work()

    def _select_and_enqueue(self, batch: Sequence[RagTrace]) -> int:
        # Feedback that arrived before its trace: the summary must include it, or a
        # thumbs-down that came first would never raise the inclusion probability.
        early = self.store.feedback_for([(t.tenant, t.trace_id) for t in batch])
        summaries = [TraceSummary.of(t, early.get((t.tenant, t.trace_id), ())) for t in batch]
        return self._enqueue(self.sampler.select(summaries))

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        # all in a thread: summarising and sampling a batch on the event loop held requests
        # waiting for tens of milliseconds (bench/RESULTS.md, p99)
        self._queued(await asyncio.to_thread(self._select_and_enqueue, batch))

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None:
        """A later version of stored traces: a judged trace whose judged content changed (its answer
        arrived late) is judged again; the sampler reconsiders the trace with its new strata."""

        def reconsider() -> int:
            known = self.store.feedback_for([(u.trace.tenant, u.trace.trace_id) for u in batch])
            items = []
            for update in batch:
                feedback = known.get((update.trace.tenant, update.trace.trace_id), [])
                # the version as decided first: its app, release and intent label the sample
                after = replace(
                    TraceSummary.of(update.trace, feedback),
                    app=update.before.app,
                    release=update.before.release,
                    intent=update.before.intent,
                )
                item = self.sampler.on_update(_summary_before(update, feedback), after)
                if item is not None:
                    items.append(item)
            new_work = self._enqueue(items)
            changed = [
                ItemKey(u.trace.tenant, u.trace.trace_id, self.sampler.judge_version)
                for u in batch
                if u.before.judged != judged_digest(u.trace)
            ]
            requeued = self.queue.rejudge(changed)
            if requeued:
                self.metrics.judge_rejudged.inc(len(requeued))
            return new_work + len(requeued)

        self._queued(await asyncio.to_thread(reconsider))

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        relevant = [f for f in batch if f.kind in ("down", "regenerate")]
        if not relevant:
            return

        def reconsider() -> int:
            items = []
            for event in relevant:
                record = self.store.get_trace(event.tenant, event.trace_id)
                if record is None:
                    continue  # the trace is not stored yet: consume_traces will see this feedback
                # the stored record already includes this event; the sampler wants the trace as decided
                item = self.sampler.on_feedback(event, _without(record, event))
                if item is not None:
                    items.append(item)
            return self._enqueue(items)

        self._queued(await asyncio.to_thread(reconsider))


def _summary_before(update: TraceUpdate, feedback: Sequence[Feedback]) -> TraceSummary:
    """The sampler's view of a trace as it was decided: the counted version's facts, its feedback."""
    before, trace = update.before, update.trace
    summary = TraceSummary(
        trace_id=trace.trace_id,
        tenant=trace.tenant,
        app=before.app,
        start_time=trace.start_time,
        release=before.release,
        intent=before.intent,
        top1_score=before.top1_score,
        is_regeneration=before.regeneration,
        is_probe=before.probe,
    )
    for event in feedback:
        summary = summary.with_feedback(event)
    return summary


def _without(record: dict[str, Any], event: Feedback) -> TraceSummary:
    """The trace's summary as it was before `event`: the stored record already includes it. A late
    regenerate marked the stored trace a regeneration (source "feedback"); before it, the trace was
    one only if the app said so or an earlier regenerate event did."""
    summary = summary_from_record(record)
    others = [f for f in record.get("feedback") or [] if f.get("event_id") != event.event_id]
    if event.kind == "down":
        return replace(summary, thumbs_down=any(f.get("kind") == "down" for f in others))
    if event.kind == "regenerate" and record.get("flags", {}).get("regeneration_source") == "feedback":
        return replace(summary, is_regeneration=any(f.get("kind") == "regenerate" for f in others))
    return summary


class JudgeWorker:
    """Claims queued traces, judges them, stores judgments and flags, completes the items."""

    def __init__(
        self,
        config: JudgingConfig,
        judge: Judge,
        queue: SqlJudgeQueue,
        store: Store,
        judgments: JudgmentStore,
        metrics: Metrics,
        worker_id: str,
        after_judgment: Callable[[Judgment], Awaitable[None]] | None = None,
        admission: Admission | None = None,
        max_deferral_s: float = 6 * 3600.0,
        budget_retry_s: float = 1.0,
    ) -> None:
        """`admission`: the budget's fair shares (`sampler.fair.FairAdmission`), asked as items are
        claimed; None claims without a budget. After the budget refused, the worker claims nothing
        for `budget_retry_s`; deferred items older than `max_deferral_s` end skipped."""
        self.config = config
        self.admission = admission
        self.max_deferral_s = max_deferral_s
        self.budget_retry_s = budget_retry_s
        self._budget_wait_until = 0.0
        self._expire_at = 0.0
        self.after_judgment = after_judgment
        self.judge = judge
        self.queue = queue
        self.store = store
        self.judgments = judgments
        self.metrics = metrics
        self.worker_id = worker_id
        self._task: asyncio.Task[None] | None = None
        self._pause_until = 0.0
        self._woken = asyncio.Event()

    def wake(self) -> None:
        """New items in the queue (this process queued them): claim now, not after the idle wait.
        Call it on the event loop."""
        self._woken.set()

    async def _idle(self, wait_s: float) -> bool:
        """Wait up to `wait_s` for `wake`; True if woken."""
        try:
            await asyncio.wait_for(self._woken.wait(), wait_s)
        except TimeoutError:
            return False
        return True

    async def run_once(self) -> int:
        """Claim one batch and judge it; returns how many items were claimed."""
        await self._expire_deferred()
        if time.monotonic() < self._budget_wait_until:
            return 0
        if self.admission is None:
            records = await asyncio.to_thread(
                self.queue.claim, self.config.batch_size, self.config.lease_s, self.worker_id
            )
        else:
            claim = await asyncio.to_thread(
                self.queue.claim_within,
                self.config.batch_size,
                self.config.lease_s,
                self.worker_id,
                self.admission,
            )
            records = claim.records
            for tenant, count in claim.deferred.items():
                self.metrics.count_deferred(tenant, count)
            if claim.refused is not None:
                # the budget is empty: asking again before it refilled would only lease and turn back
                self._budget_wait_until = time.monotonic() + self.budget_retry_s
        if not records:
            return 0
        gate = asyncio.Semaphore(self.config.concurrency)

        async def one(record: QueueRecord) -> None:
            async with gate:
                await self._process(record)

        await asyncio.gather(*(one(r) for r in records))
        return len(records)

    async def _process(self, record: QueueRecord) -> None:
        key = record.key
        if time.monotonic() < self._pause_until:
            await asyncio.to_thread(self.queue.release, key, worker=self.worker_id)
            return
        stored = await asyncio.to_thread(self.store.get_trace, key.tenant, key.trace_id)
        if stored is None:
            await asyncio.to_thread(
                self.queue.fail, key, worker=self.worker_id, reason="trace_missing", permanent=True
            )
            self.metrics.judge_failures.labels(reason="trace_missing").inc()
            return
        trace = rag_trace_from_record(stored)
        try:
            judgment = await self.judge.judge(trace)
        except JudgeUnavailable as exc:
            self.metrics.judge_failures.labels(reason=exc.reason).inc()
            self._pause_until = time.monotonic() + exc.retry_after_s
            # the endpoint's failure, not the item's: the attempt is refunded (the worker pauses instead)
            await asyncio.to_thread(
                self.queue.fail,
                key,
                worker=self.worker_id,
                reason=exc.reason,
                retry_after_s=exc.retry_after_s,
                refund=True,
            )
            return
        judgment = judgment.model_copy(
            update={"app": trace.app, "tenant": trace.tenant, "trace_revision": trace.revision}
        )
        new, new_flags = await asyncio.to_thread(self.judgments.save, judgment, self.config.flag_threshold)
        if new:
            self._count(judgment, record)
        for flag in new_flags:
            self.metrics.review_flags.labels(
                **self.metrics.scope_kw(flag.tenant, flag.app), reason=flag.reason
            ).inc()
        if self.after_judgment is not None:
            # before completing: if the hook fails, the redelivered item runs it again (it is idempotent)
            await self.after_judgment(judgment)
        await asyncio.to_thread(self.queue.complete, key)
        await self._judge_again_if_changed(key, trace)

    async def _judge_again_if_changed(self, key: ItemKey, judged: RagTrace) -> None:
        """A later version of the trace stored while it was being judged (its answer arrived late):
        queue it again. Checked after completing, and the update's fan-out queues judged items
        again after its commit, so an update is never missed between the two."""
        revision = await asyncio.to_thread(self.store.trace_revision, key.tenant, key.trace_id)
        if revision is None or revision <= judged.revision:
            return  # the common case, told by one value: no later version
        stored = await asyncio.to_thread(self.store.get_trace, key.tenant, key.trace_id)
        if stored is None:
            return
        current = rag_trace_from_record(stored)
        if current.revision > judged.revision and judged_digest(current) != judged_digest(judged):
            requeued = await asyncio.to_thread(self.queue.rejudge, [key])
            if requeued:
                self.metrics.judge_rejudged.inc(len(requeued))

    async def _expire_deferred(self) -> None:
        """End the deferrals older than `max_deferral_s` (at most every `_EXPIRY_EVERY_S`), counted."""
        if self.admission is None or time.monotonic() < self._expire_at:
            return
        self._expire_at = time.monotonic() + _EXPIRY_EVERY_S
        expired = await asyncio.to_thread(self.queue.expire_deferred, self.max_deferral_s)
        for tenant, count in expired.items():
            self.metrics.count_expired(tenant, count)

    def _count(self, judgment: Judgment, record: QueueRecord) -> None:
        m = self.metrics
        scope = m.scope_kw(judgment.tenant, judgment.app)
        if judgment.outcome == "failed":
            verdict = "failed"
            m.judge_failures.labels(reason=judgment.failure_reason or "unknown").inc()
        elif judgment.outcome == "no_claims":
            verdict = "no_claims"
        else:
            verdict = "unfaithful" if judgment.unsupported else "faithful"
        m.judge_verdicts.labels(**scope, verdict=verdict, judge=judgment.judge).inc()
        if judgment.diagnosis is not None:
            m.judge_diagnoses.labels(**scope, diagnosis=judgment.diagnosis).inc()
        m.judge_requests.labels(judge=judgment.judge).inc(len(judgment.calls))
        m.judge_tokens.labels(judge=judgment.judge, kind="input").inc(judgment.prompt_tokens)
        m.judge_tokens.labels(judge=judgment.judge, kind="output").inc(judgment.completion_tokens)
        m.judge_calls_without_usage.labels(judge=judgment.judge).inc(judgment.calls_without_usage)
        if judgment.cost_usd is not None:
            m.judge_cost.labels(judge=judgment.judge).inc(judgment.cost_usd)
        m.judge_duration.labels(judge=judgment.judge).observe(judgment.latency_s)
        m.judge_completed.labels(judge=judgment.judge).inc()
        m.judge_last_success.set(time.time())

    async def _run(self) -> None:
        # The wait after an empty claim doubles from poll_s up to idle_poll_max_s: an idle claim is a
        # transaction, and an idle server made two a second. What this process queues wakes the
        # worker at once (`wake`); what another process queues, or a lease that expired, waits at
        # most idle_poll_max_s.
        config = self.config
        idle_s = config.poll_s
        longest_s = max(config.idle_poll_max_s, config.poll_s)
        while True:
            self._woken.clear()
            try:
                claimed = await self.run_once()
            except StoreUnavailable as exc:
                log.warning("judge worker: store unavailable (%s); retrying", exc)
                claimed = 0
            except Exception:
                log.exception("judge worker batch failed; retrying")
                claimed = 0
            # the endpoint's retry delay and the budget's are waited out whatever is queued meanwhile
            hold = max(self._pause_until - time.monotonic(), 0.0)
            if not claimed:
                hold = max(hold, self._budget_wait_until - time.monotonic())
            if hold:
                await asyncio.sleep(hold)
            if claimed:
                idle_s = config.poll_s
            elif hold < idle_s:  # the rest of the idle wait, cut short by a wake-up
                woken = await self._idle(idle_s - hold)
                idle_s = config.poll_s if woken else min(2 * idle_s, longest_s)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"judge-worker-{self.worker_id}")

    async def stop(self) -> None:
        """Stop claiming; items leased and not finished return when their lease expires. Safe twice."""
        await cancel_task(self._task)
        self._task = None


# The estimate is a sum over its whole window (a day of sampled traces: a million at 600 traces/s and
# 2 %, seconds of a database thread). Refreshing it keeps to a tenth of that thread: a run that took
# longer than a tenth of `estimate_every_s` makes the next wait nine times as long as it took.
ESTIMATE_DUTY = 0.1


def estimate_wait_s(every_s: float, took_s: float) -> float:
    """Seconds until the next estimate, after one that took `took_s`."""
    return max(every_s, took_s * (1 - ESTIMATE_DUTY) / ESTIMATE_DUTY)


async def refresh_estimates(export: Callable[[], None], every_s: float, what: str) -> None:
    """Run `export` in a worker thread now and forever after, `estimate_wait_s` apart; a failure is
    logged (as `what`) and the next run comes as usual."""
    while True:
        started = time.monotonic()
        try:
            await asyncio.to_thread(export)
        except Exception:
            log.exception("%s failed; retrying", what)
        await asyncio.sleep(estimate_wait_s(every_s, time.monotonic() - started))


class FaithfulnessEstimator:
    """Recomputes the Hájek faithfulness estimates over the rolling window and exports them as gauges.

    Over every tenant's judged traces, one tenant at a time when the metrics carry a tenant label
    (`metrics.tenant_label`), or one tenant's only when `tenant` is given (the weekly report)."""

    def __init__(
        self, config: JudgingConfig, judgments: JudgmentStore, metrics: Metrics, *, tenant: str | None = None
    ):
        self.config = config
        self.tenant = tenant
        self.judgments = judgments
        self.metrics = metrics
        self._task: asyncio.Task[None] | None = None

    def compute(
        self, now: datetime | None = None, reading: Reading = "claims", *, tenant: str | None = None
    ) -> dict[Grouping, dict[tuple[str, ...], FaithfulnessEstimate]]:
        """Estimates per grouping: {"app": {(app,): est}, "app_release": ..., "app_intent": ...}, of the
        share of supported claims (`claims`) or of answers with no unsupported claim (`answers`);
        `tenant` narrows an estimator made for every tenant to one."""
        now = now or datetime.now(UTC)
        start = now - timedelta(seconds=self.config.estimate_window_s)
        cells = self.judgments.window_cells(start, now, tenant=tenant or self.tenant, reading=reading)
        return {grouping: estimate_cells_by(cells, grouping) for grouping in GROUPINGS}

    def export(self) -> None:
        """Both readings as gauges: claim-level (`ragmon_faithfulness_estimate`) and answer-level
        (`ragmon_faithful_answers_ratio`), each with its interval, n and the no-claims count; one set
        per tenant when the metrics carry a tenant label, else over every tenant."""
        now = datetime.now(UTC)
        start = now - timedelta(seconds=self.config.estimate_window_s)
        if self.metrics.tenant_label is None or self.tenant is not None:
            cells = self.judgments.window_cells_of(start, now, READINGS, tenant=self.tenant)
            self._export(self.tenant, cells)
            return
        for tenant, cells in self.judgments.window_cells_per_tenant(start, now, READINGS).items():
            self._export(tenant, cells)

    def _export(self, tenant: str | None, cells: dict[Reading, list[SampleCell]]) -> None:
        m = self.metrics
        claims, answers = (
            {grouping: estimate_cells_by(cells[reading], grouping) for grouping in GROUPINGS}
            for reading in READINGS
        )
        gauges = {
            "claims": (m.faithfulness_estimate, m.faithfulness_lower, m.faithfulness_upper),
            "answers": (m.faithful_answers, m.faithful_answers_lower, m.faithful_answers_upper),
        }
        for reading, results in (("claims", claims), ("answers", answers)):
            point, lower, upper = gauges[reading]
            for grouping, estimates in results.items():
                for key, est in estimates.items():
                    release = m.release_label(tenant, key[1]) if grouping == "app_release" else "all"
                    intent = m.intent_label(tenant, key[1]) if grouping == "app_intent" else "all"
                    labels = {**m.scope_kw(tenant, key[0]), "release": release, "intent": intent}
                    if est.estimate is not None and est.lower is not None and est.upper is not None:
                        point.labels(**labels).set(est.estimate)
                        lower.labels(**labels).set(est.lower)
                        upper.labels(**labels).set(est.upper)
                    if reading == "claims":
                        m.faithfulness_sample_size.labels(**labels).set(est.n_judged)
                        m.faithfulness_no_claims.labels(**labels).set(est.n_no_claims)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(
                refresh_estimates(self.export, self.config.estimate_every_s, "faithfulness estimate"),
                name="faithfulness-estimator",
            )

    async def stop(self) -> None:
        await cancel_task(self._task)
        self._task = None
