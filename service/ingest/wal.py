"""`WriteAheadLog`: what ingest accepted, on disk before the 200 (embedded mode).

A 200 is a promise (DESIGN.md): each accepted request is appended here and
fsynced before it is answered, so a crash at any moment after the answer loses
nothing: on start, `replay` hands back every record not yet known to be
stored, and the pipeline ingests it again (every stage is idempotent by trace
id, so a record replayed twice is harmless).

* **Group commit.** Appends wait in a queue; one writer writes everything
  queued, fsyncs once and answers all of them. Concurrent requests share an
  fsync instead of paying one each.
* **Records.** `[length u32][crc32 u32][payload]`, payload = `[seq u64][kind u8]
  [header length u16][header JSON][body]`, written with writev (a body is never
  copied). What is logged is the request as it was accepted: an OTLP body as
  it came off the wire (compressed or not), or the JSON API's validated records.
* **Segments.** Records go to `<dir>/<first seq>.wal`, a new file once the
  current one holds `segment_bytes` or has been open `segment_max_age_s`.
  `release_below(seq)` deletes every closed segment whose records are all below
  `seq`, the pipeline's watermark (`ledger.py`: everything below it is stored).
* **Crash safety.** Replay stops at the first record whose length or checksum
  is wrong (a torn write at the end of the last segment) and cuts the file there;
  nothing after a torn record was ever acknowledged, as its fsync never returned.
* **Full disk.** A failed write is cut back off the file and every append of
  that group fails with `WalUnavailable` (503 + Retry-After): nothing is
  answered 200 that is not on disk. Past `max_bytes` of segments, appends fail
  the same way until the pipeline catches up (`WalFull`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from service.errors import QueueFull, RetryableError
from service.lifecycle import cancel_task

__all__ = ["LoggedRequest", "RequestKind", "WalFull", "WalUnavailable", "WriteAheadLog"]

log = logging.getLogger(__name__)

RequestKind = Literal["otlp_traces", "otlp_logs", "traces", "feedback"]
_KINDS: tuple[RequestKind, ...] = get_args(RequestKind)
_FRAME = struct.Struct("<II")  # payload length, crc32 of the payload
_HEAD = struct.Struct("<QBH")  # seq, kind, header length
_SUFFIX = ".wal"
# the data and the file size, not the other metadata: what a reader after a crash needs
_sync = getattr(os, "fdatasync", os.fsync)
_IOV_MAX = 1024  # buffers one writev takes (Linux's IOV_MAX)


def _remaining(buffers: list[bytes], skip: int) -> list[memoryview | bytes]:
    """The buffers from byte `skip` on (after a short write)."""
    if not skip:
        return list(buffers)
    out: list[memoryview | bytes] = []
    for buffer in buffers:
        if skip >= len(buffer):
            skip -= len(buffer)
            continue
        out.append(memoryview(buffer)[skip:] if skip else buffer)
        skip = 0
    return out


class WalUnavailable(RetryableError):
    """The log could not be written (disk full, I/O error): nothing of the request was acknowledged."""

    reason = "wal_unavailable"


class WalFull(QueueFull):
    """The log holds `max_bytes` of records not yet stored: ingest is behind, retry later."""

    reason = "wal_full"


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """One accepted request as the log keeps it; `seq` is set once it is on disk."""

    kind: RequestKind
    tenant: str
    body: bytes
    media_type: str = ""
    encoding: str = ""
    receiver: str = ""
    seq: int = -1

    def parts(self, seq: int) -> tuple[bytes, bytes]:
        """(the payload's head, its body): the frame is written as these two parts, never joined,
        as a body is often hundreds of kB."""
        header = json.dumps(
            {
                "tenant": self.tenant,
                "media_type": self.media_type,
                "encoding": self.encoding,
                "receiver": self.receiver,
            },
            separators=(",", ":"),
        ).encode()
        return _HEAD.pack(seq, _KINDS.index(self.kind), len(header)) + header, self.body

    @classmethod
    def from_payload(cls, payload: bytes) -> LoggedRequest:
        seq, kind, header_length = _HEAD.unpack_from(payload)
        start = _HEAD.size
        header: dict[str, Any] = json.loads(payload[start : start + header_length])
        return cls(
            kind=_KINDS[kind],
            tenant=header["tenant"],
            body=payload[start + header_length :],
            media_type=header.get("media_type", ""),
            encoding=header.get("encoding", ""),
            receiver=header.get("receiver", ""),
            seq=seq,
        )


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int
    last_seq: int
    size: int
    opened_at: float = field(default_factory=time.monotonic)


class WriteAheadLog:
    """The log in `directory`; `open()` before use (it reads what a crash left), `close()` after."""

    def __init__(
        self,
        directory: Path,
        *,
        segment_bytes: int = 16 << 20,
        segment_max_age_s: float = 10.0,
        max_bytes: int = 1 << 30,
        fsync: bool = True,
        retry_after_s: float = 1.0,
    ) -> None:
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.segment_max_age_s = segment_max_age_s
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.retry_after_s = retry_after_s
        self.next_seq = 0
        self.fsyncs = 0  # group commits done, for metrics and tests
        self._closed: list[_Segment] = []
        self._active: _Segment | None = None
        self._fd: int | None = None
        self._queue: list[tuple[tuple[bytes, bytes], int, asyncio.Future[int]]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._writing = False  # a group is being written in the worker thread now
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="wal-writer")
        self._failed = False  # the last group failed: do not append after what it may have left

    # ---------------------------------------------------------------- start and replay

    def open(self) -> list[LoggedRequest]:
        """Read every segment a previous run left (cutting a torn tail off), and return its records in
        order; they stay on disk until `release_below` passes them. Appends go to a new segment."""
        self.directory.mkdir(parents=True, exist_ok=True)
        records: list[LoggedRequest] = []
        paths = sorted(self.directory.glob("*" + _SUFFIX), key=lambda p: int(p.stem))
        for i, path in enumerate(paths):
            found = list(self._read(path, last=i == len(paths) - 1))
            if not found:
                path.unlink(missing_ok=True)
                continue
            records.extend(found)
            self._closed.append(_Segment(path, found[0].seq, found[-1].seq, path.stat().st_size))
        if records:
            self.next_seq = records[-1].seq + 1
        return records

    def _read(self, path: Path, *, last: bool) -> Iterator[LoggedRequest]:
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            if offset + _FRAME.size > len(data):
                break
            length, crc = _FRAME.unpack_from(data, offset)
            payload = data[offset + _FRAME.size : offset + _FRAME.size + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                break
            yield LoggedRequest.from_payload(payload)
            offset += _FRAME.size + length
        if offset < len(data):
            if last:
                log.warning(
                    "write-ahead log %s: cut a torn record at byte %d (never acknowledged)", path, offset
                )
                with path.open("r+b") as handle:
                    handle.truncate(offset)
            else:
                log.error(
                    "write-ahead log %s: unreadable from byte %d; the rest of it is skipped", path, offset
                )

    # ---------------------------------------------------------------- appends

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._closed) + (self._active.size if self._active else 0)

    @property
    def segments(self) -> int:
        return len(self._closed) + (self._active is not None)

    async def append(self, request: LoggedRequest, *, over_max: bool = False) -> int:
        """Log `request`; returns its seq once it is on disk (fsynced). Raises `WalFull` or
        `WalUnavailable`, and then nothing of it counts as logged. `over_max`: past `max_bytes` too
        (a record that lets older ones go: an open trace logged again)."""
        if self.size_bytes >= self.max_bytes and not over_max:
            raise WalFull(
                f"the write-ahead log holds {self.size_bytes} bytes not yet stored (limit {self.max_bytes}); "
                "retry later",
                retry_after_s=self.retry_after_s,
            )
        seq = self.next_seq
        self.next_seq += 1
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append((request.parts(seq), seq, done))
        self._wake.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_loop(), name="wal-writer")
        return await done

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queue = self._queue, []
            if not batch:
                continue
            # segment bookkeeping stays on the event loop; the thread only writes and fsyncs
            try:
                active = self._rotated(batch[0][1])
                fd = self._fd
                assert fd is not None
                self._writing = True
                try:
                    # its own thread: in the shared default executor a group waited behind store
                    # inserts and sampling for ~15 ms (bench/RESULTS.md, write-ahead log)
                    written = await asyncio.get_running_loop().run_in_executor(
                        self._executor, self._write, fd, [parts for parts, _, _ in batch], active.size
                    )
                finally:
                    self._writing = False
            except OSError as exc:
                self._failed = True
                problem = WalUnavailable(
                    f"could not write the write-ahead log ({exc.strerror or exc}); retry later",
                    retry_after_s=self.retry_after_s,
                )
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(problem)
                continue
            self.fsyncs += 1
            active.size += written
            active.last_seq = batch[-1][1]
            for _, seq, done in batch:
                if not done.done():
                    done.set_result(seq)

    def _write(self, fd: int, records: list[tuple[bytes, bytes]], start: int) -> int:
        """Frame, write and sync one group at the end of the segment (in the writer thread: the
        checksums of large bodies run there too, zlib lets go of the GIL); returns bytes written."""
        buffers: list[bytes] = []
        for head, body in records:
            crc = zlib.crc32(body, zlib.crc32(head))
            buffers += (_FRAME.pack(len(head) + len(body), crc), head, body)
        total = sum(map(len, buffers))
        try:
            written = 0
            while written < total:
                views = _remaining(buffers, written)
                written += os.writev(fd, views[:_IOV_MAX])
            if self.fsync:
                _sync(fd)
        except OSError:
            # nothing of this group was acknowledged: cut it off so the file ends on a whole record
            os.ftruncate(fd, start)
            raise
        return total

    def _rotated(self, first_seq: int) -> _Segment:
        active = self._active
        if active is not None and (
            self._failed
            or active.size >= self.segment_bytes
            or time.monotonic() - active.opened_at >= self.segment_max_age_s
        ):
            self._close_active()
            active = None
        self._failed = False  # after a failed write, the next group starts a fresh segment
        if active is None:
            path = self.directory / f"{first_seq:020d}{_SUFFIX}"
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            if self.fsync:  # the new file's name must survive a crash too
                directory = os.open(self.directory, os.O_RDONLY)
                try:
                    os.fsync(directory)
                finally:
                    os.close(directory)
            active = self._active = _Segment(path, first_seq, first_seq - 1, 0)
        return active

    def _close_active(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._active is not None:
            if self._active.size:
                self._closed.append(self._active)
            else:
                self._active.path.unlink(missing_ok=True)
            self._active = None

    # ---------------------------------------------------------------- truncation

    def release_below(self, watermark: int) -> int:
        """Delete the segments whose records all have seq < `watermark` (they are stored); the open
        segment is closed first when it is old enough and wholly below. Returns segments deleted."""
        active = self._active
        if (
            active is not None
            and not self._queue
            and not self._writing
            and active.last_seq < watermark
            and time.monotonic() - active.opened_at >= self.segment_max_age_s
        ):
            self._close_active()
        keep: list[_Segment] = []
        deleted = 0
        for segment in self._closed:
            if segment.last_seq < watermark:
                segment.path.unlink(missing_ok=True)
                deleted += 1
            else:
                keep.append(segment)
        self._closed = keep
        return deleted

    async def close(self) -> None:
        """Finish the appends queued, then close the file. Safe twice and before `open`."""
        if self._writer is not None:
            while self._queue or self._writing:
                await asyncio.sleep(0.001)
            await cancel_task(self._writer)
            self._writer = None
        self._executor.shutdown(wait=True)
        self._close_active()
