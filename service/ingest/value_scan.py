"""Which protobuf spans screening must read the attributes of: those holding a number out of range.

Screening keeps a span as its wire bytes and leaves converting its attributes
to the builder (`otlp_protobuf.py`: converting was ~70 % of decoding). But the OTLP
answer must say which values were dropped, and it is sent before the trace is
built. Reading every span's attributes on the request's path cost ~17 us a
trace (+35 % of screening), so one regular expression looks at the body's
bytes instead (~4 us a trace, bench in the commit), and only a span it
matches is read (`otlp._repaired`).

It matches, on the wire, an attribute value (a KeyValue's `value`, field 2:
tag 0x12, then the AnyValue's length) that no count, score, cost or duration
in range is encoded as:

* a double (AnyValue field 4, tag 0x21, 8 bytes little-endian) whose top byte
  is 0x41 or more: negative (sign bit), at least 2**17, infinite or NaN;
* an integer (field 3, tag 0x18) of 6 or more varint bytes: at least 2**35,
  or negative (a negative int64 takes 10).

A matched span is decoded with the rules of `otlp.py`, so a match that is not
a problem (a negative score, a large custom number) costs one decode and
changes nothing. What this does not see, the builder still drops and counts
when the trace is built (a count sent as the text "1e30", a boolean score):
those are counted and logged, but not named in the answer.
"""

from __future__ import annotations

import re

__all__ = ["suspect_values"]

_SUSPECT = re.compile(
    rb"\x12(?:"
    rb"\x09\x21[\x00-\xff]{7}[\x41-\xff]"  # a double: negative, >= 2**17, infinite or NaN
    rb"|[\x07\x09-\x0b]\x18"  # an integer of 6, 8, 9 or 10 varint bytes
    # 7 varint bytes (length 8) also starts a span id (field 2, 8 bytes): match the varint's shape
    rb"|\x08\x18[\x80-\xff]{6}[\x00-\x7f]"
    rb")",
    re.DOTALL,
)


def suspect_values(raw: bytes) -> bool:
    """Whether `raw` (a body, or one span's bytes) may hold a number out of range (see the module
    docstring); False means it holds none."""
    return _SUSPECT.search(raw) is not None
