"""`LoopProcessPool`: worker processes whose pipes the event loop reads and writes itself.

Why not `concurrent.futures.ProcessPoolExecutor`: it moves calls and answers
through two threads of its own (a feeder that writes calls, a manager that
reads and unpickles answers). Each of them needs the GIL for every step, and
in the ragmon server the GIL is shared with the event loop and the sink
threads, so an answer that was ready in the pipe waited for a turn, and then
waited again for the loop to be woken. Here the event loop itself writes a
call into the worker's pipe and reads the answer as soon as the pipe is
readable (`add_reader`): one hand-off fewer on each side of a request. A
100-trace body's decode round trip beside two GIL-busy threads, widened
executor against this pool: p50 37.4 -> 30.9 ms, p99 58.8 -> 45.9 ms in one
run, 36.9 -> 33.1 and 62.8 -> 59.2 in another (bench/ingest/round_trip.py).

Each worker has its own pair of pipes, so a call goes to one worker: the one
with the fewest calls in hand, at most `depth` of them (so it has the next
call ready when it answers one); the rest wait here, in order.

Frames: a call is `!Q` length + the pickled zero-argument callable; an answer is
`!QB` length, kind + the pickled result or exception. Pipes are widened to hold
a whole call or answer (`service.processes.PIPE_BYTES`).

Faults: a worker that ends (killed, out of memory) shows as end-of-file on its
answer pipe. The calls it held fail with `WorkerDied` (the caller decides
whether to run them elsewhere); calls still waiting here go to the other
workers or its replacement, which is started at once (then at most one restart
a second, so a worker that dies on start does not spin). With no worker alive,
a call fails with `WorkerDied` at once.

Workers ignore SIGINT and SIGTERM: Ctrl-C and a process-group SIGTERM reach
them too, and ending them is the server's job. They end when their call pipe
is closed: by `close()`, or by the kernel when the server process ends,
however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import struct
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from service.processes import main_module_hidden, widen_pipe

log = logging.getLogger(__name__)

T = TypeVar("T")

CALL = struct.Struct("!Q")  # length of the pickled callable that follows
ANSWER = struct.Struct("!QB")  # length of the pickle that follows, and its kind:
RESULT, ERROR = 0, 1

READ_BYTES = 1 << 20
RESTART_INTERVAL_S = 1.0
REAP_TIMEOUT_S = 10.0


class WorkerDied(Exception):
    """The worker process that held a call ended before answering it (or none is running)."""


# ---------------------------------------------------------------- in the worker process


def _read_exactly(fd: int, size: int) -> bytearray | None:
    """`size` bytes from a blocking pipe; None at end of file (the server has gone or closed it)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        count = os.readv(fd, [view[got:]])
        if count == 0:
            return None
        got += count
    return buffer


def _write_all(fd: int, *parts: bytes) -> None:
    pending = [memoryview(part) for part in parts if part]
    while pending:
        written = os.writev(fd, pending)
        while written and written >= len(pending[0]):
            written -= len(pending.pop(0))
        if written:
            pending[0] = pending[0][written:]


def _pickled_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps(exc, pickle.HIGHEST_PROTOCOL)
    except Exception:  # an exception that does not pickle still reaches the caller, as text
        return pickle.dumps(RuntimeError(f"worker call failed: {exc!r}"), pickle.HIGHEST_PROTOCOL)


def _serve(
    calls: Connection, answers: Connection, initializer: Callable[..., None] | None, initargs: tuple[Any, ...]
) -> None:
    """A worker's whole life: answer calls in order until the call pipe ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if initializer is not None:
        initializer(*initargs)
    call_fd, answer_fd = calls.fileno(), answers.fileno()
    while (head := _read_exactly(call_fd, CALL.size)) is not None:
        (size,) = CALL.unpack(head)
        call = _read_exactly(call_fd, size)
        if call is None:
            return
        try:
            answer, kind = pickle.dumps(pickle.loads(call)(), pickle.HIGHEST_PROTOCOL), RESULT
        except BaseException as exc:  # every failure is the caller's to see
            answer, kind = _pickled_error(exc), ERROR
        del call
        _write_all(answer_fd, ANSWER.pack(len(answer), kind), answer)


# ---------------------------------------------------------------- in the server process


@dataclass(eq=False)
class _Worker:
    process: BaseProcess
    call_fd: int  # the write end of its call pipe, non-blocking
    answer_fd: int  # the read end of its answer pipe, non-blocking
    in_hand: deque[asyncio.Future[Any]] = field(default_factory=deque)  # sent, not answered, in order
    unsent: bytearray = field(default_factory=bytearray)  # calls waiting for room in the pipe
    inbox: bytearray = field(default_factory=bytearray)  # answer bytes read, not yet a whole frame


class LoopProcessPool:
    """`processes` worker processes, each answering zero-argument callables in turn.

    Use from one event loop: `await start()`, then `await call(fn)` from any task
    of that loop, then `await close()`. `fn` and its result must pickle.
    """

    def __init__(
        self,
        processes: int,
        context: BaseContext,
        *,
        initializer: Callable[..., None] | None = None,
        initargs: tuple[Any, ...] = (),
        depth: int = 2,
        on_worker_died: Callable[[], None] | None = None,
        name: str = "worker",
    ) -> None:
        if processes < 1 or depth < 1:
            raise ValueError("a LoopProcessPool needs at least one process and a depth of one")
        self.processes = processes
        self.context = context
        self.initializer = initializer
        self.initargs = initargs
        self.depth = depth
        self.on_worker_died = on_worker_died
        self.name = name
        self._workers: list[_Worker] = []
        self._waiting: deque[tuple[bytes, asyncio.Future[Any]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._last_restart = -RESTART_INTERVAL_S
        self._restart_pending = False
        self._reaping: dict[asyncio.Future[None], BaseProcess] = {}  # retired, not yet ended

    # -------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start every worker now. Safe twice."""
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for _ in range(self.processes):
            self._start_worker()

    def pids(self) -> set[int]:
        """Process ids of the live workers."""
        return {pid for worker in self._workers if (pid := worker.process.pid) is not None}

    async def close(self) -> None:
        """Let the calls made so far be answered, then end the workers. Safe twice and before start."""
        self._closing = True
        pending = [future for worker in self._workers for future in worker.in_hand]
        pending += [future for _, future in self._waiting]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for worker in list(self._workers):
            self._retire(worker)
        if self._reaping:
            await asyncio.wait(list(self._reaping), timeout=REAP_TIMEOUT_S)
        for reaped, process in list(self._reaping.items()):
            if not reaped.done():  # did not end on end of file: stuck in a call
                process.kill()
        if self._reaping:
            await asyncio.wait(list(self._reaping))

    def _start_worker(self) -> None:
        loop = self._loop
        assert loop is not None
        call_reader, call_writer = self.context.Pipe(duplex=False)
        answer_reader, answer_writer = self.context.Pipe(duplex=False)
        widen_pipe(call_writer.fileno())
        widen_pipe(answer_writer.fileno())
        process = self.context.Process(  # type: ignore[attr-defined]
            target=_serve,
            args=(call_reader, answer_writer, self.initializer, self.initargs),
            name=f"ragmon-{self.name}",
            daemon=True,
        )
        try:
            with main_module_hidden():
                process.start()
        except Exception:
            call_writer.close()  # the other two are closed below either way
            answer_reader.close()
            raise
        finally:
            # the worker has its own copies now; an end kept here would hide its death
            call_reader.close()
            answer_writer.close()
        worker = _Worker(process, os.dup(call_writer.fileno()), os.dup(answer_reader.fileno()))
        call_writer.close()
        answer_reader.close()
        os.set_blocking(worker.call_fd, False)
        os.set_blocking(worker.answer_fd, False)
        loop.add_reader(worker.answer_fd, self._on_readable, worker)
        self._workers.append(worker)

    def _retire(self, worker: _Worker) -> None:
        """Stop watching a worker, close its pipes (it ends on end of file), and reap it when it
        has ended (its sentinel becomes readable): no thread, no zombie."""
        loop = self._loop
        assert loop is not None
        self._workers.remove(worker)
        loop.remove_reader(worker.answer_fd)
        loop.remove_writer(worker.call_fd)
        os.close(worker.answer_fd)
        os.close(worker.call_fd)
        process = worker.process
        reaped = loop.create_future()

        def ended() -> None:
            loop.remove_reader(process.sentinel)
            process.join(0)
            if process.exitcode is not None:
                process.close()
            if not reaped.done():
                reaped.set_result(None)

        loop.add_reader(process.sentinel, ended)
        self._reaping[reaped] = process
        reaped.add_done_callback(self._reaping.pop)

    # -------------------------------------------------------------- calls

    async def call(self, fn: Callable[[], T]) -> T:
        """`fn()` in a worker. Raises what `fn` raised (as the worker pickled it), `WorkerDied`
        if the worker ended first or none is running, RuntimeError after `close()`."""
        if self._loop is None or self._closing:
            raise RuntimeError(f"{self.name} pool is not running")
        if not self._workers:
            raise WorkerDied(f"no {self.name} process is running")
        data = pickle.dumps(fn, pickle.HIGHEST_PROTOCOL)
        future: asyncio.Future[T] = self._loop.create_future()
        self._waiting.append((CALL.pack(len(data)) + data, future))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._waiting:
            if not self._workers:
                while self._waiting:
                    _, future = self._waiting.popleft()
                    if not future.done():
                        future.set_exception(WorkerDied(f"no {self.name} process is running"))
                return
            worker = min(self._workers, key=lambda w: len(w.in_hand))
            if len(worker.in_hand) >= self.depth:
                return
            frame, future = self._waiting.popleft()
            if future.done():  # cancelled while it waited
                continue
            worker.in_hand.append(future)
            self._send(worker, frame)

    def _send(self, worker: _Worker, frame: bytes) -> None:
        if worker.unsent:
            worker.unsent += frame
            return
        try:
            written = os.write(worker.call_fd, frame)
        except BlockingIOError:
            written = 0
        except OSError:  # the worker has gone (EPIPE); its answer pipe says so too
            self._lost(worker)
            return
        if written < len(frame):
            worker.unsent += memoryview(frame)[written:]
            assert self._loop is not None
            self._loop.add_writer(worker.call_fd, self._on_writable, worker)

    def _on_writable(self, worker: _Worker) -> None:
        try:
            written = os.write(worker.call_fd, worker.unsent)
        except BlockingIOError:
            return
        except OSError:
            self._lost(worker)
            return
        del worker.unsent[:written]
        if not worker.unsent:
            assert self._loop is not None
            self._loop.remove_writer(worker.call_fd)

    def _on_readable(self, worker: _Worker) -> None:
        try:
            chunk = os.read(worker.answer_fd, READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._lost(worker)
            return
        worker.inbox += chunk
        inbox = worker.inbox
        while len(inbox) >= ANSWER.size:
            size, kind = ANSWER.unpack_from(inbox)
            end = ANSWER.size + size
            if len(inbox) < end:
                break
            with memoryview(inbox) as view, view[ANSWER.size : end] as payload:
                try:
                    answer: Any = pickle.loads(payload)
                except Exception as exc:  # a garbled answer fails its call, not the pool
                    answer, kind = exc, ERROR
            del inbox[:end]
            future = worker.in_hand.popleft()
            if not future.done():
                if kind == RESULT:
                    future.set_result(answer)
                else:
                    future.set_exception(answer)
        self._dispatch()

    def _lost(self, worker: _Worker) -> None:
        """A worker ended: fail what it held, start its replacement, send it what waits."""
        if worker not in self._workers:
            return
        self._retire(worker)
        held = len(worker.in_hand)
        for future in worker.in_hand:
            if not future.done():
                future.set_exception(WorkerDied(f"the {self.name} process ended before answering"))
        if self._closing:  # no replacement; what waits goes to the others, or fails
            self._dispatch()
            return
        log.error("a %s process ended with %d calls in hand; starting another", self.name, held)
        if self.on_worker_died is not None:
            self.on_worker_died()
        self._restart()

    def _restart(self) -> None:
        loop = self._loop
        assert loop is not None
        self._restart_pending = False
        if self._closing or len(self._workers) >= self.processes:
            return
        wait = self._last_restart + RESTART_INTERVAL_S - time.monotonic()
        if wait <= 0:
            self._last_restart = time.monotonic()
            try:
                self._start_worker()
            except Exception:
                log.exception("could not start a %s process; trying again in a second", self.name)
                wait = RESTART_INTERVAL_S
        if wait > 0 and not self._restart_pending:
            self._restart_pending = True
            loop.call_later(wait, self._restart)
        self._dispatch()
