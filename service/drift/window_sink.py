"""`DriftWindowSink`: every new trace offered to the drift windows, in bounded memory, never blocking.

    new traces ──▶ DriftWindowSink ── reservoirs per (tenant, app, model, bucket), bounded
                        │   model-change events, regeneration bands per (tenant, app, intent)
                        ▼ taken by the scheduler's flush (`monitor.py`)

Memory is bounded whatever the traffic: at most `max_open_buckets`
reservoirs of `reservoir_capacity` observations each between flushes (traces
for further buckets are dropped and counted in `dropped`), one regeneration
monitor per (tenant, app, intent) with apps and intents capped, and a capped
set of known model keys per app.

Embedding-model change is its own event: the first trace of an app that
carries a new app embedding model (name or dimension) counts
`ragmon_embedding_model_changes_total{app}` and queues an
`embedding_model_change` run (`take_events`), stored by the scheduler's next flush
(`monitor.py`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime
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
from service.drift.sample import Observation
from service.drift.store import BucketBatch, RunRecord, bucket_start
from service.metrics import Metrics
from service.model import Feedback, RagTrace

__all__ = ["MODEL_CHANGE", "DriftWindowSink"]

log = logging.getLogger(__name__)

_BucketKey = tuple[str, str, str, datetime]
MODEL_CHANGE = "embedding_model_change"


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
