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
* Returning freed memory: ingest's live Python objects stay flat (tracemalloc:
  13 MiB after 5k traces, 9 MiB after 25k) while RSS crept up over a long run,
  because glibc keeps freed blocks of each busy heap for reuse. `malloc_trim(0)`
  every few seconds hands free pages back to the OS; it is a no-op where the C
  library is not glibc.

Nothing here changes behaviour, only speed and memory; tests do not depend on it.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import sys
import threading

GC_THRESHOLDS = (50_000, 50, 100)
SWITCH_INTERVAL_S = 0.0005
TRIM_EVERY_S = 5.0

_trimmer: threading.Thread | None = None


def tune_for_service() -> None:
    """Apply the settings above to this process; call once, after imports, before serving."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    start_memory_trim()


def trim_memory() -> bool:
    """Give the C heap's free pages back to the OS now; False where that is not available (not glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def start_memory_trim(every_s: float = TRIM_EVERY_S) -> bool:
    """Trim every `every_s` seconds in a daemon thread (once per process); False when unavailable."""
    global _trimmer
    if _malloc_trim() is None:
        return False
    if _trimmer is None:
        stop = threading.Event()  # never set: the thread ends with the process

        def run() -> None:
            while not stop.wait(every_s):
                trim_memory()

        _trimmer = threading.Thread(target=run, name="malloc-trim", daemon=True)
        _trimmer.start()
    return True


@functools.cache
def _malloc_trim() -> ctypes._NamedFuncPointer | None:
    # The process's own symbol table: glibc's malloc_trim when linked, without `find_library`
    # (which runs a subprocess each call: a fork of the whole server).
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None
