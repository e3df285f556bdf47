"""The embedded demo's steps against a running ragmon, over its HTTP API like any client, and the
"what to look at" list read back from it.

Every number `look_lines` prints comes from ragmon's own API or metrics, never from what the demo
believes it sent (that is `run.sent_lines`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Findings", "Ragmon", "look_lines", "url_lines"]

REGENERATION = "regeneration_band"


@dataclass(frozen=True, slots=True)
class Findings:
    """What ragmon shows after the demo, read from its API and metrics (see `Ragmon.findings`)."""

    review_open: int
    drift_alarm: Mapping[str, Any] | None
    band: Mapping[str, Any] | None
    judged: int
    faithful_share: float | None
    faithful_interval: tuple[float, float] | None
    regenerations_by_source: Mapping[str, int]
    traces: int
    faithful_estimate: str = "judge-only"
    """Which estimate `faithful_share` is: `human-corrected` (by the blind review labels) or `judge-only`."""


class Ragmon:
    """A thin client of the demo's ragmon at `url` (loopback, so no API key)."""

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=timeout_s)

    def close(self) -> None:
        self.client.close()

    def metric_totals(self, name: str, by: str | None = None, **match: str) -> dict[str, float]:
        """Sum of a family's samples (counters: their `_total`), by the value of label `by`."""
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(self.client.get("/metrics").text):
            if family.name != name:
                continue
            for s in family.samples:
                if s.name.endswith(("_created", "_bucket", "_count", "_sum")):
                    continue
                if all(s.labels.get(k) == v for k, v in match.items()):
                    key = s.labels.get(by, "") if by else ""
                    out[key] = out.get(key, 0.0) + s.value
        return out

    def metric_total(self, name: str, **match: str) -> float:
        return sum(self.metric_totals(name, **match).values())

    def pin(self, since: datetime, until: datetime) -> dict[str, Any]:
        """Pin a drift reference from the traces started in [since, until) (the API flushes first)."""
        response = self.client.post(
            "/api/v1/drift/references", json={"from": since.isoformat(), "to": until.isoformat()}
        )
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def last_scheduled_run(self) -> datetime | None:
        """When the drift scheduler last closed the regeneration-band windows, if ever."""
        items = self.client.get("/api/v1/drift/runs", params={"detector": REGENERATION, "limit": 50}).json()[
            "items"
        ]
        times = [datetime.fromisoformat(r["ran_at"]) for r in items if r["trigger"] == "schedule"]
        return max(times, default=None)

    def wait_for_scheduled_run(self, after: datetime, timeout_s: float) -> bool:
        """Wait until a scheduled drift run after `after` closed the band windows."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            last = self.last_scheduled_run()
            if last is not None and last > after:
                return True
            time.sleep(0.25)
        return False

    def run_drift(self) -> list[dict[str, Any]]:
        """Run every drift detector now (on the whole current window) and return the results."""
        response = self.client.post("/api/v1/drift/runs", json={})
        response.raise_for_status()
        items: list[dict[str, Any]] = response.json()["items"]
        return items

    def wait_judged(self, timeout_s: float) -> bool:
        """Wait until every trace the sampler queued for judging is judged (or skipped: deferred by the
        budget past budget.max_deferral_s)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sampled = self.metric_total("ragmon_judge_sampled")
            done = self.metric_total("ragmon_judge_completed") + self.metric_total("ragmon_judge_skipped")
            if done >= sampled:
                return True
            time.sleep(0.25)
        return False

    def findings(self, drift_runs: Sequence[Mapping[str, Any]]) -> Findings:
        """The "what to look at" numbers: review queue, the drift alarm of `drift_runs` (a run's
        results), the most telling regeneration band, judged traces and their faithful share."""
        alarms = [r for r in drift_runs if r["alarm"] and r["detector"] != REGENERATION]
        # the alarm with an explanation first (a query-embedding test), then the most significant
        alarms.sort(key=lambda r: (not r.get("explanation"), r.get("p_value") or 0.0))
        bands = self.client.get(
            "/api/v1/drift/runs", params={"detector": REGENERATION, "limit": 1000}
        ).json()["items"]
        judged_bands = [b for b in bands if b["outcome"] in ("ok", "drift") and b["trigger"] == "schedule"]
        # an out-of-band window first, else the judged window with the most traces
        judged_bands.sort(key=lambda b: (not b["alarm"], -b["n_window"]))
        faithfulness = self.client.get("/api/v1/faithfulness").json()["items"]
        judged = sum(int(item["answers"]["n_judged"]) for item in faithfulness)
        share, interval, which = _pooled_share(faithfulness)
        return Findings(
            review_open=int(self.metric_total("ragmon_review_items", state="open")),
            drift_alarm=alarms[0] if alarms else None,
            band=judged_bands[0] if judged_bands else None,
            judged=judged,
            faithful_share=share,
            faithful_interval=interval,
            regenerations_by_source={
                k: int(v) for k, v in sorted(self.metric_totals("ragmon_regenerations", by="source").items())
            },
            traces=int(self.metric_total("ragmon_traces")),
            faithful_estimate=which,
        )


def _pooled_share(
    items: Sequence[Mapping[str, Any]],
) -> tuple[float | None, tuple[float, float] | None, str]:
    """The answer-level faithful share of the app with the most judged answers, with its interval and
    which estimate it is: the human-corrected one where the blind labels allow it, else the judge's.

    Per app, as ragmon reports it: pooling apps' estimates would need their weights, which the API
    does not return."""
    if not items:
        return None, None, "judge-only"
    top = max(items, key=lambda item: item["answers"]["n_judged"])
    answers = top["answers"]
    fixed = answers.get("human_corrected")
    if fixed is not None:
        return float(fixed["estimate"]), (float(fixed["low"]), float(fixed["high"])), "human-corrected"
    estimate = answers.get("estimate")
    lower, upper = answers.get("lower"), answers.get("upper")
    if estimate is None:
        return None, None, "judge-only"
    bounds = (float(lower), float(upper)) if lower is not None and upper is not None else None
    return float(estimate), bounds, "judge-only"


def _group_text(group: Mapping[str, Any]) -> str:
    """One explanation group: its share of current vs reference queries, its terms, one example."""
    examples = group.get("examples") or []
    terms = ", ".join(group.get("terms") or [])
    text = (
        f"{group.get('share_window', 0.0):.0%} of current queries vs "
        f"{group.get('share_reference', 0.0):.0%} of the reference ({terms})"
    )
    return text + (f", e.g. \u201c{examples[0]}\u201d" if examples else "")


def url_lines(url: str, token: str) -> list[str]:
    """Where everything is, and the demo reviewer's sign-in token (printed once, here)."""
    return [
        f"ragmon is running at {url}",
        f"  metrics                  {url}/metrics",
        f"  traces API               {url}/api/v1/traces",
        f"  review page              {url}/review (sign in at {url}/review/login)",
        f"  demo reviewer token      {token}",
        f"  latest report            {url}/reports/latest",
        f"  API docs                 {url}/docs",
    ]


def look_lines(url: str, found: Findings, report: str | None) -> list[str]:
    """The "what to look at" list: each line a number from ragmon and where to see it."""
    lines = ["", "what to look at (numbers from ragmon):"]
    lines.append(f"  review items open        {found.review_open}    {url}/review")
    alarm = found.drift_alarm
    if alarm is None:
        lines.append("  drift alarm              none (not enough traffic for a test?)")
    else:
        p = alarm.get("p_value")
        lines.append(
            f"  drift alarm              {alarm['app']}: {alarm['detector']}"
            + (f", p = {p:.2g}" if p is not None else "")
            + f" (alpha {alarm.get('alpha')}), "
            + f"{alarm['n_reference']} reference vs {alarm['n_window']} current queries"
            + f"    {url}/api/v1/drift/runs?alarm=true"
        )
        groups = alarm.get("explanation") or []
        if groups:
            lines.append(f"    top group of {len(groups)}: {_group_text(groups[0])}")
    band = found.band
    if band is None:
        lines.append("  regeneration band        none yet (still warming up)")
    else:
        d = band["details"]
        state = "OUT OF BAND" if band["alarm"] else "in band"
        lines.append(
            f"  regeneration band        {band['app']}/{band['intent']}: "
            f"rate {band['statistic']:.2f} {state} "
            f"[{d['lower']:.2f}, {d['upper']:.2f}] over {band['n_window']} traces, "
            f"baseline {d['baseline_rate']:.3f} from {band['n_reference']}    "
            f"ragmon_regeneration_rate_ratio on {url}/metrics"
        )
    if found.faithful_share is None:
        lines.append(f"  judged traces            {found.judged}")
    else:
        interval = found.faithful_interval
        ci = f" (95 % CI {interval[0]:.2f}-{interval[1]:.2f})" if interval else ""
        lines.append(
            f"  judged traces            {found.judged}, faithful share {found.faithful_share:.2f}{ci} "
            f"in the busiest app ({found.faithful_estimate})    {url}/api/v1/faithfulness"
        )
    sources = ", ".join(f"{k} {v}" for k, v in found.regenerations_by_source.items()) or "none"
    lines.append(f"  regenerations by source  {sources} (a regenerate feedback is also a re-ask)")
    lines.append(f"  weekly report            {report or 'not written'}    {url}/reports/latest")
    lines.append(f"  traces stored            {found.traces}    {url}/api/v1/traces")
    lines.append(f"  sign in to review        {url}/review/login with the token printed above")
    return lines
