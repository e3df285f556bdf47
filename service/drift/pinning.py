"""Pinning drift references: a new reference version per (app, model), from a time range or a release.

An alarming window never feeds a reference: buckets inside the window of a
run that alarmed on that (app, model) are left out. Where the sample has
query texts, the query-text test's embedder is fitted on it and stored with
it (`embedders.py`). `ragmon drift pin` and `POST /api/v1/drift/references`
call it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from service.drift.embedders import fit_reference_embedder
from service.drift.store import DriftStore, ReferenceInfo

__all__ = ["PinOutcome", "pin_references"]


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
