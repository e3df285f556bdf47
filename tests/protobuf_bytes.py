"""Protobuf wire bytes written by hand, for tests that need encodings a protobuf library never writes
(fields split or repeated, unknown fields, long tags)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a message)."""
    return tag(number, 2) + varint(len(payload)) + payload
