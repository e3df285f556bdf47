"""The process tree under a PID, read from /proc (Linux), for tests that check nothing is left behind."""

from __future__ import annotations

import time
from pathlib import Path

PROC = Path("/proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name is in parentheses and may hold spaces: split after the last ")"
    fields = text.rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def descendants(pid: int) -> set[int]:
    """Every living process below `pid`."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[1], []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie waiting for its reaper has ended)."""
    return {pid for pid in pids if (stat := _stat(pid)) is not None and stat[0] != "Z"}


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    """Wait until none of `pids` runs; returns those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
