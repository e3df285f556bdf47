"""Paired A/B of two ragmon source trees: both servers under the same load at the same time.

On a shared machine whose speed moves by tens of percent within the hour, two
trees measured one after the other differ by more than most changes do. Here a
server of each tree runs at once, each fed the same OTLP bodies by its own
closed loop (`--senders` each), or open loop (`--rate`), so whatever the machine does, it does to both.
Each round prints the CPU of each process tree per persisted trace (server,
forkserver, decoder and builder, as `run.py` counts it) and the ratio B/A.

Under closed loops the two servers do not load alike: the one that falls
behind builds and stores bigger batches, which cost less a trace. An A/A run
(one tree as both) read 1.082, 1.055 and 1.007 with A always first, and 0.953,
0.972, 0.950, 0.974 with the two swapping places every round, as they do here
(A first in odd rounds). So there a median within ~5 % of 1 is not a
difference.

`--rate R` feeds each server an open loop of R traces a second instead (a
request every 100/R s, whatever the answers): both then work through the same
batches at the same pace, and an A/A run read 0.999, 1.006, 0.995, 0.993 at 600
traces/s (session 38): a change of 2 % shows. It measures the CPU a trace at
that load, below capacity, where a server usually runs; costs paid per batch
weigh more there than at saturation, which the closed loops measure.

    git archive d3da186 | tar -x -C /tmp/a && git archive HEAD | tar -x -C /tmp/b
    python bench/ingest/paired.py /tmp/a /tmp/b [--traces 20000] [--rounds 4] [--rate 600] \\
        [--dim 256] [--b-setting RAGMON_X=Y]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.ingest.payload import Batches
from bench.ingest.run import LoadResult, closed_loop, open_loop
from bench.ingest.servers import Ragmon


def cpu_s(server: Ragmon) -> float:
    """User + system seconds of the server's process tree so far (its sampler, as `run.py` counts)."""
    assert server.rss is not None, "server not started"
    return server.rss.cpu_seconds()


def one_round(
    trees: dict[str, Path],
    settings: dict[str, dict[str, str]],
    order: list[str],
    bodies: list[bytes],
    traces: int,
    senders: int,
    rate: float | None = None,
) -> dict[str, float]:
    """CPU µs per persisted trace of each tree's server, both loaded at once: by `senders` closed
    loops each, or with `rate`, by an open loop each at `rate` traces a second."""
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        servers: dict[str, Ragmon] = {}
        for name in order:  # the first here starts first and gets the first sender
            logs = Path(tmp) / f"log-{name}"
            logs.mkdir()
            server = Ragmon(Path(tmp) / name, logs, source=trees[name], settings=settings[name])
            stack.enter_context(server)
            servers[name] = server
        start = {name: cpu_s(s) for name, s in servers.items()}

        per_request = traces // len(bodies)

        async def load() -> None:
            await asyncio.gather(
                *(
                    closed_loop(
                        servers[name].url, iter(bodies), senders, LoadResult(server=name, traces=traces)
                    )
                    if rate is None
                    else open_loop(
                        servers[name].url, bodies, per_request / rate, LoadResult(server=name, traces=traces)
                    )
                    for name in order
                )
            )

        asyncio.run(load())
        used: dict[str, float] = {}
        deadline = time.monotonic() + 300
        while len(used) < len(servers) and time.monotonic() < deadline:
            for name, server in servers.items():
                if name not in used and server.persisted() >= traces:
                    used[name] = (cpu_s(server) - start[name]) * 1e6 / traces
            time.sleep(0.1)
        if len(used) < len(servers):
            raise RuntimeError(f"not every trace was persisted within 300 s: {used}")
        return used


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tree_a", type=Path, help="ragmon source tree A (the baseline)")
    parser.add_argument("tree_b", type=Path, help="ragmon source tree B (the candidate)")
    parser.add_argument("--traces", type=int, default=20_000, help="traces sent to each server a round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--senders", type=int, default=2, help="closed-loop senders per server")
    parser.add_argument(
        "--rate",
        type=float,
        help="an open loop of this many traces a second to each server instead of closed loops: both "
        "servers then work through the same batches at the same pace (module docstring)",
    )
    parser.add_argument("--dim", type=int, default=256, help="numbers in each trace's query vector")
    parser.add_argument(
        "--b-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment setting for B's server only (repeatable)",
    )
    args = parser.parse_args(argv)
    trees = {"A": args.tree_a, "B": args.tree_b}
    settings = {"A": {}, "B": dict(item.split("=", 1) for item in args.b_setting)}
    batches = Batches(seed=1, dim=args.dim)
    bodies = list(batches.bodies(args.traces // batches.traces_per_request))
    traces = len(bodies) * batches.traces_per_request
    ratios: list[float] = []
    for r in range(args.rounds):
        order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
        used = one_round(trees, settings, order, bodies, traces, args.senders, args.rate)
        ratios.append(used["B"] / used["A"])
        print(
            f"round {r + 1} ({order[0]} first): A {used['A']:.0f} µs/trace, B {used['B']:.0f},"
            f" B/A {ratios[-1]:.3f}",
            flush=True,
        )
    noise = (
        "A/A with --rate 600 read 0.993-1.006: ~±1 % is noise"
        if args.rate
        else "A/A runs of closed loops read 0.950-0.974 swapping places, 1.007-1.082 without: ~±5 % is noise"
    )
    print(f"B/A per round {[round(x, 3) for x in ratios]}, median {statistics.median(ratios):.3f} ({noise})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
