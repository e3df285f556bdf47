"""Drift in the running service: `DriftWindowSink` keeps the windows, `DriftScheduler` runs the detectors.

    new traces ──▶ DriftWindowSink ── reservoirs per (tenant, app, model, bucket), bounded
                        │   model-change events, regeneration bands per (tenant, app, intent)
                        ▼ flush (scheduler thread: built-in embedder runs here, never on ingest)
                   DriftStore: observation sample ──▶ current window ─┐
                               pinned references ─────────────────────┴▶ detectors ─▶ drift runs + gauges

Memory is bounded whatever the traffic: at most `max_open_buckets`
reservoirs of `reservoir_capacity` observations each between flushes (traces
for further buckets are dropped and counted in `dropped`), one regeneration
monitor per (tenant, app, intent) with apps and intents capped, and a capped
set of known model keys per app. Each flush merges the reservoirs into the
stored buckets, which grow to `bucket_capacity` (the window's size) flush by
flush while staying uniform samples, so the window of the last day holds
min(traffic, `window_capacity`) traces whatever the hourly profile was.

Windows never overlap their reference: a run compares the reference with
the traffic after the reference's range ends (or the last `window_s`
seconds, whichever is shorter), so a reference pinned within the day is not
compared with the hours it was drawn from.

Embedding-model change is its own event: the first trace of an app that
carries a new app embedding model (name or dimension) counts
`ragmon_embedding_model_changes_total{app}` and stores an
`embedding_model_change` run at once. Windows and references are kept per
model, so vectors of two models are never compared. The scheduled run also
scores `EmbeddingModelChange` against the app's references, so the alarm
stays up until someone pins a reference for the new model.

Scheduling: `tick()` flushes (every process must, its windows live in its
own memory) and then calls `run_due()` only when `gate()` is true. One
scheduler may run detectors per deployment: in distributed mode `gate` is
replaced by a check of a PostgreSQL advisory lock; embedded, it is always
true. Alarms use hysteresis: a result alarms once `hysteresis` consecutive
runs of that detector on that (app, model) have drifted. A window that
alarmed never feeds a reference (`pin` leaves its buckets out).

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
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from detectors import DriftResult, HashingEmbedder, RegenerationBand, Reservoir, embedding_model_key
from detectors.features import (
    empty_retrieval,
    query_model_key,
    query_text,
    top1_score,
    top_hit,
    topk_mean_score,
)
from service.config import DriftConfig
from service.drift.checks import Check, CheckSettings, TextReference, check_model_change, check_samples
from service.drift.embedders import fit_reference_embedder
from service.drift.sample import Observation, Sample
from service.drift.store import BucketBatch, DriftStore, ReferenceInfo, RunRecord, bucket_start
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["DriftScheduler", "DriftWindowSink", "PinOutcome", "pin_references"]

log = logging.getLogger(__name__)

_BucketKey = tuple[str, str, str, datetime]
MODEL_CHANGE = "embedding_model_change"
REGENERATION = "regeneration_band"


class _Slot:
    """A reservoir item: filled with its observation only when the reservoir takes it."""

    __slots__ = ("observation",)

    def __init__(self) -> None:
        self.observation: Observation | None = None


class DriftWindowSink:
    """Sink: offers every new trace to its bounded reservoir; never blocks on I/O (see the module doc)."""

    def __init__(
        self, config: DriftConfig, metrics: Metrics, embedder: HashingEmbedder | None = None
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.embedder = embedder or HashingEmbedder(dim=config.embedder_dim)
        self.builtin_key = embedding_model_key(self.embedder.model_name, self.embedder.dim)
        self.dropped = 0
        self._lock = threading.Lock()
        self._reservoirs: dict[_BucketKey, Reservoir[_Slot]] = {}
        self._known_models: dict[tuple[str, str], set[str]] = {}
        self._apps: dict[str, set[str]] = {}
        self._events: deque[RunRecord] = deque(maxlen=1000)
        self._monitors: dict[tuple[str, str, str], RegenerationBand] = {}
        self._intents: dict[tuple[str, str], set[str]] = {}
        self._seeds = 0

    @property
    def held(self) -> int:
        """Observations held in memory now (at most `max_open_buckets × reservoir_capacity`)."""
        with self._lock:
            return sum(len(r) for r in self._reservoirs.values())

    def restore(
        self, known_models: dict[tuple[str, str], set[str]], monitor_states: dict[tuple[str, str, str], Any]
    ) -> None:
        """Take over the model keys and regeneration baselines a previous process left in the store."""
        with self._lock:
            for key, models in known_models.items():
                self._known_models.setdefault(key, set()).update(models)
            for band_key, state in monitor_states.items():
                try:
                    self._monitors[band_key] = RegenerationBand.from_state(_band_state(state))
                except (KeyError, TypeError, ValueError):
                    log.warning("drift: ignoring an unreadable regeneration-band state for %s", band_key)

    def _observe_all(self, batch: Sequence[RagTrace]) -> None:
        with self._lock:
            for trace in batch:
                self._observe(trace)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        # in a thread: sorting a batch into the reservoirs on the event loop delayed requests
        await asyncio.to_thread(self._observe_all, batch)

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        """Feedback carries nothing the windows keep (the band counts the traces' own flags)."""

    def _admit_app(self, tenant: str, app: str) -> bool:
        apps = self._apps.setdefault(tenant, set())
        if app in apps:
            return True
        if len(apps) >= self.config.max_apps:
            return False
        apps.add(app)
        return True

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        self.metrics.drift_dropped.labels(reason=reason).inc()

    def _observe(self, trace: RagTrace) -> None:
        tenant, app = trace.tenant, trace.app
        if not self._admit_app(tenant, app):
            self._drop("app_cap")
            return
        self._band(trace)
        model = query_model_key(trace) or self.builtin_key
        if not self._admit_model(trace, model):
            self._drop("model_cap")
            return
        key = (tenant, app, model, bucket_start(trace.start_time, self.config.bucket_s))
        reservoir = self._reservoirs.get(key)
        if reservoir is None:
            if len(self._reservoirs) >= self.config.max_open_buckets:
                self._drop("bucket_cap")
                return
            self._seeds += 1
            reservoir = Reservoir(
                self.config.reservoir_capacity, seed=self.config.seed * 1_000_003 + self._seeds
            )
            self._reservoirs[key] = reservoir
        # Most offers are skipped once a reservoir is full (Algorithm L), so the observation (the vector
        # copy above all) is built only for traces the reservoir takes.
        slot = _Slot()
        if reservoir.offer(slot, trace.start_time):
            slot.observation = self._observation(trace)

    def _observation(self, trace: RagTrace) -> Observation:
        vector = trace.query_embedding.vector if trace.query_embedding is not None else None
        text = query_text(trace)
        return Observation(
            trace_id=trace.trace_id,
            time=trace.start_time,
            release=trace.release,
            intent=trace.intent,
            query=None if text is None else text[: self.config.max_query_chars],
            vector=None if not vector else _float32(vector),
            top1=_finite(top1_score(trace)),
            topk=_finite(topk_mean_score(trace, self.config.top_k)),
            empty=empty_retrieval(trace),
            hit=top_hit(trace, self.config.hits_by),
        )

    def _admit_model(self, trace: RagTrace, model: str) -> bool:
        known = self._known_models.setdefault((trace.tenant, trace.app), set())
        if model in known:
            return True
        if len(known) >= self.config.max_models_per_app:
            return False
        app_models = {m for m in known if m != self.builtin_key}
        known.add(model)
        if model != self.builtin_key and app_models:
            # The built-in embedder is ragmon's own; only a change of the app's model is an event.
            self.metrics.embedding_model_changes.labels(
                **self.metrics.scope_kw(trace.tenant, trace.app)
            ).inc()
            dims = {m.rpartition("@")[2] for m in app_models}
            self._events.append(
                RunRecord(
                    tenant=trace.tenant,
                    app=trace.app,
                    model_key=model,
                    intent=None,
                    result=DriftResult(
                        detector=MODEL_CHANGE,
                        version="1",
                        reference_id=None,
                        window_start=trace.start_time,
                        window_end=trace.start_time,
                        n_reference=0,
                        n_window=1,
                        statistic=1.0,
                        p_value=None,
                        alpha=None,
                        drifted=True,
                        details={
                            "statistic_name": "new_model_seen",
                            "new_models": {model: 1},
                            "known_models": sorted(app_models),
                            "dimension_changed": model.rpartition("@")[2] not in dims,
                        },
                    ),
                    alarm=True,
                    outcome="drift",
                    trigger="event",
                    ran_at=datetime.now(UTC),
                )
            )
        return True

    def _band(self, trace: RagTrace) -> None:
        intents = self._intents.setdefault((trace.tenant, trace.app), set())
        intent = trace.intent or "none"
        if intent not in intents:
            if len(intents) >= self.config.max_intents:
                intent = "other"
            intents.add(intent)
        key = (trace.tenant, trace.app, intent)
        monitor = self._monitors.get(key)
        if monitor is None:
            monitor = RegenerationBand(
                alpha=self.config.regeneration_alpha, min_baseline=self.config.regeneration_min_baseline
            )
            self._monitors[key] = monitor
        monitor.update(trace.is_regeneration, at=trace.start_time)

    def take(self) -> tuple[list[BucketBatch], list[RunRecord]]:
        """Hand over (and forget) every reservoir and pending event; the next traces start new ones."""
        with self._lock:
            reservoirs, self._reservoirs = self._reservoirs, {}
            events = list(self._events)
            self._events.clear()
        batches = [
            BucketBatch(
                tenant,
                app,
                model,
                start,
                reservoir.seen,
                [slot.observation for slot in reservoir.items if slot.observation is not None],
            )
            for (tenant, app, model, start), reservoir in reservoirs.items()
        ]
        return batches, events

    def take_events(self) -> list[RunRecord]:
        """Hand over (and forget) the pending model-change events only."""
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def band_results(self, *, close: bool) -> list[tuple[tuple[str, str, str], DriftResult, dict[str, Any]]]:
        """Each regeneration monitor's result (closing its window when `close`) and its state to keep."""
        with self._lock:
            out = []
            for key, monitor in self._monitors.items():
                if monitor.result().n_window == 0 and close:
                    continue
                result = monitor.close_window() if close else monitor.result()
                out.append((key, result, monitor.to_state()))
            return out


def _float32(vector: Sequence[float]) -> Any:
    import numpy as np

    return np.asarray(vector, dtype=np.float32)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _band_state(state: dict[str, Any]) -> dict[str, Any]:
    """A regeneration-band state read back from JSON (times as ISO strings)."""
    restored = dict(state)
    for field in ("start", "end"):
        value = restored.get(field)
        restored[field] = None if value is None else datetime.fromisoformat(str(value))
    return restored


class PinOutcome:
    """What `pin_references` did: the references it pinned and the (app, model) pairs it could not."""

    def __init__(self) -> None:
        self.pinned: list[ReferenceInfo] = []
        self.skipped: list[dict[str, Any]] = []

    def to_json(self) -> dict[str, Any]:
        return {"pinned": [r.to_json() for r in self.pinned], "skipped": self.skipped}


def pin_references(
    store: DriftStore,
    tenant: str,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    release: str | None = None,
    app: str | None = None,
    capacity: int = 2000,
    min_size: int = 1,
    seed: int = 0,
    now: datetime | None = None,
) -> PinOutcome:
    """Pin a new reference version per (app, model) from a time range or a release.

    Buckets inside the window of a run that alarmed on that (app, model) are
    left out: an alarming window never feeds a reference. Where the sample
    has query texts, the query-text test's embedder is fitted on it and
    stored with it. Ranges are half-open: a reference pinned from a release
    ends just after its last trace, where the windows compared with it start.
    Raises ValueError unless exactly one of a range (`since` and `until`) or
    `release` is given.
    """
    if (release is None) == (since is None or until is None):
        raise ValueError("pin from a time range (since and until) or from a release, not both or neither")
    if since is not None and until is not None and until <= since:
        raise ValueError(f"the range ends ({until.isoformat()}) before it starts ({since.isoformat()})")
    now = now or datetime.now(UTC)
    lo = since or datetime(1970, 1, 1, tzinfo=UTC)
    hi = until or now + timedelta(days=1)
    outcome = PinOutcome()
    for app_name, model in sorted(store.window_keys(tenant, app=app, since=lo, until=hi)):
        exclude = store.alarming_ranges(tenant, app_name, model)
        sample, represented, excluded = store.draw(
            tenant,
            app_name,
            model,
            since=since,
            until=until,
            capacity=capacity,
            release=release,
            exclude=exclude,
            seed=seed,
        )
        if len(sample) < min_size:
            outcome.skipped.append(
                {
                    "app": app_name,
                    "model_key": model,
                    "n": len(sample),
                    "excluded_buckets": excluded,
                    "reason": f"{len(sample)} observations (needs {min_size})"
                    + (
                        f"; {excluded} buckets left out because a drift run alarmed there" if excluded else ""
                    ),
                }
            )
            continue
        times = [o.time for o in sample.observations]
        outcome.pinned.append(
            store.pin(
                tenant,
                app_name,
                model,
                sample,
                range_start=since or min(times),
                range_end=until or max(times) + timedelta(microseconds=1),
                release=release,
                traces_represented=represented,
                excluded_buckets=excluded,
                embedder=fit_reference_embedder(sample.texts(), seed=seed),
                now=now,
            )
        )
    return outcome


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
