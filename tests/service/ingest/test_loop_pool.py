"""LoopProcessPool: calls answered by worker processes through pipes the event loop drives; what a
worker raises reaches the caller; a killed worker fails only the calls it held and is replaced."""

from __future__ import annotations

import asyncio
import fcntl
import functools
import itertools
import multiprocessing
import operator
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from service.ingest.loop_pool import LoopProcessPool, WorkerDied
from service.processes import PIPE_BYTES
from tests.processes import wait_gone

CONTEXT = multiprocessing.get_context("forkserver")
MIB = 1 << 20


@pytest.fixture
async def pool() -> AsyncIterator[LoopProcessPool]:
    workers = LoopProcessPool(2, CONTEXT, name="test")
    await workers.start()
    yield workers
    await workers.close()


async def test_calls_are_answered_by_the_workers_in_parallel(pool: LoopProcessPool) -> None:
    sums = await asyncio.gather(*(pool.call(functools.partial(operator.add, n, n)) for n in range(50)))
    assert sums == [2 * n for n in range(50)]
    pids = pool.pids()
    assert len(pids) == 2 and os.getpid() not in pids
    # calls made together spread over both workers
    answered_by = await asyncio.gather(*(pool.call(os.getpid) for _ in range(8)))
    assert set(answered_by) == pids


async def test_what_a_call_raises_reaches_the_caller_and_the_pool_stays_whole(pool: LoopProcessPool) -> None:
    with pytest.raises(ValueError, match="invalid literal"):
        await pool.call(functools.partial(int, "nope"))
    # a result that cannot be pickled is the worker's error, not a lost call
    with pytest.raises(TypeError, match="pickle"):
        await pool.call(threading.Lock)
    # a call that cannot be pickled fails here, before it is sent
    with pytest.raises((TypeError, AttributeError)):
        await pool.call(lambda: 1)
    assert await pool.call(functools.partial(operator.mul, 6, 7)) == 42
    assert len(pool.pids()) == 2


async def test_calls_and_answers_larger_than_a_pipe_cross_whole(pool: LoopProcessPool) -> None:
    big = os.urandom(5 * MIB)
    # several at once: calls queue behind each other in one worker's pipe and wait for room
    lengths = await asyncio.gather(*(pool.call(functools.partial(len, big)) for _ in range(6)))
    assert lengths == [len(big)] * 6
    echoed = await asyncio.gather(*(pool.call(functools.partial(bytes, big)) for _ in range(3)))
    assert all(answer == big for answer in echoed)


@pytest.mark.skipif(not hasattr(fcntl, "F_GETPIPE_SZ"), reason="pipe sizes are Linux only")
async def test_pipes_are_widened_to_hold_a_whole_request_body(pool: LoopProcessPool) -> None:
    wanted = min(PIPE_BYTES, int(Path("/proc/sys/fs/pipe-max-size").read_text()))
    assert wanted > 64 * 1024, "this kernel keeps pipes at their default size; nothing to test"
    sizes = {
        fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        for worker in pool._workers
        for fd in (worker.call_fd, worker.answer_fd)
    }
    assert sizes == {wanted}


async def test_a_killed_worker_fails_only_the_calls_it_held_and_is_replaced() -> None:
    deaths: list[int] = []
    pool = LoopProcessPool(1, CONTEXT, depth=2, on_worker_died=lambda: deaths.append(1), name="test")
    await pool.start()
    try:
        (pid,) = pool.pids()
        held = [asyncio.ensure_future(pool.call(functools.partial(time.sleep, 30))) for _ in range(2)]
        waiting = [asyncio.ensure_future(pool.call(os.getpid)) for _ in range(3)]
        await asyncio.sleep(0.3)
        assert not any(call.done() for call in held + waiting)
        os.kill(pid, signal.SIGKILL)
        for call in held:
            with pytest.raises(WorkerDied):
                await asyncio.wait_for(call, 10)
        # the calls that were still waiting here went to the replacement
        answers = await asyncio.wait_for(asyncio.gather(*waiting), 30)
        (new_pid,) = pool.pids()
        assert new_pid != pid and set(answers) == {new_pid}
        assert deaths == [1]
        assert await pool.call(functools.partial(operator.add, 1, 2)) == 3
    finally:
        await pool.close()


async def test_a_worker_that_dies_on_start_is_restarted_at_most_once_a_second() -> None:
    deaths: list[float] = []
    pool = LoopProcessPool(
        1,
        CONTEXT,
        initializer=os._exit,
        initargs=(3,),
        on_worker_died=lambda: deaths.append(time.monotonic()),
        name="test",
    )
    await pool.start()
    try:
        deadline = time.monotonic() + 30
        while len(deaths) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # sent to a worker that dies, or refused at once while none is alive: the caller decides
        with pytest.raises(WorkerDied):
            await asyncio.wait_for(pool.call(os.getpid), 10)
    finally:
        await pool.close()
    # the first death is replaced at once, later ones a second apart: not hundreds of starts
    assert len(deaths) >= 4, deaths
    assert all(later - earlier > 0.9 for earlier, later in itertools.pairwise(deaths[1:])), deaths


async def test_workers_ignore_interrupts_meant_for_the_server(pool: LoopProcessPool) -> None:
    pids = pool.pids()
    # both have answered, so both are past start-up (a signal before the worker sets its handlers
    # gets the default action)
    assert set(await asyncio.gather(*(pool.call(os.getpid) for _ in range(8)))) == pids
    for pid in pids:
        os.kill(pid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        os.kill(pid, signal.SIGTERM)
    await asyncio.sleep(0.2)
    answered_by = await asyncio.gather(*(pool.call(os.getpid) for _ in range(8)))
    assert set(answered_by) == pids == pool.pids()


async def test_a_cancelled_call_does_not_shift_the_answers_of_the_next() -> None:
    pool = LoopProcessPool(1, CONTEXT, depth=3, name="test")
    await pool.start()
    try:
        slow = asyncio.ensure_future(pool.call(functools.partial(time.sleep, 0.3)))
        queued = asyncio.ensure_future(pool.call(functools.partial(operator.add, 40, 2)))
        await asyncio.sleep(0.05)
        slow.cancel()
        assert await queued == 42
        assert await pool.call(functools.partial(operator.add, 1, 1)) == 2
    finally:
        await pool.close()


async def test_close_answers_the_calls_made_and_ends_the_workers() -> None:
    pool = LoopProcessPool(2, CONTEXT, name="test")
    await pool.start()
    pids = pool.pids()
    calls = [asyncio.ensure_future(pool.call(functools.partial(operator.pow, 2, n))) for n in range(10)]
    slow = asyncio.ensure_future(pool.call(functools.partial(time.sleep, 0.5)))
    await asyncio.sleep(0)
    await pool.close()
    assert [call.result() for call in calls] == [2**n for n in range(10)]
    assert slow.done() and slow.result() is None
    with pytest.raises(RuntimeError, match="not running"):
        await pool.call(os.getpid)
    assert wait_gone(pids, timeout_s=10) == set()
    await pool.close()  # twice is safe


async def test_a_pool_needs_a_worker() -> None:
    with pytest.raises(ValueError):
        LoopProcessPool(0, CONTEXT)
    await LoopProcessPool(1, CONTEXT).close()  # closing one never started is safe


async def test_a_worker_killed_while_closing_fails_its_calls_instead_of_hanging() -> None:
    pool = LoopProcessPool(1, CONTEXT, depth=1, name="test")
    await pool.start()
    (pid,) = pool.pids()
    held = asyncio.ensure_future(pool.call(functools.partial(time.sleep, 30)))
    waiting = asyncio.ensure_future(pool.call(os.getpid))
    await asyncio.sleep(0.3)
    closing = asyncio.ensure_future(pool.close())
    await asyncio.sleep(0.1)
    assert not closing.done()
    os.kill(pid, signal.SIGKILL)
    await asyncio.wait_for(closing, 20)
    for call in (held, waiting):
        with pytest.raises(WorkerDied):
            call.result()
    assert pool.pids() == set()
