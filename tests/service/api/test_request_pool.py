"""`RequestPool`: calls run in its worker process, or in a thread without one or when it died."""

from __future__ import annotations

import functools
import os

import pytest

from service.api.request_pool import REQUEST_WORKER_NICENESS, RequestPool
from service.errors import InvalidInput
from service.probes.upload import read_golden_upload


def where_and_niceness() -> tuple[int, int]:
    return os.getpid(), os.nice(0)


def die_unless_in(pid: int) -> str:
    if os.getpid() != pid:
        os._exit(3)  # the worker process ends mid-call, as when it is killed
    return "here"


async def test_calls_run_in_a_lower_priority_worker_process() -> None:
    pool = RequestPool(1)
    try:
        pid, niceness = await pool.run(where_and_niceness)
        assert pid != os.getpid() and pool.pids() == {pid}
        assert niceness >= min(os.nice(0) + REQUEST_WORKER_NICENESS, 19)
        # an error crosses the process boundary as itself, with its message
        with pytest.raises(InvalidInput, match="name: Field required"):
            await pool.run(functools.partial(read_golden_upload, b'{"jsonl": ""}'))
    finally:
        await pool.stop()
    assert not pool.pids()
    assert (await pool.run(where_and_niceness))[0] == os.getpid(), "after stop, calls run here"


async def test_a_call_whose_worker_died_runs_in_a_thread() -> None:
    pool = RequestPool(1)
    try:
        assert await pool.run(functools.partial(die_unless_in, os.getpid())) == "here"
    finally:
        await pool.stop()


async def test_without_processes_calls_run_in_threads() -> None:
    pool = RequestPool(0)
    assert (await pool.run(where_and_niceness))[0] == os.getpid()
    assert not pool.pids()
    await pool.stop()
    with pytest.raises(ValueError):
        RequestPool(2)
