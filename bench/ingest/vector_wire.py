"""Screening and decoding OTLP spans with embedding vectors: today's `otlp_protobuf` against a baseline.

Screening (`screen_protobuf`: ingest, and each sinks worker again for the
records it reads) checks every embedding vector for NaN and length; decoding
(`span_from_wire`: the builder) reads its numbers. Both read a vector from its
serialized `ArrayValue`. Until session 31 that was re-encoded from the parsed
span (`SerializeToString`, linear in the vector's length); since then a long
one is sliced from the span's own bytes (`protobuf_wire.array_bytes`); since
session 32 decoding parses the span with `lazy_arrays.LazySpan`, which leaves
arrays serialized instead of building a message for each number.

The bodies are bench/ingest/payload.py's (four-span RAG traces, one query
vector a trace) at each `--dims`. The script first checks that both versions
give equal results (screened spans and decoded spans), then times them in
turn `--repeat` times, which one goes first alternating, in µs of CPU a trace:
each one's best and median, and the median of the rounds' ratios with its
quartiles (a slow moment of the machine hits both sides of a round). This
machine's speed moves by up to 2x within a minute: only runs that agree say
anything (bench/RESULTS.md).

    python bench/ingest/vector_wire.py [--baseline REV] [--dims 256 1536] [--bodies 20] [--repeat 21]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.baseline import load_module_at  # noqa: E402
from bench.ingest.payload import Batches  # noqa: E402
from service.conventions.spans import WireSpan  # noqa: E402
from service.ingest import otlp_protobuf  # noqa: E402
from service.ingest.decoded import DecodedBatch  # noqa: E402

TRACES_PER_BODY = 50


def _screen_all(module: ModuleType, bodies: list[bytes]) -> list[DecodedBatch]:
    return [module.screen_protobuf(body, "bench") for body in bodies]


def _decode_all(module: ModuleType, wires: list[WireSpan]) -> list[object]:
    problems = DecodedBatch()
    return [module.span_from_wire(wire, problems) for wire in wires]


def _cpu(fn: Callable[[], object]) -> float:
    started = time.process_time()
    fn()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="0fc824b", help="git revision of the version to compare with")
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 1536])
    parser.add_argument("--bodies", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    old = load_module_at(args.baseline, "baseline_otlp_protobuf", "service/ingest/otlp_protobuf.py")
    print(f"baseline {args.baseline}; {args.bodies} bodies of {TRACES_PER_BODY} traces; µs of CPU a trace")
    print(
        f"{'dims':>5} {'step':<22} {'best: baseline':>14} {'today':>7} {'ratio':>6}"
        f" {'median: baseline':>16} {'today':>7}  {'baseline/today by round, median [q1, q3]'}"
    )
    for dims in args.dims:
        bodies = list(Batches(seed=1, traces_per_request=TRACES_PER_BODY, dim=dims).bodies(args.bodies))
        screened_old, screened_new = _screen_all(old, bodies), _screen_all(otlp_protobuf, bodies)
        wires = [span for batch in screened_new for span in batch.spans if isinstance(span, WireSpan)]
        assert [b.spans for b in screened_old] == [b.spans for b in screened_new], "screening differs"
        assert _decode_all(old, wires) == _decode_all(otlp_protobuf, wires), "decoding differs"
        traces = args.bodies * TRACES_PER_BODY
        steps: dict[str, Callable[[ModuleType], object]] = {
            "screen (ingest, worker)": functools.partial(_screen_all, bodies=bodies),
            "decode (builder)": functools.partial(_decode_all, wires=wires),
        }
        for step, run in steps.items():
            old_s: list[float] = []
            new_s: list[float] = []
            for i in range(args.repeat):  # one of each in turn: a slow moment of the machine hits both
                for module in (old, otlp_protobuf) if i % 2 == 0 else (otlp_protobuf, old):
                    (old_s if module is old else new_s).append(_cpu(functools.partial(run, module)))
            ratios = [o / n for o, n in zip(old_s, new_s, strict=True)]
            q1, median, q3 = statistics.quantiles(ratios, n=4)
            best_old, best_new = (min(s) / traces * 1e6 for s in (old_s, new_s))
            median_old, median_new = (statistics.median(s) / traces * 1e6 for s in (old_s, new_s))
            print(
                f"{dims:>5} {step:<22} {best_old:>14.1f} {best_new:>7.1f} {best_old / best_new:>5.2f}x"
                f" {median_old:>16.1f} {median_new:>7.1f}  {median:.2f}x [{q1:.2f}, {q3:.2f}]"
            )


if __name__ == "__main__":
    main()
