"""The settings the embedded `ragmon demo` runs ragmon with, on top of the user's configuration.

A real deployment judges a sample, runs drift hourly and needs 200 traces per app and intent
before a regeneration band can alarm; a demo of a few minutes would then show none of it. So the
embedded demo changes only how often and how much, never how anything is decided:

* every trace is judged (`sampler.rates.base` 1.0; estimates are weighted by inclusion
  probability either way, so the faithfulness figures stay unbiased), and the offline judge's
  calls are not rate-limited (a configured LLM endpoint keeps the configured budget);
* the drift scheduler runs every `WINDOW_S` seconds, and each run closes the regeneration
  bands' windows (the demo sends one batch of traffic per window, `DemoPlan`);
* a band leaves warm-up after `REGENERATION_MIN_BASELINE` traces of its app and intent, and a
  drift test needs `MIN_WINDOW` observations per side: smaller than the defaults (200, 50) to
  fit a few hundred requests, with the same alphas, so the false-alarm rates are unchanged and
  only the power is lower;
* one reviewer, `DEMO_REVIEWER`, signs in with a token generated per run (`new_token`); it is
  configured here, in the config the server is built from, and printed once by the demo.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from pydantic import SecretStr

from service.config import RagmonConfig, ReviewerConfig

__all__ = [
    "DEMO_REVIEWER",
    "MIN_WINDOW",
    "REGENERATION_MIN_BASELINE",
    "WINDOW_REQUESTS",
    "WINDOW_S",
    "DemoPlan",
    "demo_config",
    "new_token",
]

DEMO_REVIEWER = "demo"
WINDOW_S = 4.0
"""Seconds between two scheduled drift runs: each closes a regeneration-band window."""
WINDOW_REQUESTS = 50
"""Requests the demo sends per band window."""
REGENERATION_MIN_BASELINE = 12
MIN_WINDOW = 30


def new_token() -> str:
    """A fresh sign-in token for the demo reviewer (32 URL-safe characters)."""
    return secrets.token_urlsafe(24)


def demo_config(config: RagmonConfig, token: str) -> RagmonConfig:
    """`config` with the demo's schedule and sample sizes, every trace judged, and the demo reviewer
    added to the configured reviewers (see the module docstring)."""
    reviewers = {
        **config.review.reviewers,
        DEMO_REVIEWER: ReviewerConfig(token=SecretStr(token), tenants=["default"]),
    }
    rates = config.sampler.rates.model_copy(update={"base": 1.0})
    update: dict[str, object] = {}
    if not config.judge.endpoint_configured():
        # the offline judge costs nothing: its calls need no rate limit (a paid endpoint keeps its budget)
        update["budget"] = config.budget.model_copy(update={"calls_per_minute": 1e6, "burst_calls": 1e6})
    return config.model_copy(
        update={
            **update,
            "review": config.review.model_copy(update={"reviewers": reviewers}),
            "sampler": config.sampler.model_copy(update={"rates": rates}),
            "judging": config.judging.model_copy(update={"poll_s": 0.1, "estimate_every_s": 2.0}),
            "drift": config.drift.model_copy(
                update={
                    "interval_s": WINDOW_S,
                    "flush_s": 1.0,
                    "min_window": MIN_WINDOW,
                    "regeneration_min_baseline": REGENERATION_MIN_BASELINE,
                }
            ),
        }
    )


@dataclass(frozen=True, slots=True)
class DemoPlan:
    """Where the embedded demo pauses its traffic: at every window boundary, and at the topic shift
    (where it pins the drift reference from what it sent before)."""

    requests: int
    shift_after: int | None

    @classmethod
    def of(cls, requests: int, shift_after: int | None) -> DemoPlan:
        """The plan for `requests`; the shift defaults to the middle (none for a single request).

        Raises ValueError for fewer than 1 request or a shift outside 1..requests-1."""
        if requests < 1:
            raise ValueError(f"requests must be at least 1, got {requests}")
        if shift_after is None:
            return cls(requests, requests // 2 or None)
        if not 0 < shift_after < requests:
            raise ValueError(f"shift_after must be between 1 and {requests - 1}, got {shift_after}")
        return cls(requests, shift_after)

    @property
    def pauses(self) -> frozenset[int]:
        """Request indexes before which the demo stops to let a window close (and to pin, at the shift)."""
        boundaries = set(range(WINDOW_REQUESTS, self.requests, WINDOW_REQUESTS))
        if self.shift_after is not None:
            boundaries.add(self.shift_after)
        return frozenset(boundaries)
