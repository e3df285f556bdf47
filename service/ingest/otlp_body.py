"""An OTLP trace body as it comes off the wire: decompressed within its limit, then decoded.

Separate from the decoders because it picks between them (`otlp_json.py`,
`otlp_protobuf.py`), which both build on `otlp.py`: here, above all three,
no import runs in a circle. `decompress` serves the log and metrics
receivers too (`otlp_logs.py`, `otlp_metrics.py`).
"""

from __future__ import annotations

import zlib

from service.errors import DecodeError, PayloadTooLarge, UnsupportedMediaType
from service.ingest.decoded import DecodedBatch
from service.ingest.otlp_json import decode_json
from service.ingest.otlp_protobuf import screen_protobuf

__all__ = ["decode_body", "decompress"]


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip/deflate/identity body → bytes, refusing more than `limit` decompressed bytes (zip bombs)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; use gzip or identity")
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise DecodeError(f"body is not valid {encoding}: {exc}") from exc
    if len(out) > limit or inflater.unconsumed_tail:
        raise PayloadTooLarge(f"decompressed body is over the limit of {limit} bytes")
    # checked here, not left to the protobuf/JSON layer: its error would name the wrong culprit
    if not inflater.eof:
        raise DecodeError(f"body is not valid {encoding}: the compressed stream is truncated")
    if inflater.unused_data:
        raise DecodeError(
            f"body is not valid {encoding}: {len(inflater.unused_data)} bytes of trailing data after its end"
        )
    return out


def decode_body(body: bytes, *, json_body: bool, encoding: str, tenant: str, limit: int) -> DecodedBatch:
    """An OTLP body as it came off the wire (maybe compressed) → `DecodedBatch`.

    The one function the receivers hand to `IngestPool`: module-level and with
    plain arguments, so a worker process can run it."""
    plain = decompress(body, encoding, limit)
    return decode_json(plain, tenant) if json_body else screen_protobuf(plain, tenant)
