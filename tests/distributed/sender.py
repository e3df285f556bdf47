"""A client for the fault tests that knows exactly which trace ids ingest acknowledged with 200.

Like an OTLP exporter, it sends a new batch of traces only after the previous
one was answered 200, and sends a refused batch (503, a dropped connection)
again, to the next replica, until one answers 200. So at the end every trace
it made was acknowledged once, and `acked` is the set of their ids.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import httpx

from tests.distributed.traffic import otlp_body, trace_ids

PROTOBUF = {"Content-Type": "application/x-protobuf"}


@dataclass
class Sender:
    urls: list[str]
    batch: int = 10
    pause_s: float = 0.0
    acked: set[str] = field(default_factory=set)
    requests: int = 0
    refused: int = 0  # 503 answers
    failed: int = 0  # no answer (connection refused or dropped, timeout)
    other: list[int] = field(default_factory=list)  # any other status: a test failure
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _turn: int = 0

    @property
    def sent(self) -> int:
        """Distinct trace ids sent so far."""
        return len(self.acked) + self._pending

    _pending: int = 0

    def _send(self, client: httpx.Client, ids: list[str]) -> None:
        body = otlp_body(ids)
        while True:
            url = self.urls[self._turn % len(self.urls)]
            self._turn += 1
            self.requests += 1
            try:
                status = client.post(f"{url}/v1/traces", content=body, headers=PROTOBUF).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                self.acked.update(ids)
                return
            if status == 503:
                self.refused += 1
            elif status is None:
                self.failed += 1
            else:
                self.other.append(status)
            time.sleep(0.2)

    def _run(self) -> None:
        with httpx.Client(timeout=15) as client:
            while not self._stop.is_set():
                ids = trace_ids(self.batch)
                self._pending = len(ids)
                self._send(client, ids)
                self._pending = 0
                if self.pause_s:
                    time.sleep(self.pause_s)

    def start(self) -> Sender:
        self._thread = threading.Thread(target=self._run, name="sender", daemon=True)
        self._thread.start()
        return self

    def finish(self, timeout: float = 120) -> None:
        """Stop after the batch in hand is acknowledged."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise AssertionError(f"the sender's last batch was not acknowledged in {timeout}s")
