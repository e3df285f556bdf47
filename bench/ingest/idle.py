"""CPU of an idle server: ragmon trees side by side, and Arize Phoenix beside them, nothing sent.

A monitoring service idles most of the day on a small app, and what it burns then
is paid for every hour. Each server starts, is left `--warmup` seconds to settle
(its first judge claims, drift and retention timers), then its process tree's
CPU (user + system, children included, as `run.py` counts it) is read over
`--seconds` with nothing sent. All run at once, so the machine is the same for
each; printed: ms of CPU a second of each, and each tree over the first.

    python bench/ingest/idle.py /tmp/a [/tmp/b ...] [--seconds 60] [--warmup 15] [--phoenix PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.ingest.servers import Phoenix, Ragmon, Server


def cpu_s(server: Server) -> float:
    assert server.rss is not None, "server not started"
    return server.rss.cpu_seconds()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trees", type=Path, nargs="+", help="ragmon source trees (the first is the baseline)")
    parser.add_argument("--seconds", type=float, default=60.0, help="idle seconds measured")
    parser.add_argument("--warmup", type=float, default=15.0, help="seconds left to settle first")
    parser.add_argument(
        "--phoenix",
        type=Path,
        default=Path("/tmp/bench-phoenix/bin/phoenix"),
        help="Phoenix executable (run.py's module docstring says how to install it); skipped if absent",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        servers: dict[str, Server] = {}
        for n, tree in enumerate(args.trees):
            name = f"ragmon {tree}"
            logs = Path(tmp) / f"log-{n}"
            logs.mkdir()
            servers[name] = stack.enter_context(Ragmon(Path(tmp) / f"r{n}", logs, source=tree))
        if args.phoenix.exists():
            logs = Path(tmp) / "log-phoenix"
            logs.mkdir()
            servers["phoenix"] = stack.enter_context(Phoenix(Path(tmp) / "phoenix", logs, args.phoenix))
        else:
            print(f"{args.phoenix} not found: Phoenix not measured", flush=True)
        time.sleep(args.warmup)
        start = {name: cpu_s(s) for name, s in servers.items()}
        began = time.monotonic()
        time.sleep(args.seconds)
        elapsed = time.monotonic() - began
        used = {name: (cpu_s(s) - start[name]) / elapsed * 1000 for name, s in servers.items()}
    base = used[next(iter(used))]
    for name, ms in used.items():
        print(f"{name}: {ms:.2f} ms of CPU a second idle ({ms / base:.2f}x the first)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
