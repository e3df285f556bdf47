"""Tests of service/ingest/otlp_body.py's `decompress`: a body is one whole compressed stream, no more."""

from __future__ import annotations

import gzip
import zlib

import pytest

from service.errors import DecodeError, PayloadTooLarge
from service.ingest.otlp_body import decompress

BODY = b"\x0a\x10" + bytes(range(16)) * 64


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_whole_stream_decompresses(encoding: str) -> None:
    packed = gzip.compress(BODY) if encoding == "gzip" else zlib.compress(BODY)
    assert decompress(packed, encoding, 1 << 20) == BODY


def test_trailing_data_after_the_gzip_stream_is_refused() -> None:
    with pytest.raises(DecodeError, match=r"not valid gzip: 7 bytes of trailing data"):
        decompress(gzip.compress(BODY) + b"garbage", "gzip", 1 << 20)


def test_a_truncated_gzip_stream_is_named_as_such() -> None:
    packed = gzip.compress(BODY)
    with pytest.raises(DecodeError, match=r"not valid gzip: the compressed stream is truncated"):
        decompress(packed[: len(packed) // 2], "gzip", 1 << 20)


def test_the_size_limit_still_comes_first() -> None:
    with pytest.raises(PayloadTooLarge):
        decompress(gzip.compress(b"\x00" * 10_000), "gzip", 1_000)
