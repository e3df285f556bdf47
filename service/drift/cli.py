"""`ragmon drift pin|list|run`: references and drift runs against the configured store, no server needed.

Embedded mode keeps everything in the SQLite file under `--data-dir`; with
`RAGMON_STORE__URL` set it works on PostgreSQL the same way. The commands see
what the running service has flushed to the observation sample (every
`drift.flush_s` seconds), not what it still holds in memory.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # the store, the detectors and their NumPy/SciPy load only when a subcommand runs, not for --help
    from service.config import RagmonConfig
    from service.drift.store import DriftStore, RunRecord
    from service.store.trace_store import Store

__all__ = ["add_arguments", "main", "parse_time"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 date or time (UTC when no zone is given), `now`, or an age such as `7d`, `12h`, `30m`.

    Raises ValueError with the accepted forms for anything else, and for a time outside the range
    ragmon keeps (1970 to 2262, `service.ingest.wire.TimeInRange`): year 1 or an age of 10**6 days
    once ended in an OverflowError traceback.
    """
    from service.ingest.wire import EARLIEST_TIME, LATEST_TIME  # here: `ragmon --help` stays light

    now = now or datetime.now(UTC)
    value = text.strip()
    if value == "now":
        return now
    relative = _RELATIVE.match(value)
    try:
        if relative:
            parsed = now - timedelta(seconds=float(relative.group(1)) * _UNITS[relative.group(2)])
        else:
            parsed = datetime.fromisoformat(value)
            parsed = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
        in_range = EARLIEST_TIME <= parsed.astimezone(UTC) <= LATEST_TIME
    except OverflowError:
        in_range = False
    except ValueError:
        raise ValueError(
            f"not a time: {text!r}; use ISO 8601 (2024-06-01, 2024-06-01T12:00:00Z), 'now' or an age (7d)"
        ) from None
    if not in_range:
        raise ValueError(
            f"time {text!r} is outside the range ragmon keeps, "
            f"{EARLIEST_TIME:%Y-%m-%d} to {LATEST_TIME:%Y-%m-%d}"
        )
    return parsed


def add_arguments(parser: argparse.ArgumentParser, parents: Sequence[argparse.ArgumentParser]) -> None:
    """The `drift` subcommands; each also takes the flags of `parents` (--config, --data-dir)."""
    commands = parser.add_subparsers(dest="drift_command", required=True)

    pin = commands.add_parser(
        "pin", parents=parents, help="pin a new reference version from a time range or a release"
    )
    pin.add_argument("--from", dest="since", help="range start (ISO 8601, or an age like 14d)")
    pin.add_argument("--to", dest="until", help="range end, exclusive (ISO 8601, 'now', or an age)")
    pin.add_argument("--release", help="pin the traffic of this release instead of a time range")
    pin.add_argument("--app", help="only this app (default: every app with traffic in the range)")

    listing = commands.add_parser(
        "list", parents=parents, help="list references (or, with --runs, stored drift runs)"
    )
    listing.add_argument("--app", help="only this app")
    listing.add_argument("--runs", action="store_true", help="list drift runs instead of references")
    listing.add_argument("--limit", type=int, default=50, help="most runs to list (with --runs)")

    run = commands.add_parser(
        "run", parents=parents, help="run every drift detector now and print the results"
    )
    run.add_argument("--app", help="only this app")
    run.add_argument("--json", action="store_true", help="print every detector's result as JSON")

    for sub in (pin, listing, run):
        sub.add_argument("--tenant", default="default", help="tenant whose data to use (default: default)")


def _open(config: RagmonConfig) -> tuple[Store, DriftStore]:
    from service.drift.store import DriftStore
    from service.store.trace_store import Store

    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(
        config.store_url, connect_timeout_s=config.store.timeout_s, statement_timeout_s=config.store.timeout_s
    )
    store.create_schema()
    drift = DriftStore(
        store.engine, bucket_s=config.drift.bucket_s, bucket_capacity=config.drift.bucket_capacity
    )
    drift.create_schema()
    return store, drift


def _pin(args: argparse.Namespace, config: RagmonConfig, drift: DriftStore) -> int:
    from service.drift.pinning import pin_references

    if args.release is None and (args.since is None or args.until is None):
        print("ragmon drift pin: give --from and --to, or --release", file=sys.stderr)
        return 2
    outcome = pin_references(
        drift,
        args.tenant,
        since=None if args.since is None else parse_time(args.since),
        until=None if args.until is None else parse_time(args.until),
        release=args.release,
        app=args.app,
        capacity=config.drift.reference_capacity,
        min_size=config.drift.min_window,
        seed=config.drift.seed,
    )
    print(json.dumps(outcome.to_json(), indent=2))
    if not outcome.pinned:
        print(
            "ragmon drift pin: nothing pinned (no traffic in the range, or too little). A running ragmon "
            f"writes its observations every drift.flush_s ({config.drift.flush_s:g} s): traffic newer than "
            "that may not be in the sample yet. Retry then, or pin through the running service "
            "(POST /api/v1/drift/references), which flushes first.",
            file=sys.stderr,
        )
        return 1
    return 0


def _list(args: argparse.Namespace, drift: DriftStore) -> int:
    if args.runs:
        runs = drift.runs(args.tenant, app=args.app, limit=args.limit)
        print(json.dumps([r.to_json() for r in runs], indent=2))
        return 0
    references = drift.references(args.tenant, app=args.app)
    if not references:
        print("no references pinned yet; pin one with: ragmon drift pin --from T --to T", file=sys.stderr)
    print(json.dumps([r.to_json() for r in references], indent=2))
    return 0


def explained(groups: list[dict[str, Any]] | None, limit: int = 3, examples: int = 2) -> list[str]:
    """What drifted, as lines: each query group that grew, its words, its share now and before, and a
    few of its queries (the same groups `--json` and the weekly report show)."""
    lines: list[str] = []
    for group in (groups or [])[:limit]:
        terms = ", ".join(group.get("terms") or []) or "(no distinctive words)"
        lines.append(
            f"{'new' if group.get('significant') else 'grew'}: {terms}: "
            f"{100 * group['share_window']:.1f} % of queries now ({group['n_window']}) vs "
            f"{100 * group['share_reference']:.1f} % before ({group['n_reference']}), "
            f"p={group['p_value']:.2g}"
        )
        lines += [f"  e.g. {example!r}" for example in (group.get("examples") or [])[:examples]]
    return lines


def described(record: RunRecord) -> list[str]:
    """The lines under a result: the window it tested (when the reference cut it short) and the power."""
    details = record.result.details
    lines: list[str] = []
    start, end = record.result.window_start, record.result.window_end
    if "window_requested_from" in details and start is not None and end is not None:
        lines.append(
            f"window {start.isoformat(timespec='seconds')} .. {end.isoformat(timespec='seconds')}: "
            "starts where the reference ends (a window never holds the reference's own hours)"
        )
    if "insufficient_data" in details:
        lines.append(f"not tested: {details['insufficient_data']}")
    if "power" in details:
        power = details["power"]
        if isinstance(power, dict):
            sign = {"at_most": "<=", "at_least": ">="}.get(str(power.get("bound")), "~")
            lines.append(
                f"power{sign}{float(str(power['power'])):.2f} at n={power['n_window']} against "
                f"{power['shift']} (estimated from {power['basis']})"
            )
        else:
            lines.append("power: not estimated for this test (no measured power curve)")
    return lines


def _run(args: argparse.Namespace, config: RagmonConfig, drift: DriftStore) -> int:
    from service.drift.monitor import DriftScheduler
    from service.metrics import Metrics

    scheduler = DriftScheduler(config.drift, drift, Metrics(config.metrics))
    now = datetime.now(UTC)
    records = scheduler.run(tenant=args.tenant, app=args.app, trigger="manual", now=now)
    since = now - timedelta(seconds=config.drift.window_s)
    without = scheduler.unreferenced(args.tenant, app=args.app, now=now)
    if args.json:
        print(
            json.dumps(
                {
                    "ran_at": now.isoformat(),
                    "window": {"from": since.isoformat(), "to": now.isoformat()},
                    "results": [r.to_json() for r in records],
                    "without_reference": [{"app": a, "model_key": m} for a, m in without],
                },
                indent=2,
            )
        )
        return 0
    if not records:
        print("no references pinned: nothing to compare with (ragmon drift pin --from T --to T)")
    for record in records:
        result = record.result
        p_value = "-" if result.p_value is None else f"{result.p_value:.4f}"
        print(
            f"{record.app:20} {result.detector:24} {record.outcome:17} alarm={str(record.alarm).lower():5} "
            f"stat={result.statistic:.4g} p={p_value} n={result.n_reference}/{result.n_window}"
        )
        for line in described(record):
            print(f"{'':22}{line}")
        for line in explained(record.explanation):
            print(f"{'':22}{line}")
    for app, model in without:
        print(f"{app:20} no reference for embedding model {model}")
    return 0


def main(args: argparse.Namespace, config: RagmonConfig) -> int:
    """Run one `ragmon drift` subcommand; returns the exit code."""
    store, drift = _open(config)
    try:
        if args.drift_command == "pin":
            return _pin(args, config, drift)
        if args.drift_command == "list":
            return _list(args, drift)
        return _run(args, config, drift)
    except ValueError as exc:
        print(f"ragmon drift {args.drift_command}: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
