"""The flags of `ragmon demo`, apart from the demo itself so that `ragmon --help` does not load the
OpenTelemetry SDK and NumPy (`service/cli.py` imports `run.py` only when the demo runs)."""

from __future__ import annotations

import argparse
import os

__all__ = ["add_arguments"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the `ragmon demo` options to `parser`."""
    parser.add_argument("--target", default="http://127.0.0.1:4318", help="base URL of a running ragmon")
    parser.add_argument("--requests", type=int, default=600, help="how many simulated requests to send")
    parser.add_argument(
        "--rate", type=float, default=5.0, help="requests per second; 0 sends as fast as possible"
    )
    parser.add_argument("--seed", type=int, default=0, help="the traffic is a pure function of this seed")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("RAGMON_API_KEY"),
        help="sent as a bearer token (default: $RAGMON_API_KEY)",
    )
    parser.add_argument(
        "--shift-after",
        type=int,
        default=None,
        help="after this many requests, part of the traffic changes topic",
    )
    parser.add_argument("--dim", type=int, default=256, help="dimension of the query embeddings (8..4096)")
    parser.add_argument("--fixed-ids", action="store_true", help="derive trace ids from the seed too")
