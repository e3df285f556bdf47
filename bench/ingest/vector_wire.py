"""Screening and decoding OTLP spans with embedding vectors: today's `otlp_protobuf` against a baseline.

Screening (`screen_protobuf`: ingest, and each sinks worker again for the
records it reads) checks every embedding vector for NaN and length; decoding
(`span_from_wire`: the builder) reads its numbers. Both read a vector from its
serialized `ArrayValue`. Until session 31 that was re-encoded from the parsed
span (`SerializeToString`, linear in the vector's length); now it is sliced
from the span's own bytes (`protobuf_wire.array_bytes`).

The bodies are bench/ingest/payload.py's (four-span RAG traces, one query
vector a trace) at each `--dims`. The script first checks that both versions
give equal results (screened spans and decoded spans), then times them one
after the other `--repeat` times and keeps each one's best, in µs of CPU a trace.
This machine's speed moves by up to 2x within a minute: only runs that agree say
anything (bench/RESULTS.md).

    python bench/ingest/vector_wire.py [--baseline REV] [--dims 256 1536] [--bodies 20] [--repeat 15]
"""

from __future__ import annotations

import argparse
import functools
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
    parser.add_argument("--baseline", default="c1b0b13", help="git revision of the version to compare with")
    parser.add_argument("--dims", type=int, nargs="+", default=[256, 1536])
    parser.add_argument("--bodies", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    old = load_module_at(args.baseline, "baseline_otlp_protobuf", "service/ingest/otlp_protobuf.py")
    print(f"baseline {args.baseline}; {args.bodies} bodies of {TRACES_PER_BODY} traces; µs of CPU a trace")
    print(f"{'dims':>5} {'step':<22} {'baseline':>9} {'today':>9} {'ratio':>6}")
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
            old_s = new_s = float("inf")
            for _ in range(args.repeat):  # one of each in turn: a slow moment of the machine hits both
                old_s = min(old_s, _cpu(functools.partial(run, old)))
                new_s = min(new_s, _cpu(functools.partial(run, otlp_protobuf)))
            print(
                f"{dims:>5} {step:<22} {old_s / traces * 1e6:>9.1f} {new_s / traces * 1e6:>9.1f}"
                f" {old_s / new_s:>5.2f}x"
            )


if __name__ == "__main__":
    main()
