"""Tests of service/ingest/wal.py and ledger.py: records survive a crash, torn tails are cut, stored
segments go, a full disk answers 503 and loses nothing acknowledged."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.ingest.ledger import AckLedger
from service.ingest.wal import LoggedRequest, WalFull, WalUnavailable, WriteAheadLog
from tests.live_server import live_server


def request(n: int, size: int = 100) -> LoggedRequest:
    return LoggedRequest(
        "otlp_traces",
        f"tenant-{n % 3}",
        bytes([n % 256]) * size,
        "application/x-protobuf",
        "gzip",
        "otlp_http",
    )


async def _append_all(wal: WriteAheadLog, requests: list[LoggedRequest]) -> list[int]:
    return list(await asyncio.gather(*(wal.append(r) for r in requests)))


def test_records_come_back_in_order_after_a_restart(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    assert wal.open() == []
    sent = [request(n) for n in range(50)]
    seqs = asyncio.run(_append_all(wal, sent))
    assert seqs == list(range(50))
    # 50 concurrent appends share fsyncs: group commit
    assert 1 <= wal.fsyncs < 50
    # no close: as after a SIGKILL
    again = WriteAheadLog(tmp_path)
    back = again.open()
    assert [(r.seq, r.kind, r.tenant, r.body, r.media_type, r.encoding, r.receiver) for r in back] == [
        (n, s.kind, s.tenant, s.body, s.media_type, s.encoding, s.receiver) for n, s in enumerate(sent)
    ]
    assert again.next_seq == 50


def test_a_torn_tail_is_cut_and_what_came_before_kept(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open()
    asyncio.run(_append_all(wal, [request(n) for n in range(3)]))
    (segment,) = tmp_path.glob("*.wal")
    whole = segment.stat().st_size
    with segment.open("ab") as handle:  # a write that a crash cut in the middle
        handle.write(b"\x40\x00\x00\x00\x01\x02")
    back = WriteAheadLog(tmp_path).open()
    assert [r.seq for r in back] == [0, 1, 2]
    assert segment.stat().st_size == whole
    # a flipped byte inside the last record: that record was never acknowledged whole
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert [r.seq for r in WriteAheadLog(tmp_path).open()] == [0, 1]


def test_segments_below_the_watermark_are_deleted(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, segment_bytes=1_000, segment_max_age_s=3600)
    wal.open()

    async def run() -> None:
        for n in range(30):  # one at a time: each group is one record, segments roll at 1 kB
            await wal.append(request(n, size=300))

    asyncio.run(run())
    files = sorted(tmp_path.glob("*.wal"))
    assert len(files) >= 5 and wal.segments == len(files)
    assert wal.release_below(0) == 0
    deleted = wal.release_below(12)
    left = WriteAheadLog(tmp_path).open()
    assert deleted > 0 and left[0].seq <= 12 and [r.seq for r in left] == list(range(left[0].seq, 30))
    asyncio.run(wal.close())
    wal.release_below(30)
    assert list(tmp_path.glob("*.wal")) == []


def test_past_max_bytes_appends_are_refused_as_back_pressure(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path, max_bytes=2_000)
    wal.open()

    async def run() -> list[int]:
        return [await wal.append(request(n, size=400)) for n in range(4)]

    # ~520 bytes a record: the fourth is taken at 1,557 bytes and crosses the limit
    assert asyncio.run(run()) == [0, 1, 2, 3]
    assert wal.size_bytes > 2_000
    with pytest.raises(WalFull) as full:
        asyncio.run(wal.append(request(9)))
    assert full.value.retry_after_s == 1.0 and full.value.reason == "wal_full"


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs: a disk that fills up for real."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mount = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_refuses_with_503_and_loses_nothing_acknowledged(tiny_disk: Path) -> None:
    wal = WriteAheadLog(tiny_disk, segment_max_age_s=3600)
    wal.open()
    acked: list[int] = []
    refused = 0

    async def run() -> None:
        nonlocal refused
        for n in range(400):  # ~400 kB into 256 kB
            try:
                acked.append(await wal.append(request(n, size=1_000)))
            except WalUnavailable as exc:
                refused += 1
                assert exc.retry_after_s == 1.0 and "No space left" in exc.message

    asyncio.run(run())
    assert refused > 0 and len(acked) > 0
    assert len(acked) + refused == 400
    # what was acknowledged is all there, and only that: a failed write leaves no half record
    assert [r.seq for r in WriteAheadLog(tiny_disk).open()] == acked


def test_the_ledger_holds_each_request_until_the_version_of_its_trace_that_carries_it_ends() -> None:
    ledger = AckLedger()
    a, b, c = ("t", "a"), ("t", "b"), ("t", "c")
    assert ledger.watermark(7) == 7
    ledger.hold([a, b], 3)
    ledger.hold([a], 5)  # a second request with spans of trace a
    ledger.hold([c], 6)
    assert ledger.watermark(9) == 3
    ledger.taken([a, b])  # a's first version carries requests 3 and 5
    ledger.hold([a], 8)  # a late span of a, acknowledged after the flush: the next version's
    ledger.done([b])
    assert ledger.watermark(9) == 3 and len(ledger) == 2
    ledger.done([a])  # a's first version is stored: request 8 is not in it and stays held
    assert ledger.watermark(9) == 6
    ledger.done([c])  # never taken (a JSON-API trace): let go of whole
    assert ledger.watermark(9) == 8
    ledger.taken([a])
    ledger.taken([a])  # taken again before the first one ended: two versions in flight
    ledger.done([a, a])
    assert ledger.watermark(9) == 9 and len(ledger) == 0


def test_versions_ending_out_of_order_only_keep_more_of_the_log() -> None:
    ledger = AckLedger()
    a = ("t", "a")
    ledger.hold([a], 1)
    ledger.taken([a])
    ledger.hold([a], 2)
    ledger.taken([a])
    ledger.done([a])  # whichever version ended, the oldest one's request is let go of
    assert ledger.watermark(9) == 2
    ledger.done([a])
    assert ledger.watermark(9) == 9


def test_a_full_log_disk_answers_503_through_the_server_and_every_200_is_stored(
    tiny_disk: Path, tmp_path: Path
) -> None:
    """The log's disk fills up under real traffic: requests that could not be logged get 503 with
    Retry-After (OTLP exporters retry those), every 200 is stored, and nothing else is."""

    def body(first: int) -> dict:
        records = [
            {"trace_id": f"{n:032x}", "app": "full-disk", "query": "q" * 2_000, "answer": "a" * 2_000}
            for n in range(first, first + 10)
        ]
        return {"traces": records}

    settings = {"wal": {"dir": str(tiny_disk), "segment_max_age_s": 3600, "checkpoint_s": 3600}}
    acked: set[str] = set()
    refused = 0
    with live_server(tmp_path, **settings) as server:
        with server.client() as client:
            for n in range(40):  # ~40 kB a request into 256 kB
                payload = body(1 + n * 10)
                response = client.post(
                    "/api/v1/traces",
                    content=json.dumps(payload),
                    headers={"content-type": "application/json"},
                )
                if response.status_code == 200:
                    acked.update(r["trace_id"] for r in payload["traces"])
                else:
                    assert response.status_code == 503, response.text
                    assert response.headers["retry-after"] == "1"
                    assert response.json()["error"] == "wal_unavailable"
                    refused += 1
        server.flush()
        with server.pipeline.store.engine.connect() as conn:
            stored = set(conn.execute(sa.text("SELECT trace_id FROM traces")).scalars())
        assert refused > 0 and acked
        assert server.metric("ragmon_ingest_rejected_total", reason="wal_unavailable") == refused
    assert stored == acked
