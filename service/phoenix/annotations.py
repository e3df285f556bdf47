"""`PhoenixAnnotator`: ragmon's judgments and reviewers' labels, written as annotations on Phoenix root spans.

    judge worker ──after_judgment──▶ ┐
    review submit ──reviewed────────▶ ├─▶ bounded buffer ──▶ writer ──▶ root span of the trace (GET spans)
                                                                   └──▶ POST span_annotations (upsert)

What lands in Phoenix, on the trace's root span (the span without a parent,
looked up by trace id in `phoenix.project`, then in Phoenix's other projects, since
Phoenix files a trace under the project its spans name):

* a judgment: name `faithfulness`, annotator kind `LLM`, label `faithful`
  (no unsupported claim) or `unfaithful`, score = ragmon's faithfulness
  (supported / claims), an explanation listing the unsupported claims, the
  diagnosis and the judge's rationale, metadata with the judge and counts,
  identifier = the judge version. An answer without claims is labelled
  `no_claims` with no score; a failed judgment is not written. The judgment
  of a blind review item is held until it is labelled (the pipeline decides:
  `Pipeline.after_review`), so Phoenix cannot show a blind reviewer the verdict.
* a reviewer's label: name `faithfulness`, annotator kind `HUMAN`, label =
  the verdict (`faithful`, `unfaithful`, `unsure`), score 1/0 (none when
  unsure), the note as explanation, identifier `review/<reviewer>`.

Guarantees: idempotent, because Phoenix keeps one annotation per (name,
span, identifier) and updates it on a repeat, so a redelivered judgment or a
retry never duplicates one. Off the judge's hot path: the hooks only queue
(never wait, never raise); the buffer is bounded (`phoenix.annotate_buffer`)
and what does not fit is dropped and counted
(`ragmon_phoenix_annotations_dropped_total{reason="buffer_full"}`). A root
span Phoenix does not have yet (its insert lags behind the tee) is first
looked up `phoenix.annotate_delay_s` after the annotation was queued, then
again quietly with backoff, up to `phoenix.max_attempts` times: only the
final miss is counted (dropped, `root_span_missing`), so the failure counter
means Phoenix failed, not that it was still inserting. Phoenix down or
answering 408/429/5xx is retried the same way and counted per try in
`ragmon_phoenix_annotation_failures_total` (`retries_exhausted` when out of
tries); other 4xx drop the batch (`rejected`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

import httpx

from service.config import PhoenixConfig
from service.judge.judgment import Judgment
from service.lifecycle import cancel_task
from service.metrics import Metrics
from service.phoenix.client import RETRYABLE, backoff_s, http_client, reason_of_error
from service.review.records import ReviewRecord

if TYPE_CHECKING:
    # arize-phoenix-client (the `phoenix` extra) is imported only when annotating is on
    from phoenix.client import AsyncClient
    from phoenix.client.resources.spans import SpanAnnotationData

__all__ = ["ANNOTATION_NAME", "Annotation", "PhoenixAnnotator", "judgment_annotation", "review_annotation"]

log = logging.getLogger(__name__)

ANNOTATION_NAME = "faithfulness"
_MAX_EXPLANATION_CHARS = 8000
_ROOT_CACHE = 10_000
_PROJECTS_TTL_S = 60.0  # how long the list of Phoenix projects is reused for lookups outside phoenix.project


@dataclass(frozen=True, slots=True)
class Annotation:
    """One annotation meant for the root span of `trace_id`, and how often writing it was tried."""

    trace_id: str
    annotator_kind: Literal["LLM", "HUMAN"]
    label: str
    score: float | None
    explanation: str
    identifier: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    attempts: int = 0
    not_before: float = 0.0

    @property
    def kind(self) -> str:
        return self.annotator_kind.lower()

    def for_span(self, span_id: str) -> SpanAnnotationData:
        result: dict[str, Any] = {"label": self.label, "explanation": self.explanation}
        if self.score is not None:
            result["score"] = self.score
        return {
            "name": ANNOTATION_NAME,
            "annotator_kind": self.annotator_kind,
            "span_id": span_id,
            "result": result,  # type: ignore[typeddict-item]
            "metadata": dict(self.metadata),
            "identifier": self.identifier,
        }


def _cut(text: str) -> str:
    return text if len(text) <= _MAX_EXPLANATION_CHARS else text[: _MAX_EXPLANATION_CHARS - 1] + "…"


def judgment_annotation(judgment: Judgment) -> Annotation | None:
    """The LLM annotation of a judgment (see the module docstring); None for a failed judgment."""
    if judgment.outcome == "failed":
        return None
    parts: list[str] = []
    if judgment.outcome == "no_claims":
        label, score = "no_claims", None
        parts.append("The answer makes no factual claims (an abstention).")
    else:
        label = "unfaithful" if judgment.unsupported else "faithful"
        score = judgment.faithfulness
        parts.append(
            f"Faithfulness {score:.2f}: {len(judgment.supported)} of {len(judgment.claims)} claims "
            "supported by the retrieved context."
        )
        if judgment.unsupported:
            listed = "; ".join(f'[{i}] "{judgment.claims[i]}"' for i in judgment.unsupported)
            parts.append(f"Unsupported claims: {listed}.")
    sufficient = {True: "sufficient", False: "insufficient", None: "not assessed"}[
        judgment.context_sufficient
    ]
    parts.append(
        f"Diagnosis: {judgment.diagnosis} (failure mode: {judgment.failure_mode}; context {sufficient})."
    )
    if judgment.rationale:
        parts.append(f"Judge rationale: {judgment.rationale}")
    metadata: dict[str, Any] = {
        "source": "ragmon",
        "judge": judgment.judge,
        "judge_model": judgment.judge_model,
        "judge_version": judgment.judge_version,
        "diagnosis": judgment.diagnosis,
        "failure_mode": judgment.failure_mode,
        "context_sufficient": judgment.context_sufficient,
        "claims": len(judgment.claims),
        "supported": len(judgment.supported),
        "app": judgment.app,
        "judged_at": judgment.judged_at.isoformat(),
    }
    return Annotation(
        trace_id=judgment.trace_id,
        annotator_kind="LLM",
        label=label,
        score=score,
        explanation=_cut(" ".join(parts)),
        identifier=judgment.judge_version,
        metadata=metadata,
    )


_REVIEW_SCORES: Mapping[str, float | None] = {"faithful": 1.0, "unfaithful": 0.0, "unsure": None}


def review_annotation(record: ReviewRecord) -> Annotation:
    """The HUMAN annotation of a reviewer's label (see the module docstring)."""
    review = record.review
    parts = [f"Reviewer {record.reviewer}: {review.verdict}."]
    if review.failure_mode:
        parts.append(f"Failure mode: {review.failure_mode}.")
    if review.note:
        parts.append(f"Note: {review.note}")
    return Annotation(
        trace_id=record.trace_id,
        annotator_kind="HUMAN",
        label=review.verdict,
        score=_REVIEW_SCORES.get(review.verdict),
        explanation=_cut(" ".join(parts)),
        identifier=f"review/{record.reviewer}",
        metadata={
            "source": "ragmon-review",
            "reviewer": record.reviewer,
            "queue": record.queue,
            "item_id": record.item_id,
            "failure_mode": review.failure_mode,
            "expected_behaviour": review.expected_behaviour,
            "category": review.category,
            "reviewed_at": record.created_at.isoformat(),
        },
    )


class PhoenixAnnotator:
    """Writes annotations to Phoenix in the background (module docstring); disabled without an endpoint."""

    def __init__(self, config: PhoenixConfig, metrics: Metrics, *, rng: random.Random | None = None) -> None:
        self.config = config
        self.metrics = metrics
        self.enabled = config.annotating
        self._rng = rng or random.Random()
        if self.enabled:
            try:
                import phoenix.client  # noqa: F401
            except ImportError as exc:
                raise ValueError(
                    "phoenix.annotate needs the arize-phoenix-client package: pip install 'ragmon[phoenix]'"
                ) from exc
        self._buffer: deque[Annotation] = deque()
        self._in_flight = 0
        self._ready = asyncio.Event()
        self._roots: OrderedDict[str, str] = OrderedDict()
        self._projects: tuple[float, list[str]] = (-_PROJECTS_TTL_S - 1, [])
        self._task: asyncio.Task[None] | None = None
        self._client: AsyncClient | None = None
        self._http: httpx.AsyncClient | None = None
        self._failures = 0
        metrics.state.add(
            "ragmon_phoenix_annotation_buffer",
            "annotations waiting for Phoenix or in flight",
            lambda: self.pending,
        )

    @property
    def pending(self) -> int:
        """Annotations buffered or being written."""
        return len(self._buffer) + self._in_flight

    def _offer(self, annotation: Annotation | None) -> bool:
        if not self.enabled or annotation is None:
            return False
        self._launch()
        if self.pending >= self.config.annotate_buffer:
            self.metrics.phoenix_annotations_dropped.labels(reason="buffer_full").inc()
            return False
        self._buffer.append(replace(annotation, not_before=time.monotonic() + self.config.annotate_delay_s))
        self._ready.set()
        return True

    def judged(self, judgment: Judgment) -> bool:
        """Queue the annotation of a stored judgment; False when disabled, failed, or dropped. Never waits."""
        return self._offer(judgment_annotation(judgment))

    async def after_judgment(self, judgment: Judgment) -> None:
        """The judge worker's hook: queue only, so the judge never waits for Phoenix."""
        self.judged(judgment)

    def reviewed(self, record: ReviewRecord) -> bool:
        """Queue the HUMAN annotation of a recorded review; False when disabled or dropped. Never waits."""
        return self._offer(review_annotation(record))

    def _take(self, now: float) -> tuple[list[Annotation], float | None]:
        """Up to a batch of annotations due now, and the earliest time one is due when none is."""
        batch: list[Annotation] = []
        later: deque[Annotation] = deque()
        earliest: float | None = None
        while self._buffer and len(batch) < self.config.annotate_batch:
            item = self._buffer.popleft()
            if item.not_before <= now:
                batch.append(item)
            else:
                later.append(item)
                earliest = item.not_before if earliest is None else min(earliest, item.not_before)
        self._buffer.extendleft(reversed(later))
        return batch, earliest

    async def _root_spans(self, trace_ids: Sequence[str]) -> dict[str, str]:
        """trace id → root span id for those Phoenix has, from the cache and spans queries.

        Phoenix files a trace under the project its spans name (`openinference.project.name`,
        else `default`), so `phoenix.project` is looked in first and the other projects after,
        for the traces still missing.
        """
        if self._client is None:
            raise RuntimeError("annotator not started")
        found = {t: self._roots[t] for t in trace_ids if t in self._roots}
        missing = sorted({t for t in trace_ids if t not in found})
        if missing:
            await self._roots_in(self.config.project, missing, found)
        missing = [t for t in missing if t not in found]
        if missing:
            for project in await self._other_projects():
                await self._roots_in(project, missing, found)
                missing = [t for t in missing if t not in found]
                if not missing:
                    break
        while len(self._roots) > _ROOT_CACHE:
            self._roots.popitem(last=False)
        return found

    async def _roots_in(self, project: str, trace_ids: Sequence[str], found: dict[str, str]) -> None:
        assert self._client is not None
        try:
            spans = await self._client.spans.get_spans(
                project_identifier=project,
                trace_ids=trace_ids,
                parent_id="null",
                limit=4 * len(trace_ids),
                timeout=int(self.config.timeout_s) or 1,
            )
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code == 404:
                return  # no such project (yet): Phoenix creates one with its first span
            raise
        # a trace with several parentless spans: its earliest is the root
        for span in sorted(spans, key=lambda s: s["start_time"]):
            trace_id = span["context"]["trace_id"]
            if trace_id not in found:
                found[trace_id] = span["context"]["span_id"]
                self._roots[trace_id] = found[trace_id]

    async def _other_projects(self) -> list[str]:
        """Names of Phoenix's projects but `phoenix.project`, listed at most once a minute."""
        assert self._client is not None
        at, names = self._projects
        if time.monotonic() - at > _PROJECTS_TTL_S:
            listed = await self._client.projects.list()
            names = [p["name"] for p in listed if p["name"] != self.config.project]
            self._projects = (time.monotonic(), names)
        return names

    def _again(self, items: Sequence[Annotation], drop_reason: str) -> None:
        """Put items back with backoff, or drop those out of attempts."""
        now = time.monotonic()
        for item in items:
            attempts = item.attempts + 1
            if attempts >= self.config.max_attempts:
                self.metrics.phoenix_annotations_dropped.labels(reason=drop_reason).inc()
                continue
            delay = backoff_s(self.config, attempts, None, self._rng)
            self._buffer.append(replace(item, attempts=attempts, not_before=now + delay))

    async def _write(self, batch: list[Annotation]) -> None:
        if self._client is None:
            raise RuntimeError("annotator not started")
        try:
            roots = await self._root_spans([a.trace_id for a in batch])
            ready = [a for a in batch if a.trace_id in roots]
            if ready:
                await self._client.spans.log_span_annotations(
                    span_annotations=[a.for_span(roots[a.trace_id]) for a in ready], sync=True
                )
        except httpx.HTTPError as exc:
            reason = reason_of_error(exc)
            self.metrics.phoenix_annotation_failures.labels(reason=reason).inc()
            if reason in RETRYABLE:
                self._failures += 1
                self._again(batch, "retries_exhausted")
            else:
                self.metrics.phoenix_annotations_dropped.labels(reason="rejected").inc(len(batch))
            return
        self._failures = 0
        for item in ready:
            self.metrics.phoenix_annotations.labels(kind=item.kind).inc()
        not_there = [a for a in batch if a.trace_id not in roots]
        if not_there:  # most often not inserted yet: no failure, only the final miss is counted (a drop)
            self._again(not_there, "root_span_missing")

    async def _run(self) -> None:
        while True:
            batch, earliest = self._take(time.monotonic())
            if not batch:
                self._ready.clear()
                wait = None if earliest is None else max(0.0, earliest - time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._ready.wait(), wait)
                continue
            self._in_flight = len(batch)
            try:
                await self._write(batch)
            except asyncio.CancelledError:
                self.metrics.phoenix_annotations_dropped.labels(reason="shutdown").inc(len(batch))
                raise
            except Exception:
                log.exception("phoenix annotations: unexpected error; batch dropped")
                self.metrics.phoenix_annotations_dropped.labels(reason="rejected").inc(len(batch))
            finally:
                self._in_flight = 0
            if self._failures:
                # Phoenix is down or overloaded: pause everyone, not only the failed batch
                await asyncio.sleep(backoff_s(self.config, self._failures, None, self._rng))

    def _launch(self) -> None:
        # Processes that never call start() (a Kafka judge worker) start writing on first use.
        if self._task is None:
            from phoenix.client import AsyncClient

            self._http = http_client(self.config, 4)
            self._client = AsyncClient(http_client=self._http)
            self._task = asyncio.get_running_loop().create_task(self._run(), name="phoenix-annotations")

    async def start(self) -> None:
        """Start the writer (a no-op when disabled or started)."""
        if self.enabled:
            self._launch()

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every queued annotation was written or dropped; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.pending:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    async def stop(self) -> None:
        """Drain for up to `phoenix.drain_s`, then count what is left as dropped (`shutdown`). Safe twice."""
        if self._task is not None:
            await self.drain(self.config.drain_s)
            await cancel_task(self._task)
            self._task = None
        if self._buffer:
            self.metrics.phoenix_annotations_dropped.labels(reason="shutdown").inc(len(self._buffer))
            self._buffer.clear()
        if self._http is not None:
            with contextlib.suppress(httpx.HTTPError):
                await self._http.aclose()
            self._http = None
            self._client = None
