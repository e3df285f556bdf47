"""Interpreter settings for a long-running ragmon process (`serve`, `worker`, `demo`).

Measured with bench/ingest (see bench/RESULTS.md, "What changed"):

* Cyclic GC: ingest allocates hundreds of container objects a trace. With the
  default thresholds (700, 10, 10) the collector ran every few traces and took
  ~25 % of server CPU (~450 us a trace); (50,000, 50, 100) takes ~50 us.
  Objects made at import time are frozen out of it.
* GIL switch interval: decoding, building and storing run in worker threads
  while the event loop reads requests. A thread that wants the GIL waits up
  to the switch interval for the thread holding it, and the loop needs it
  many times per request (every read of a large body), so at CPU saturation
  the default 5 ms showed up directly in request latency. 0.5 ms costs a few
  more switches and no measurable throughput.

Nothing here changes behaviour, only speed; tests do not depend on it.
"""

from __future__ import annotations

import gc
import sys

GC_THRESHOLDS = (50_000, 50, 100)
SWITCH_INTERVAL_S = 0.0005


def tune_for_service() -> None:
    """Apply the settings above to this process; call once, after imports, before serving."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
