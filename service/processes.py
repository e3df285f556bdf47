"""Where ragmon's helper processes come from, and how many a process may use.

The ingest pools (service/ingest/pool.py, service/api/request_pool.py) and the
Kafka producer process (service/bus/producer_process.py) all start their
processes here: from one forkserver per server process that imported
`service.ingest.pool` once, and without the parent's `__main__`
(`main_module_hidden`). One place, because a forkserver is started once: the
preload list of whichever user started it first is the one every later user
gets.
"""

from __future__ import annotations

import fcntl
import logging
import math
import multiprocessing
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import BaseContext
from pathlib import Path

__all__ = [
    "PIPE_BYTES",
    "cgroup_cpus",
    "main_module_hidden",
    "pipe_limit",
    "usable_cpus",
    "widen_pipe",
    "worker_context",
]

log = logging.getLogger(__name__)

# modules every forked helper needs; the producer process imports kafka-python itself, so a
# server that never talks to Kafka does not pay for it
_PRELOAD = ["service.ingest.pool"]


def worker_context() -> BaseContext:
    """The forkserver context every ragmon helper process is started from."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Start a helper process without the parent's `__main__`.

    A forkserver or spawn child re-imports the parent's main module (pytest, a
    user's script, the CLI with FastAPI) before it runs anything: ~0.7 s and
    tens of MB per process, for nothing a helper uses. Python 3.11 ignores
    "__main__" in the forkserver preload list, so the main module is swapped for
    a bare one while a process starts.
    """
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def cgroup_cpus(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> int | None:
    """CPUs a cgroup v2 quota allows (a container's CPU limit), None without a quota."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.ceil(int(quota) / int(period)))


def usable_cpus() -> int:
    """CPUs this process may use: those it is pinned to, and no more than a container's CPU quota
    allows (a pod limited to one CPU on a 64-core node must not start 4 helpers)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpus()
    return cpus if quota is None else min(cpus, quota)


PIPE_BYTES = 4 << 20
"""Capacity asked for each pipe to or from a helper process; /proc/sys/fs/pipe-max-size (1 MiB by
default) caps it.

A pipe holds 64 KiB by default, so a 700 KB body or answer crossed in ten or more reads,
each a separate wake-up of the reading process (bench/RESULTS.md, "Process-pool pipes widened")."""


def pipe_limit() -> int:
    """The capacity `widen_pipe` asks for: `PIPE_BYTES`, or the system's most if that is less."""
    try:
        return min(PIPE_BYTES, int(Path("/proc/sys/fs/pipe-max-size").read_text()))
    except (OSError, ValueError):
        return 1 << 20


def widen_pipe(fd: int) -> None:
    """Best effort: a pipe that cannot grow (not Linux, over the user's pipe-buffer quota) works
    as before, in more pieces."""
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None)
    if set_size is None:
        return
    try:
        fcntl.fcntl(fd, set_size, pipe_limit())
    except OSError as exc:
        log.debug("helper pipe left at its default size: %s", exc)
