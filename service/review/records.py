"""The review queue's records: queues, reasons and their severity, items, reviews, progress.

Plain frozen values shared by the store, the intake, calibration and the
page; none of them touches the database.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, get_args

from service.judge.judgment import FailureMode
from service.probes.golden import ExpectedBehaviour

__all__ = [
    "ITEM_STATES",
    "QUEUES",
    "REASONS",
    "REVIEW_VERDICTS",
    "SEVERITY",
    "CalibrationRow",
    "ClaimRefused",
    "Intake",
    "ItemFilters",
    "ItemState",
    "Progress",
    "Queue",
    "Reason",
    "ReviewIn",
    "ReviewItem",
    "ReviewRecord",
    "ReviewVerdict",
    "severity_of",
]

Queue = Literal["flagged", "blind"]
QUEUES: tuple[Queue, ...] = get_args(Queue)
Reason = Literal[
    "unfaithful",
    "low_faithfulness",
    "judge_failure",
    "retrieval_failure",
    "thumbs_down",
    "regeneration",
    "api",
    "blind_sample",
]
REASONS: tuple[Reason, ...] = get_args(Reason)
# Higher first: what a user saw go wrong outranks what only the judge suspects,
# and a broken judge call is the least urgent (nothing says the answer is bad).
SEVERITY: dict[Reason, int] = {
    "unfaithful": 50,
    "retrieval_failure": 45,
    "thumbs_down": 40,
    "low_faithfulness": 30,
    "api": 25,
    "regeneration": 20,
    "judge_failure": 10,
    "blind_sample": 0,
}
_SEVERITY_BY_NAME: dict[str, int] = {name: value for name, value in SEVERITY.items()}
ItemState = Literal["open", "claimed", "done"]
ITEM_STATES: tuple[ItemState, ...] = get_args(ItemState)
ReviewVerdict = Literal["faithful", "unfaithful", "unsure"]
REVIEW_VERDICTS: tuple[ReviewVerdict, ...] = get_args(ReviewVerdict)


def severity_of(reason: str) -> int:
    """The severity of a reason; 0 for a name that is not a reason."""
    return _SEVERITY_BY_NAME.get(reason, 0)


@dataclass(frozen=True, slots=True)
class Intake:
    """One reason for one trace to be reviewed in one queue."""

    tenant: str
    queue: Queue
    trace_id: str
    app: str
    reason: Reason
    detail: str | None = None
    diagnosis: str | None = None
    judge_version: str | None = None

    def __post_init__(self) -> None:
        if self.queue not in QUEUES:
            raise ValueError(f"unknown queue {self.queue!r}")
        if self.reason not in REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")


@dataclass(frozen=True, slots=True)
class ReviewIn:
    """What a reviewer records about one item."""

    verdict: ReviewVerdict
    failure_mode: FailureMode | None = None
    expected_chunk_ids: tuple[str, ...] = ()
    reference_answer: str | None = None
    category: str | None = None
    expected_behaviour: ExpectedBehaviour = "answer"
    note: str | None = None
    claims_supported: tuple[bool, ...] | None = None
    """The reviewer's mark on each of the judge's claims (in the judge's order): supported or not;
    None when the reviewer marked none. The claim-level human label is the share marked supported."""

    def __post_init__(self) -> None:
        if self.verdict not in REVIEW_VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")
        if self.claims_supported is not None:
            if not all(isinstance(mark, bool) for mark in self.claims_supported):
                raise ValueError("claims_supported holds true or false for each claim")
            if self.verdict == "faithful" and not all(self.claims_supported):
                raise ValueError(
                    "a faithful verdict means every claim is supported; mark them so or say unfaithful"
                )

    def claim_share(self) -> float | None:
        """The claim-level label: the share of claims marked supported; 1.0 for a `faithful` verdict
        with no marks (faithful means no unsupported claim); None when there is nothing to read it from
        (no marks on an unfaithful or unsure verdict, or marks on an answer without claims)."""
        if self.claims_supported:
            return sum(self.claims_supported) / len(self.claims_supported)
        if self.claims_supported is None and self.verdict == "faithful":
            return 1.0
        return None


@dataclass(frozen=True, slots=True)
class ReviewRecord:
    """A stored review with the item it closed."""

    item_id: int
    tenant: str
    queue: Queue
    trace_id: str
    reviewer: str
    review: ReviewIn
    created_at: datetime
    replaced: bool = False
    """True when this label replaced the same reviewer's earlier one of the item (the later one wins)."""


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """An item as read, with its state as of `now` (an expired lease reads as open)."""

    id: int
    tenant: str
    queue: Queue
    trace_id: str
    app: str
    severity: int
    diagnosis: str | None
    judge_version: str | None
    state: ItemState
    reviewer: str | None
    lease_until: datetime | None
    created_at: datetime
    done_at: datetime | None
    reasons: tuple[tuple[str, str | None], ...] = ()  # (reason, detail), most severe first

    @property
    def judge_hidden(self) -> bool:
        """A blind item not labelled yet: every API a reviewer reaches hides the judge's verdict on it."""
        return self.queue == "blind" and self.state != "done"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "queue": self.queue,
            "trace_id": self.trace_id,
            "app": self.app,
            "severity": self.severity,
            "diagnosis": self.diagnosis,
            "judge_version": self.judge_version,
            "state": self.state,
            "reviewer": self.reviewer,
            "lease_until": None if self.lease_until is None else self.lease_until.isoformat(),
            "created_at": self.created_at.isoformat(),
            "done_at": None if self.done_at is None else self.done_at.isoformat(),
            "reasons": [{"reason": r, "detail": d} for r, d in self.reasons],
        }


class ClaimRefused(Exception):
    """The item exists but cannot be claimed now: done, or leased to someone else until `lease_until`."""

    def __init__(self, state: ItemState, reviewer: str | None, lease_until: datetime | None) -> None:
        who = f" by {reviewer} until {lease_until.isoformat()}" if reviewer and lease_until else ""
        super().__init__(f"item is {state}{who}")
        self.state = state
        self.reviewer = reviewer
        self.lease_until = lease_until


@dataclass(frozen=True)
class ItemFilters:
    """List filters; None means any. `state` is the effective state (expired leases are open)."""

    queue: Queue | None = None
    app: str | None = None
    reason: Reason | None = None
    diagnosis: str | None = None
    state: ItemState | None = None


@dataclass
class Progress:
    """Counts per queue and state, per reviewer and state, and the oldest open item per queue."""

    items: dict[tuple[str, str], int] = field(default_factory=dict)  # (queue, state) -> count
    reviewers: dict[tuple[str, str], int] = field(default_factory=dict)  # (reviewer, state) -> count
    oldest_open: dict[str, datetime] = field(default_factory=dict)  # queue -> created_at

    def to_json(self, now: datetime) -> dict[str, Any]:
        return {
            "queues": {
                q: {s: self.items.get((q, s), 0) for s in ITEM_STATES}
                | {
                    "oldest_open_age_s": None
                    if q not in self.oldest_open
                    else max(0.0, (now - self.oldest_open[q]).total_seconds())
                }
                for q in QUEUES
            },
            "reviewers": {
                name: {s: self.reviewers.get((name, s), 0) for s in ("claimed", "done")}
                for name in sorted({name for name, _ in self.reviewers})
            },
        }


@dataclass(frozen=True, slots=True)
class CalibrationRow:
    """One (review, judgment) pair: what the judge said and what the reviewer said of one trace."""

    queue: Queue
    judge_version: str
    judge_outcome: str
    judge_faithfulness: float | None
    verdict: ReviewVerdict
    reviewed_at: datetime
