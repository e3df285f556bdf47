"""Interpreter settings for a long-running ragmon process (`serve`, `worker`, `demo`).

Measured with bench/ingest (see bench/RESULTS.md, "What changed"):

* Cyclic GC: ingest allocates hundreds of container objects a trace. With the
  default thresholds (700, 10, 10) the collector ran every few traces and took
  ~25 % of server CPU (~450 us a trace); (50,000, 50, 100) took ~30 us, and
  (200,000, 50, 100) ~13 us, with unpickling the builders' traces ~10 us a trace
  cheaper too (collections ran inside it): 20k-trace closed loops, collector time
  from gc.callbacks, 0.61-0.66 s against 0.25-0.26 s. (1,000,000, 50, 100) took
  ~5 us, but lets up to a million young objects of cyclic garbage wait for the
  collector; 200,000 bounds that to ~20 MB. Objects made at import time are
  frozen out of it.
* GIL switch interval: decoding, building and storing run in worker threads
  while the event loop reads requests. A thread that wants the GIL waits up
  to the switch interval for the thread holding it, and the loop needs it
  many times per request (every read of a large body), so at CPU saturation
  the default 5 ms showed up directly in request latency. 0.5 ms costs a few
  more switches and no measurable throughput.
* glibc malloc: request bodies and the pickles worker processes send back
  are ~0.75 MB each. glibc serves such blocks with mmap at first, then raises
  its mmap threshold and keeps them in the heaps of whichever threads freed
  them, one arena per thread; the server process grew ~60 MiB over 130k traces
  that way. Two arenas and a fixed threshold kept it ~55 MiB lower. The
  threshold was 256 KiB until session 36 found what it cost: every block
  over it (a request body, its pickle to the decoder, the answer back: ~6 a
  request) was mapped fresh and its pages faulted in, ~300 us for 375 KB
  against ~12 us from the heap, ~15 % of an ingest replica's CPU on the
  broker. So the threshold is 4 MiB, and the heap keeps up to 8 MiB free at
  its top (`M_TRIM_THRESHOLD`: at glibc's default of 128 KiB the top was
  returned and faulted in again on every large block all the same). Same as
  `MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=4194304
  MALLOC_TRIM_THRESHOLD_=8388608`, which a user's environment still
  overrides: it is read before this runs. Other C libraries are left alone.

Nothing here changes behaviour, only speed; tests do not depend on it.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys

GC_THRESHOLDS = (200_000, 50, 100)
SWITCH_INTERVAL_S = 0.0005
MALLOC_ARENAS = 2
MALLOC_MMAP_THRESHOLD = 4 * 1024 * 1024
MALLOC_TRIM_THRESHOLD = 8 * 1024 * 1024
# mallopt parameter numbers from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_ENVIRONMENT = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def tune_malloc() -> bool:
    """Apply the glibc malloc settings above unless the environment sets them; True if applied."""
    if platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _ENVIRONMENT):
        return False  # the user's choice
    try:
        libc = ctypes.CDLL(None)
        return bool(
            libc.mallopt(_M_ARENA_MAX, MALLOC_ARENAS)
            and libc.mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)
            and libc.mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD)
        )
    except (OSError, AttributeError):
        return False


def tune_for_service() -> None:
    """Apply the settings above to this process; call once, after imports, before serving."""
    tune_malloc()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
