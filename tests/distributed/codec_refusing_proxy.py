"""A TCP proxy between Kafka clients and a real broker that answers every produce request carrying zstd
batches with UNSUPPORTED_COMPRESSION_TYPE, as a broker that does not take zstd would; everything else
passes unchanged. tansu takes zstd, so this is how the tests meet such a broker.

The broker must advertise the proxy's address (`.ci/start_kafka.sh`'s KAFKA_ADVERTISED_PORT), or clients
would connect to it directly after their bootstrap. A refused request still reaches the broker, whose
answer is replaced: responses keep their order on the connection (kafka-python matches them to its
requests in order), and the records it stored are what a resend after any lost answer leaves behind,
duplicates that ragmon's consumers drop by span id.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Callable

from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

_PRODUCE = 0  # api key
_UNSUPPORTED_COMPRESSION_TYPE = 76
_ZSTD = 4  # record batch attributes & 0x07
_ATTRIBUTES_AT = 21  # base offset 8, length 4, leader epoch 4, magic 1, crc 4


def _carries_zstd(request: ProduceRequest) -> bool:
    for topic in request.topic_data:
        for partition in topic.partition_data:
            records = bytes(partition.records or b"")
            if len(records) > _ATTRIBUTES_AT + 1:
                (attributes,) = struct.unpack_from(">h", records, _ATTRIBUTES_AT)
                if attributes & 0x07 == _ZSTD:
                    return True
    return False


def _refusal(request: ProduceRequest, version: int, correlation_id: int) -> bytes:
    """The framed answer a zstd-refusing broker gives `request`: every partition refused."""
    response = ProduceResponse[version](
        responses=[
            ProduceResponse.TopicProduceResponse(
                name=topic.name,
                partition_responses=[
                    ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
                        index=partition.index,
                        error_code=_UNSUPPORTED_COMPRESSION_TYPE,
                        base_offset=-1,
                        log_append_time_ms=-1,
                        log_start_offset=-1,
                    )
                    for partition in topic.partition_data
                ],
            )
            for topic in request.topic_data
        ],
        throttle_time_ms=0,
    )
    response.with_header(correlation_id=correlation_id)
    return bytes(response.encode(header=True, framed=True))


class CodecRefusingProxy:
    """Listens on `port` (loopback) and forwards to the broker at `upstream_port`, in a thread of its own;
    `refused` counts the produce requests answered with the refusal."""

    def __init__(self, port: int, upstream_port: int) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stopping = asyncio.Event()  # set on the proxy's loop
        self._thread = threading.Thread(target=self._run, name="codec-refusing-proxy", daemon=True)

    def start(self) -> CodecRefusingProxy:
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the proxy did not start")
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())
        self._loop.close()

    async def _main(self) -> None:
        server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self._started.set()
        await self._stopping.wait()
        server.close()
        connections = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in connections:
            task.cancel()
        await asyncio.gather(*connections, return_exceptions=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            broker_in, broker_out = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_out.close()
            return
        refusals: dict[int, bytes] = {}  # correlation id -> the answer that replaces the broker's

        def request(frame: bytes) -> bytes:
            api_key, version, correlation_id = struct.unpack_from(">hhi", frame, 4)
            if api_key == _PRODUCE:
                produce = ProduceRequest.decode(frame[4:], version=version, header=True)
                if _carries_zstd(produce):
                    refusals[correlation_id] = _refusal(produce, version, correlation_id)
            return frame

        def response(frame: bytes) -> bytes:
            (correlation_id,) = struct.unpack_from(">i", frame, 4)
            refusal = refusals.pop(correlation_id, None)
            if refusal is None:
                return frame
            self.refused += 1
            return refusal

        await asyncio.gather(
            _pump(client_in, broker_out, request),
            _pump(broker_in, client_out, response),
            return_exceptions=True,
        )
        for writer in (client_out, broker_out):
            writer.close()


async def _pump(
    source: asyncio.StreamReader, sink: asyncio.StreamWriter, rewrite: Callable[[bytes], bytes]
) -> None:
    """Copy frames from `source` to `sink`, each as `rewrite` returns it, until `source` ends."""
    try:
        while True:
            sink.write(rewrite(await _read_frame(source)))
            await sink.drain()
    finally:
        with contextlib.suppress(Exception):
            sink.close()


async def _read_frame(source: asyncio.StreamReader) -> bytes:
    """One size-prefixed Kafka frame, its size included (IncompleteReadError at the connection's end)."""
    size = await source.readexactly(4)
    (length,) = struct.unpack(">i", size)
    return size + await source.readexactly(length)
