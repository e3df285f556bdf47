"""`ragmon report`: its flags, and the command that writes the report (`weekly.py` builds and renders it).

The module imports nothing heavy at load: `ragmon --help` builds every command's flags, and the report
pulls in NumPy, SciPy and the store, which only `main` needs.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.config import RagmonConfig

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `ragmon report` options to `parser`."""
    parser.add_argument(
        "--since", default="7d", help="period start: an age like 7d, or ISO 8601 (default 7d)"
    )
    parser.add_argument("--until", default="now", help="period end (default now)")
    parser.add_argument(
        "--out", type=Path, help="output directory (default: the tenant's reports folder, <date>)"
    )
    parser.add_argument("--app", help="only this app")
    parser.add_argument("--tenant", default="default", help="tenant to report on (default: default)")


def main(args: argparse.Namespace, config: RagmonConfig) -> int:
    """Write report.html and report.md to --out and refresh the latest copies; print where they are."""
    from sampler import create_tables
    from service.drift.cli import parse_time
    from service.drift.store import DriftStore
    from service.judge.store import JudgmentStore
    from service.report.latest import LATEST_HTML, LATEST_MD, latest_dir
    from service.report.render import render_html, render_markdown
    from service.report.weekly import build_report
    from service.store.trace_store import Store

    try:
        now = datetime.now(UTC)
        since, until = parse_time(args.since, now), parse_time(args.until, now)
    except ValueError as exc:
        print(f"ragmon report: {exc}", file=sys.stderr)
        return 2
    config.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(
        config.store_url, connect_timeout_s=config.store.timeout_s, statement_timeout_s=config.store.timeout_s
    )
    try:
        store.create_schema()
        JudgmentStore(store.engine).create_schema()
        create_tables(store.engine)
        drift = DriftStore(
            store.engine, bucket_s=config.drift.bucket_s, bucket_capacity=config.drift.bucket_capacity
        )
        drift.create_schema()
        report = build_report(
            config, store, drift, tenant=args.tenant, since=since, until=until, app=args.app
        )
    except ValueError as exc:
        print(f"ragmon report: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    html, markdown = render_html(report), render_markdown(report)
    latest = latest_dir(config, args.tenant, args.app)
    out: Path = args.out or latest / f"{until:%Y-%m-%d}"
    for directory in (out, latest):
        directory.mkdir(parents=True, exist_ok=True)
    (out / "report.html").write_text(html, encoding="utf-8")
    (out / "report.md").write_text(markdown, encoding="utf-8")
    (latest / LATEST_HTML).write_text(html, encoding="utf-8")
    (latest / LATEST_MD).write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"report written to {out / 'report.html'} and {out / 'report.md'}", file=sys.stderr)
    return 0
