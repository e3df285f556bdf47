"""`ragmon probe` and `ragmon golden`: send golden-set probes to an app on a schedule; drive the probe API.

    ragmon probe --golden FILE --endpoint URL [--every 1h] [--run-id ID] [--header K:V ...]
                 [--ragmon URL] [--name NAME] [--settle-s 5] [--runs N]
    ragmon probe score RUN_ID [--golden NAME]      score a run (golden set needed if it was never registered)
    ragmon probe pin RUN_ID                        pin a scored run as its golden set's baseline
    ragmon golden load FILE [--name NAME]          load a golden set into ragmon

With `--ragmon`, a probe run first loads the golden set into ragmon and
registers the run, sends the questions, waits `--settle-s` seconds for the
app's traces to be assembled and stored, then asks ragmon to score the run
(which compares it with the previous run and the pinned baseline and sets
the probe gauges). Without it, the run is only sent; score it later with
`ragmon probe score`. Each run prints one JSON line on stdout.

The commands that talk to ragmon use `--ragmon` (default
`$RAGMON_URL`, else http://127.0.0.1:4318) and `--api-key` (default
`$RAGMON_API_KEY`). Exit status: 0 when every question was sent (and, with
`--ragmon`, the run was scored), 1 when some were not or ragmon refused,
2 for bad arguments or a bad golden set.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.errors import InvalidInput

if TYPE_CHECKING:
    # httpx and the runner load when a command runs, not when `ragmon --help` builds the flags
    from service.probes.runner import ProbeRunner

__all__ = ["add_golden_arguments", "add_probe_arguments", "golden_main", "parse_every", "probe_main"]

_EVERY = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def parse_every(text: str) -> float:
    """Seconds in an interval such as `30s`, `15m`, `1h`, `1d`; ValueError for anything else."""
    match = _EVERY.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not an interval: {text!r}; use a positive number and a unit: 30s, 15m, 1h, 1d")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _header(text: str) -> tuple[str, str]:
    name, sep, value = text.partition(":")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"a header is NAME:VALUE, got {text!r}")
    return name.strip(), value.strip()


def _every(text: str) -> float:
    try:
        return parse_every(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_ragmon_flags(parser: argparse.ArgumentParser, default_url: str | None) -> None:
    where = (
        "ragmon base URL (default $RAGMON_URL or http://127.0.0.1:4318)"
        if default_url is not None
        else "ragmon base URL: load, register and score each run there (default: only send)"
    )
    parser.add_argument("--ragmon", default=default_url, help=where)
    parser.add_argument("--api-key", default=os.environ.get("RAGMON_API_KEY"), help="ragmon API key")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="timeout of each call to ragmon")


def _default_url() -> str:
    return os.environ.get("RAGMON_URL") or "http://127.0.0.1:4318"


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """`ragmon probe` (send runs) and its `score` and `pin` subcommands."""
    parser.add_argument("--golden", type=Path, help="golden-set JSONL file to send")
    parser.add_argument("--endpoint", help="the app's URL that answers a question (POST JSON)")
    parser.add_argument(
        "--every", type=_every, help="send a run on this schedule (30m, 1h, 1d); default once"
    )
    parser.add_argument("--runs", type=int, help="with --every, stop after this many runs (default: never)")
    parser.add_argument("--run-id", help="run id of a single run (default: probe-<UTC time>-<random>)")
    parser.add_argument(
        "--header", type=_header, action="append", default=[], help="extra request header NAME:VALUE"
    )
    parser.add_argument("--name", help="golden set name in ragmon (default: the file name without suffix)")
    parser.add_argument("--concurrency", type=int, default=4, help="questions in flight at once")
    parser.add_argument("--request-timeout-s", type=float, default=60.0, help="timeout of each app request")
    parser.add_argument(
        "--settle-s", type=float, default=5.0, help="wait between sending and scoring (trace assembly)"
    )
    _add_ragmon_flags(parser, None)
    commands = parser.add_subparsers(dest="probe_command")
    score = commands.add_parser("score", help="score a probe run from its stored traces")
    score.add_argument("run_id")
    score.add_argument("--golden", dest="score_golden", help="golden set name, for a run never registered")
    _add_ragmon_flags(score, _default_url())
    pin = commands.add_parser("pin", help="pin a scored run as its golden set's baseline")
    pin.add_argument("run_id")
    _add_ragmon_flags(pin, _default_url())


def add_golden_arguments(parser: argparse.ArgumentParser) -> None:
    """`ragmon golden load FILE`."""
    commands = parser.add_subparsers(dest="golden_command", required=True)
    load = commands.add_parser("load", help="load a golden-set JSONL file into ragmon (versioned by content)")
    load.add_argument("file", type=Path)
    load.add_argument("--name", help="name to keep it under (default: the file name without suffix)")
    _add_ragmon_flags(load, _default_url())


class _Ragmon:
    """The probe API of one ragmon, over HTTP."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float) -> None:
        import httpx

        headers = {"x-api-key": api_key} if api_key else {}
        self.client = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        response = self.client.request(method, f"/api/v1/probes{path}", json=body)
        if not response.is_success:
            raise RuntimeError(
                f"ragmon answered {response.status_code} to {method} {path}: {response.text[:500]}"
            )
        data: dict[str, Any] = response.json()
        return data

    def close(self) -> None:
        self.client.close()


def _load(ragmon: _Ragmon, path: Path, name: str | None) -> dict[str, Any]:
    return ragmon.call(
        "POST",
        "/golden",
        {"name": name or path.stem, "jsonl": path.read_text(encoding="utf-8"), "source": str(path)},
    )


def _headline(scored: dict[str, Any]) -> dict[str, Any]:
    score = scored["score"]

    def deltas(comparison: dict[str, Any] | None) -> dict[str, Any] | None:
        if comparison is None:
            return None
        return {
            "against": comparison["against"],
            "worse": comparison["worse"],
            "better": comparison["better"],
            **{
                name: {key: entry[key] for key in ("delta", "lower", "upper", "significant")}
                for name, entry in comparison["metrics"].items()
            },
        }

    return {
        "denominators": score["denominators"],
        "overall": score["overall"],
        "filter_false_exclusion": score["filter_false_exclusion"]["rate"],
        "correct": score["correctness"]["rate"],
        "diagnoses": score["diagnoses"],
        "against_previous": deltas(scored["against_previous"]),
        "against_baseline": deltas(scored["against_baseline"]),
    }


def _one_run(args: argparse.Namespace, runner: ProbeRunner, ragmon: _Ragmon | None, run_id: str) -> int:
    name = args.name or args.golden.stem
    if ragmon is not None:
        _load(ragmon, args.golden, args.name)
        ragmon.call("POST", "/runs", {"golden": name, "run_id": run_id})
    sends = asyncio.run(runner.send(run_id))
    failed = {s.question_id: s.error for s in sends if not s.ok}
    line: dict[str, Any] = {"run_id": run_id, "golden": name, "sent": len(sends), "failed": failed}
    if ragmon is not None:
        time.sleep(args.settle_s)
        line["score"] = _headline(ragmon.call("POST", f"/runs/{run_id}/score"))
    print(json.dumps(line), flush=True)
    return EXIT_FAILED if failed else 0


def _send_runs(args: argparse.Namespace) -> int:
    import httpx

    from service.probes.golden import load_golden
    from service.probes.runner import ProbeRunner, new_run_id

    if args.golden is None or args.endpoint is None:
        print("ragmon probe: --golden and --endpoint are required to send a run", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.every is not None and args.run_id is not None:
        print("ragmon probe: --run-id names one run; leave it out with --every", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        golden = load_golden(args.golden)
        runner = ProbeRunner(
            golden,
            args.endpoint,
            headers=dict(args.header),
            timeout_s=args.request_timeout_s,
            concurrency=args.concurrency,
        )
    except (OSError, InvalidInput, ValueError) as exc:
        print(f"ragmon probe: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ragmon = _Ragmon(args.ragmon, args.api_key, args.timeout_s) if args.ragmon else None
    code = 0
    done = 0
    try:
        while True:
            started = time.monotonic()
            code = max(code, _one_run(args, runner, ragmon, args.run_id or new_run_id()))
            done += 1
            if args.every is None or (args.runs is not None and done >= args.runs):
                return code
            time.sleep(max(0.0, args.every - (time.monotonic() - started)))
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"ragmon probe: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if ragmon is not None:
            ragmon.close()


def probe_main(args: argparse.Namespace) -> int:
    """Entry point of `ragmon probe` (see the module docstring)."""
    import httpx

    if args.probe_command is None:
        return _send_runs(args)
    ragmon = _Ragmon(args.ragmon, args.api_key, args.timeout_s)
    try:
        if args.probe_command == "score":
            body = {"golden": args.score_golden} if args.score_golden else None
            scored = ragmon.call("POST", f"/runs/{args.run_id}/score", body)
            print(json.dumps({"run_id": args.run_id, **_headline(scored)}))
        else:
            print(json.dumps(ragmon.call("POST", "/baseline", {"run_id": args.run_id})))
        return 0
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"ragmon probe: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        ragmon.close()


def golden_main(args: argparse.Namespace) -> int:
    """Entry point of `ragmon golden load`: checks the file locally first, then loads it into ragmon."""
    import httpx

    from service.probes.golden import load_golden

    try:
        load_golden(args.file)
    except (OSError, InvalidInput) as exc:
        print(f"ragmon golden: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    ragmon = _Ragmon(args.ragmon, args.api_key, args.timeout_s)
    try:
        print(json.dumps(_load(ragmon, args.file, args.name)))
        return 0
    except (RuntimeError, httpx.HTTPError) as exc:
        print(f"ragmon golden: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        ragmon.close()
