"""`ReviewIntake`: what enters the human review queue, as a pipeline sink and an after-judgment hook.

    judgment stored ──after_judgment──▶ flags ─────────▶ queue `flagged` (unfaithful, low_faithfulness,
                                     └─ blind sample ─▶ queue `blind`     judge_failure, retrieval_failure)
    new feedback ──consume_feedback──▶ thumbs-down, a share of regenerate ─▶ queue `flagged`
    new traces ──consume_traces──────▶ a share of regenerations ──────────▶ queue `flagged`
    API ───────────────────────────────────────────────────────────────────▶ queue `flagged` (reason `api`)

Choices by chance are made by trace id (a salted sha256 mapped to [0, 1)),
so every replica, every redelivery and every rerun picks the same traces: a
trace is in the blind sample when its draw is under its app's blind rate
(`blind_rates`, else `blind_rate`), whatever the judge said, which keeps the
calibration sample independent of the verdict: a random subsample of the
judged one, which is what lets its labels correct the judge's estimate
(`service/review/correction.py`). Every path is idempotent (the store keeps one item per tenant,
queue and trace), so redelivered traces, feedback and judgments are harmless.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence

from service.config import ReviewConfig
from service.corrections import TraceUpdate
from service.judge.judgment import Judgment
from service.judge.store import flags_for
from service.model import Feedback, RagTrace
from service.review.records import Intake, Queue, Reason
from service.review.store import ReviewStore

__all__ = ["ReviewIntake", "draw"]


def draw(salt: str, tenant: str, trace_id: str) -> float:
    """A uniform number in [0, 1) fixed by (salt, tenant, trace id)."""
    digest = hashlib.sha256(f"{salt}\x00{tenant}\x00{trace_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


class ReviewIntake:
    """Sink (`TraceConsumer`, `FeedbackConsumer`) and judgment hook that fill the review queues."""

    def __init__(
        self,
        config: ReviewConfig,
        flag_threshold: float,
        store: ReviewStore,
        redact: Callable[[Intake], Intake] | None = None,
    ) -> None:
        self.config = config
        self.flag_threshold = flag_threshold
        self.store = store
        # what a caller sends (the API's note) is redacted on the way in; the rest comes from
        # records redacted before they were stored
        self.redact = redact or (lambda entry: entry)

    def blind_rate(self, app: str) -> float:
        """The share of an app's judged traces drawn into the blind queue (`blind_rates`, else
        `blind_rate`)."""
        return self.config.blind_rates.get(app, self.config.blind_rate)

    def in_blind_sample(self, tenant: str, trace_id: str, app: str) -> bool:
        return draw("review-blind", tenant, trace_id) < self.blind_rate(app)

    def regeneration_chosen(self, tenant: str, trace_id: str) -> bool:
        return draw("review-regeneration", tenant, trace_id) < self.config.regeneration_share

    def for_judgment(self, judgment: Judgment) -> list[Intake]:
        """The queue entries one stored judgment makes: its flags, and the blind sample."""

        def entry(queue: Queue, reason: Reason, detail: str | None) -> Intake:
            return Intake(
                tenant=judgment.tenant,
                queue=queue,
                trace_id=judgment.trace_id,
                app=judgment.app,
                reason=reason,
                detail=detail,
                diagnosis=judgment.diagnosis,
                judge_version=judgment.judge_version,
            )

        entries = [entry("flagged", f.reason, f.detail) for f in flags_for(judgment, self.flag_threshold)]
        # A failed judgment has no verdict to calibrate against.
        blind = self.in_blind_sample(judgment.tenant, judgment.trace_id, judgment.app)
        if judgment.outcome != "failed" and blind:
            entries.append(entry("blind", "blind_sample", None))
        return entries

    async def after_judgment(self, judgment: Judgment) -> None:
        """Hook the judge worker calls after storing a judgment (and before completing its queue item)."""
        entries = self.for_judgment(judgment)
        if entries:
            await asyncio.to_thread(self.store.add, entries)

    async def consume_traces(self, batch: Sequence[RagTrace]) -> None:
        entries = [
            Intake(
                tenant=t.tenant,
                queue="flagged",
                trace_id=t.trace_id,
                app=t.app,
                reason="regeneration",
                detail=f"regeneration ({t.regeneration_source or 'attribute'})",
            )
            for t in batch
            if t.is_regeneration and self.regeneration_chosen(t.tenant, t.trace_id)
        ]
        if entries:
            await asyncio.to_thread(self.store.add, entries)

    async def consume_updates(self, batch: Sequence[TraceUpdate]) -> None:
        """A later version may bring a regeneration flag (its root span carried it): intake is by key."""
        await self.consume_traces([u.trace for u in batch])

    async def consume_feedback(self, batch: Sequence[Feedback]) -> None:
        entries = []
        for event in batch:
            app = event.app or "unknown"
            if event.kind == "down":
                detail = "thumbs-down" + (f": {event.reason}" if event.reason else "")
                entries.append(Intake(event.tenant, "flagged", event.trace_id, app, "thumbs_down", detail))
            elif event.kind == "regenerate" and self.regeneration_chosen(event.tenant, event.trace_id):
                entries.append(
                    Intake(event.tenant, "flagged", event.trace_id, app, "regeneration", "user asked again")
                )
        if entries:
            await asyncio.to_thread(self.store.add, entries)

    async def send(self, tenant: str, trace_id: str, app: str, note: str | None) -> bool:
        """Put a trace in the `flagged` queue on request (the API); True when the item is new."""
        entry = self.redact(Intake(tenant, "flagged", trace_id, app, "api", note))
        return bool(await asyncio.to_thread(self.store.add, [entry]))
