"""Drift in the running service: `DriftScheduler` runs the detectors on the windows `DriftWindowSink` keeps
(`window_sink.py`).

    new traces ──▶ DriftWindowSink ── reservoirs per (tenant, app, model, bucket), bounded
                        │   model-change events, regeneration bands per (tenant, app, intent)
                        ▼ flush (scheduler thread: built-in embedder runs here, never on ingest)
                   DriftStore: observation sample ──▶ current window ─┐
                               pinned references ─────────────────────┴▶ detectors ─▶ drift runs + gauges

The sink's memory is bounded whatever the traffic (`window_sink.py`). Each
flush merges its reservoirs into the stored buckets, which grow to
`bucket_capacity` (the window's size) flush by flush while staying uniform
samples, so the window of the last day holds min(traffic, `window_capacity`)
traces whatever the hourly profile was.

Windows never overlap their reference: a run compares the reference with
the traffic after the reference's range ends (or the last `window_s`
seconds, whichever is shorter), so a reference pinned within the day is not
compared with the hours it was drawn from.

Embedding-model change is its own event: the sink queues an
`embedding_model_change` run for the first trace of an app that carries a new
app embedding model, stored by the next flush. Windows and references are kept
per model, so vectors of two models are never compared. The scheduled run also
scores `EmbeddingModelChange` against the app's references, so the alarm
stays up until someone pins a reference for the new model.

Scheduling: `tick()` flushes (every process must, its windows live in its
own memory) and then calls `run_due()` only when `gate()` is true. One
scheduler may run detectors per deployment: in distributed mode `gate` is
replaced by a check of a PostgreSQL advisory lock; embedded, it is always
true. Alarms use hysteresis: a result alarms once `hysteresis` consecutive
runs of that detector on that (app, model) have drifted. A window that
alarmed never feeds a reference (`pinning.py` leaves its buckets out).

Where ragmon embeds the queries itself (no app vectors), the query test is
the query-text test whose embedder was fitted on the reference when it was
pinned and stored with it (`embedders.py`). After each run the query group
that grew most is exported as `ragmon_drift_top_group_info`, one series per
(app, detector), for the drift alert's annotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from detectors import HashingEmbedder, embedding_model_key
from service.config import DriftConfig
from service.drift.checks import Check, CheckSettings, TextReference, check_model_change, check_samples
from service.drift.sample import Sample
from service.drift.store import BucketBatch, DriftStore, ReferenceInfo, RunRecord
from service.drift.window_sink import DriftWindowSink
from service.metrics import Metrics

__all__ = ["TOP_GROUP_LABEL_CHARS", "DriftScheduler"]

log = logging.getLogger(__name__)

REGENERATION = "regeneration_band"


class DriftScheduler:
    """Runs every drift detector per app on a schedule and on demand; stores runs, sets the drift gauges."""

    def __init__(
        self,
        config: DriftConfig,
        store: DriftStore,
        metrics: Metrics,
        sink: DriftWindowSink | None = None,
        *,
        gate: Callable[[], bool] = lambda: True,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.sink = sink
        # The hook for one scheduler per deployment: `tick()` runs detectors only while this is True.
        self.gate = gate
        self.embedder = sink.embedder if sink is not None else HashingEmbedder(dim=config.embedder_dim)
        self.settings = CheckSettings(
            alpha=config.alpha, alphas=dict(config.alphas), min_window=config.min_window, seed=config.seed
        )
        self._next_run = time.time() + config.interval_s
        self._run_lock = threading.Lock()
        self._task: asyncio.Task[None] | None = None
        self._flushes = 0
        # The one `ragmon_drift_top_group_info` series per (app, detector), so a run can replace it.
        self._top_groups: dict[tuple[tuple[str, ...], str], tuple[str, str]] = {}

    # -- flushing ----------------------------------------------------------------

    def flush(self) -> int:
        """Merge the sink's reservoirs into the stored sample (embedding texts first); return rows written."""
        if self.sink is None:
            return 0
        batches, events = self.sink.take()
        builtin = self.sink.builtin_key
        ready = []
        for batch in batches:
            if batch.model_key == builtin:
                batch = self._embedded(batch)
            ready.append(batch)
        self._flushes += 1
        written = self.store.add_observations(ready, seed=self.config.seed + self._flushes)
        if events:
            self.store.add_runs(events)
            for event in events:
                self._count(event)
        return written

    def flush_events(self) -> int:
        """Store pending model-change events now (cheap; the API calls it before listing runs)."""
        if self.sink is None:
            return 0
        events = self.sink.take_events()
        if events:
            self.store.add_runs(events)
            for event in events:
                self._count(event)
        return len(events)

    def _embedded(self, batch: BucketBatch) -> BucketBatch:
        """The batch with built-in vectors for the queries that have text (this is the slow part of drift)."""
        texts = [o.query for o in batch.observations if o.query]
        if not texts:
            return batch
        vectors = iter(self.embedder.embed(texts))
        observations = [replace(o, vector=next(vectors)) if o.query else o for o in batch.observations]
        return replace(batch, observations=observations)

    # -- running -----------------------------------------------------------------

    def tick(self) -> list[RunRecord]:
        """Flush, then run the detectors if they are due and this process holds the gate."""
        self.flush()
        if not self.gate():
            return []
        return self.run_due()

    def run_due(self, now: datetime | None = None) -> list[RunRecord]:
        """Run every detector when the interval has passed since the last scheduled run."""
        at = now or datetime.now(UTC)
        if at.timestamp() < self._next_run:
            return []
        self._next_run = at.timestamp() + self.config.interval_s
        runs = self.run(trigger="schedule", now=at)
        self.store.delete_older_than(at - timedelta(days=self.config.retention_days))
        self.store.compact(
            at - timedelta(seconds=self.config.window_s), self.config.archive_capacity, seed=self.config.seed
        )
        return runs

    def run(
        self,
        *,
        tenant: str | None = None,
        app: str | None = None,
        trigger: str = "manual",
        now: datetime | None = None,
    ) -> list[RunRecord]:
        """Flush, then run every detector for every (app, model) with a reference; store and export it all.

        A scheduled run also closes the regeneration bands' windows; a manual
        one reports the open windows without closing them.
        """
        with self._run_lock:
            self.flush()
            at = now or datetime.now(UTC)
            window = (at - timedelta(seconds=self.config.window_s), at)
            records: list[RunRecord] = []
            tenants = [tenant] if tenant is not None else self.store.tenants()
            for name in tenants:
                records.extend(self._run_tenant(name, app, window, trigger, at))
            records.extend(self._run_bands(tenant, app, trigger, at))
            self.store.add_runs(records)
            self._export(records)
            return records

    def _run_tenant(
        self, tenant: str, app: str | None, window: tuple[datetime, datetime], trigger: str, at: datetime
    ) -> list[RunRecord]:
        records: list[RunRecord] = []
        references = self.store.latest_references(tenant, app=app)
        by_app: dict[str, list[ReferenceInfo]] = {}
        for reference in references:
            by_app.setdefault(reference.app, []).append(reference)
        for app_name, app_refs in sorted(by_app.items()):
            window_keys = {
                model: seen
                for (_, model), seen in self.store.window_keys(
                    tenant, app=app_name, since=window[0], until=window[1]
                ).items()
            }
            for reference in app_refs:
                ref_sample = self.store.reference_sample(reference.id)
                reference_range = _reference_range(reference, ref_sample)
                since = _window_start(window, reference_range)
                current, _, _ = self.store.draw(
                    tenant,
                    app_name,
                    reference.model_key,
                    since=since,
                    until=window[1],
                    capacity=self.config.window_capacity,
                    seed=self.config.seed,
                )
                text = None
                if reference.model_key == self._builtin_key:
                    stored = self.store.reference_embedder(reference.id)
                    text = TextReference(None if stored is None else stored[1])
                checks = check_samples(
                    ref_sample,
                    current,
                    reference_id=reference.label,
                    reference_range=reference_range,
                    window=(since, window[1]),
                    settings=self.settings,
                    text=text,
                )
                if since > window[0]:
                    checks = [_clipped(c, window[0]) for c in checks]
                records.extend(
                    self._record(tenant, app_name, reference.model_key, c, trigger, at) for c in checks
                )
            reference_counts = Counter({r.model_key: r.n for r in app_refs})
            earliest = min(_reference_range(r, None)[0] for r in app_refs)
            latest = max(_reference_range(r, None)[1] for r in app_refs)
            change = check_model_change(
                reference_counts,
                {m: s for m, s in window_keys.items() if m != self._builtin_key},
                reference_id=",".join(sorted(r.label for r in app_refs)),
                reference_range=(earliest, max(earliest, latest)),
                window=window,
            )
            if any(m != self._builtin_key for m in reference_counts):
                records.append(self._record(tenant, app_name, None, change, trigger, at))
        return records

    def unreferenced(
        self, tenant: str, *, app: str | None = None, now: datetime | None = None
    ) -> list[tuple[str, str]]:
        """(app, model) pairs with traffic in the current window but no pinned reference to compare with."""
        at = now or datetime.now(UTC)
        pinned = {(r.app, r.model_key) for r in self.store.latest_references(tenant, app=app)}
        since = at - timedelta(seconds=self.config.window_s)
        return sorted(
            k for k in self.store.window_keys(tenant, app=app, since=since, until=at) if k not in pinned
        )

    @property
    def _builtin_key(self) -> str:
        return embedding_model_key(self.embedder.model_name, self.embedder.dim)

    def _record(
        self, tenant: str, app: str, model_key: str | None, check: Check, trigger: str, at: datetime
    ) -> RunRecord:
        alarm = check.result.drifted and self._consecutive(tenant, app, model_key, check.result.detector)
        return RunRecord(
            tenant=tenant,
            app=app,
            model_key=model_key,
            intent=None,
            result=check.result,
            alarm=alarm,
            outcome=check.outcome,
            trigger=trigger,
            ran_at=at,
            explanation=check.explanation,
        )

    def _consecutive(self, tenant: str, app: str, model_key: str | None, detector: str) -> bool:
        """Hysteresis: did the previous `hysteresis - 1` runs of this detector all drift too?"""
        needed = self.config.hysteresis - 1
        if needed == 0:
            return True
        previous = [
            r
            for r in self.store.runs(
                tenant, app=app, detector=detector, model_key=model_key, limit=needed + 10
            )
            if r.trigger != "event" and r.outcome != "insufficient_data"
        ][:needed]
        return len(previous) == needed and all(r.result.drifted for r in previous)

    def _run_bands(self, tenant: str | None, app: str | None, trigger: str, at: datetime) -> list[RunRecord]:
        if self.sink is None:
            return []
        records = []
        states = {}
        for (band_tenant, band_app, intent), result, state in self.sink.band_results(
            close=trigger == "schedule"
        ):
            if (tenant is not None and band_tenant != tenant) or (app is not None and band_app != app):
                continue
            states[(band_tenant, band_app, intent)] = state
            judged = not result.details.get("warming_up") and result.n_window > 0
            records.append(
                RunRecord(
                    tenant=band_tenant,
                    app=band_app,
                    model_key=None,
                    intent=intent,
                    result=result,
                    alarm=result.drifted,
                    outcome=("drift" if result.drifted else "ok") if judged else "insufficient_data",
                    trigger=trigger,
                    ran_at=at,
                )
            )
        if states and trigger == "schedule":
            self.store.save_monitor_states(states)
        return records

    # -- metrics -----------------------------------------------------------------

    def _count(self, record: RunRecord) -> None:
        m = self.metrics
        scope = m.scope_kw(record.tenant, record.app)
        m.drift_runs.labels(**scope, detector=record.result.detector, outcome=record.outcome).inc()
        m.drift_last_run.labels(detector=record.result.detector).set(record.ran_at.timestamp())

    def _export(self, records: Sequence[RunRecord]) -> None:
        """Count every run; set each (app, detector) gauge from its largest window in this run."""
        m = self.metrics
        best: dict[tuple[tuple[str, ...], str], RunRecord] = {}
        for record in records:
            self._count(record)
            result = record.result
            if result.detector == REGENERATION:
                labels = {
                    **m.scope_kw(record.tenant, record.app),
                    "intent": m.intent_label(record.tenant, record.intent),
                }
                m.regeneration_rate.labels(**labels).set(result.statistic)
                m.regeneration_band_lower.labels(**labels).set(float(str(result.details.get("lower", 0.0))))
                m.regeneration_band_upper.labels(**labels).set(float(str(result.details.get("upper", 1.0))))
                continue
            key = (m.scope(record.tenant, record.app), result.detector)
            held = best.get(key)
            if held is None or _rank(record) > _rank(held):
                best[key] = record
        for (scope, detector), record in best.items():
            result = record.result
            labels = {**dict(zip(m.scope_labels, scope, strict=True)), "detector": detector}
            m.drift_score.labels(**labels).set(result.statistic)
            m.drift_p_value.labels(**labels).set(math.nan if result.p_value is None else result.p_value)
            m.drift_threshold.labels(**labels).set(math.nan if result.alpha is None else result.alpha)
            m.drift_detected.labels(**labels).set(1.0 if record.alarm else 0.0)
            m.drift_window_size.labels(**labels).set(result.n_window)
            self._export_top_group(scope, detector, record)

    def _export_top_group(self, scope: tuple[str, ...], detector: str, record: RunRecord) -> None:
        """Replace the (app, detector) top-group series with this run's top group, or drop it."""
        gauge = self.metrics.drift_top_group
        previous = self._top_groups.pop((scope, detector), None)
        if previous is not None:
            with contextlib.suppress(KeyError):
                gauge.remove(*scope, detector, *previous)
        groups = record.explanation or []
        if not record.result.drifted or not groups:
            return
        top = groups[0]
        terms = _capped(", ".join(str(t) for t in top.get("terms") or []) or "(no distinctive words)")
        share = (
            f"{100 * float(top.get('share_reference', 0.0)):.1f}% -> "
            f"{100 * float(top.get('share_window', 0.0)):.1f}%"
        )
        gauge.labels(*scope, detector, terms, share).set(1.0)
        self._top_groups[(scope, detector)] = (terms, share)

    # -- lifecycle -----------------------------------------------------------------

    async def _loop(self) -> None:
        period = min(self.config.flush_s, self.config.interval_s)
        while True:
            await asyncio.sleep(period)
            try:
                await asyncio.to_thread(self.tick)
            except Exception:
                log.exception("drift: scheduled flush or run failed; will retry")

    async def start(self) -> None:
        """Restore model keys and band baselines from the store, then start the schedule loop."""
        await asyncio.to_thread(self.store.create_schema)
        if self.sink is not None:
            known, states = await asyncio.gather(
                asyncio.to_thread(self.store.model_keys), asyncio.to_thread(self.store.monitor_states)
            )
            self.sink.restore(known, states)
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="drift-scheduler")

    async def stop(self) -> None:
        """Stop the loop and flush what the sink holds. Safe twice and before start."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await asyncio.to_thread(self.flush)
        except Exception:
            log.exception("drift: final flush failed; the windows since the last flush are lost")


TOP_GROUP_LABEL_CHARS = 80
"""Longest `terms` label value of `ragmon_drift_top_group_info` (the series stays one short line)."""


def _capped(text: str, limit: int = TOP_GROUP_LABEL_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip(", ") + "…"


def _rank(record: RunRecord) -> tuple[int, int]:
    """Tested results beat untested ones; then the larger window wins."""
    return (0 if record.outcome in ("insufficient_data", "error") else 1, record.result.n_window)


def _window_start(window: tuple[datetime, datetime], reference_range: tuple[datetime, datetime]) -> datetime:
    """Where the window compared with a reference starts: never before the reference's range ends."""
    return min(window[1], max(window[0], reference_range[1]))


def _clipped(check: Check, requested: datetime) -> Check:
    """`check` noting that its window starts later than requested, because the reference ends there."""
    result = check.result
    details = {**result.details, "window_requested_from": requested.isoformat()}
    if check.outcome == "insufficient_data" and result.window_start is not None:
        details["insufficient_data"] = (
            f"{details.get('insufficient_data', '')}; the window starts where the reference ends "
            f"({result.window_start.isoformat()}), so it never holds the reference's own traffic"
        )
    return Check(result.model_copy(update={"details": details}), check.outcome, check.explanation)


def _reference_range(reference: ReferenceInfo, sample: Sample | None) -> tuple[datetime, datetime]:
    start = reference.range_start or reference.created_at
    end = reference.range_end or reference.created_at
    if sample is not None and len(sample):
        times = [o.time for o in sample.observations]
        # Half-open: the range ends just after its last trace, so a window from there never holds it.
        start, end = min(start, min(times)), max(end, max(times) + timedelta(microseconds=1))
    return start, max(start, end)
