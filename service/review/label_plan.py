"""`ragmon review labels`: how many blind labels a week each app needs for a chosen interval width.

For each app of the tenant and each reading, over the estimate window
(`judging.estimate_window_s`, or `--window`): the judged answers, the blind
labels so far, the human-corrected estimate and its half-width now, and the
plan of `sampler.corrected.plan_labels`, from the judge-human disagreement
the labels show (or an assumed one below 10 labels): the labels a window and
a week for ± `--width`, and the blind rate that asks for them. The last line
says how to set it (`review.blind_rates`, per app). The module imports
nothing heavy at load: `ragmon --help` builds every command's flags.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sampler import LabelPlan
    from service.config import RagmonConfig

__all__ = ["add_arguments", "main", "parse_duration", "plan_text"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds of `30d`, `12h`, `90m`, `600s` or `600`; raises ValueError otherwise."""
    match = _DURATION.match(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a positive duration like 7d, 12h or 3600")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def plan_text(plan: LabelPlan) -> str:
    """One plan in words: labels a week and the blind rate, or why labels alone cannot get there."""
    basis = (
        f"assuming a residual variance of {plan.residual_variance:g} (fewer than 10 labels)"
        if plan.assumed
        else f"from the disagreement on {plan.from_labels} labels"
    )
    if plan.labels_per_week is None or plan.blind_rate is None:
        return f"± {plan.half_width:g} not reachable with labels: {plan.reason} ({basis})"
    return (
        f"± {plan.half_width:g} takes {plan.labels_per_week:.0f} blind labels a week "
        f"(blind rate {plan.blind_rate:.3g} of the window's {plan.n_judged} judged answers; {basis})"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `ragmon review labels` options to `parser`."""
    parser.add_argument(
        "--width", type=float, default=0.05, help="the half-width wanted, e.g. 0.05 for ± 0.05 (default)"
    )
    parser.add_argument("--tenant", default="default", help="tenant to plan for (default: default)")
    parser.add_argument("--app", help="only this app")
    parser.add_argument(
        "--window", help="the window to read, e.g. 7d (default: judging.estimate_window_s, the estimate's)"
    )


def main(args: argparse.Namespace, config: RagmonConfig) -> int:
    """Print the plan per app and reading; returns the exit status (2 on bad arguments)."""
    from service.judge.store import JudgmentStore
    from service.metrics import Metrics
    from service.review.correction import READINGS, HumanCorrection
    from service.review.store import ReviewStore
    from service.store.trace_store import Store

    try:
        window_s = parse_duration(args.window) if args.window else config.judging.estimate_window_s
        if not 0.0 < args.width < 0.5:
            raise ValueError(f"--width must be in (0, 0.5), got {args.width}")
    except ValueError as exc:
        print(f"ragmon review labels: {exc}", file=sys.stderr)
        return 2
    store = Store(config.store_url, connect_timeout_s=config.store.timeout_s)
    try:
        judgments = JudgmentStore(store.engine)
        judgments.create_schema()
        ReviewStore(store.engine).create_schema()
        from sampler import create_tables

        create_tables(store.engine)
        correction = HumanCorrection(
            config.judging,
            config.review,
            judgments,
            Metrics(config.metrics),
            tenant=args.tenant,
            window_s=window_s,
        )
        now = datetime.now(UTC)
        found = {reading: correction.compute(now, reading) for reading in READINGS}
    finally:
        store.close()
    print(
        f"tenant {args.tenant}, window {window_s / 86400:g} days to {now:%Y-%m-%d %H:%M} UTC, "
        f"human-corrected interval ± {args.width:g} at 95 %"
    )
    rates: dict[str, float] = {}
    apps = sorted({key[0] for estimates in found.values() for key in estimates.judge["app"]})
    for app in apps:
        if args.app is not None and app != args.app:
            continue
        print(f"{app} (blind rate now {config.review.blind_rates.get(app, config.review.blind_rate):g}):")
        for reading in READINGS:
            estimates = found[reading]
            plan = correction.plans(estimates, args.width).get((app,))
            fixed = estimates.corrected["app"].get((app,))
            if plan is None or fixed is None:
                continue
            now_text = (
                f"{fixed.estimate:.3g} [{fixed.lower:.3g}, {fixed.upper:.3g}]"
                if fixed.estimate is not None and fixed.lower is not None and fixed.upper is not None
                else f"none ({fixed.reason})"
            )
            print(
                f"  {reading:8} {fixed.n_judged} judged, {fixed.n_human} blind labels; "
                f"corrected now {now_text}; {plan_text(plan)}"
            )
            if plan.blind_rate is not None:
                rates[app] = max(rates.get(app, 0.0), plan.blind_rate)
    if not apps:
        print("no judged answers in the window: nothing to plan from")
    elif rates:
        setting = json.dumps({app: round(rate, 4) for app, rate in sorted(rates.items())})
        print(f"set the rates: RAGMON_REVIEW__BLIND_RATES='{setting}' (every blind item labelled)")
    return 0
