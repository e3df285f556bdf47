"""The judge worker while nothing is queued: fewer claims as it stays idle, and woken by its own sampling.

An empty claim is a transaction on the queue; an idle server made two a second. The worker
now waits longer after each empty claim (`judging.poll_s` doubling up to
`judging.idle_poll_max_s`), and a trace this process samples into the queue wakes it at once.
Claims are counted as the SQL the queue sends to the database (one exhausted-lease sweep a
claim), through SQLAlchemy's statement events on the server's own engine.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from sampler.queue import ItemKey
from tests.live_server import LiveServer, live_server
from tests.service.judge.test_judging_e2e import judge_settings, queue_states, send, traces, wait_until


@contextmanager
def counted_claims(server: LiveServer) -> Iterator[list[float]]:
    """The times (monotonic) of the claims the server's judge workers make while inside."""
    claims: list[float] = []
    lock = threading.Lock()

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        # every claim first ends the expired leases with no attempts left: that statement marks it
        if statement.lstrip().upper().startswith("UPDATE JUDGE_QUEUE") and "attempts >=" in statement:
            with lock:
                claims.append(time.monotonic())

    engine = server.pipeline.judge_queue.engine
    sa.event.listen(engine, "before_cursor_execute", seen)
    try:
        yield claims
    finally:
        sa.event.remove(engine, "before_cursor_execute", seen)


def test_an_idle_worker_claims_less_and_less_often(tmp_path: Path) -> None:
    with live_server(tmp_path, **judge_settings(None, poll_s=0.05, idle_poll_max_s=0.8)) as server:
        with counted_claims(server) as claims:
            time.sleep(4.0)
        # waits 0.05, 0.1, 0.2, 0.4 and then 0.8 each: about 8 claims in 4 s, where a fixed
        # poll_s made 80
        assert 3 <= len(claims) <= 14, claims
        gaps = [b - a for a, b in itertools.pairwise(claims)]
        assert max(gaps) >= 0.6, gaps  # it reached the longest wait
        assert max(gaps) < 1.6, gaps  # and went no further


def test_a_sampled_trace_wakes_the_idle_worker(tmp_path: Path) -> None:
    """A 30 s idle wait, and yet what this server samples is judged within seconds."""
    settings = judge_settings(None, poll_s=30.0, idle_poll_max_s=30.0)
    with live_server(tmp_path, **settings) as server:
        with counted_claims(server) as claims:
            time.sleep(0.5)  # the worker's first claim ran at start, found nothing: it waits 30 s
            send(server, traces(6))
            wait_until(lambda: queue_states(server)["done"] == 6, timeout=10.0)
        # woken by the batches sampled (no more claims than a few wake-ups)
        assert 1 <= len(claims) <= 6, claims


def test_work_queued_by_another_process_is_claimed_within_the_longest_wait(tmp_path: Path) -> None:
    """Items queued behind this process's back (as another replica's sampler would: the queue's own
    `rejudge`, not the sink) wake nobody: the idle worker finds them at its next claim, at most
    `idle_poll_max_s` later."""
    with live_server(tmp_path, **judge_settings(None, poll_s=0.05, idle_poll_max_s=1.0)) as server:
        send(server, traces(4))
        wait_until(lambda: queue_states(server)["done"] == 4)
        queue = server.pipeline.judge_queue
        with queue.engine.connect() as conn:
            keys = [ItemKey(*row) for row in conn.execute(sa.text(JUDGED))]
        assert len(keys) == 4
        with counted_claims(server) as claims:
            time.sleep(2.5)  # idle long enough to reach the longest wait
            requeued_at = time.monotonic()
            assert set(queue.rejudge(keys)) == set(keys)
            wait_until(lambda: queue_states(server)["done"] == 4, timeout=10.0)
            judged_after = time.monotonic() - requeued_at
        assert judged_after < 1.0 + 1.5, judged_after  # the longest wait, and the judging
        assert len(claims) <= 10, claims  # it was idle-waiting, not polling every 0.05 s


JUDGED = "SELECT tenant, trace_id, judge_version FROM judge_queue WHERE state = 'done'"
