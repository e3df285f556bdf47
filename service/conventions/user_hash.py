"""`user_hash`: the user a trace keeps, the SHA-256 of the app's user id (`RagTrace.user_hash`), never the id.

With redaction on, ingest replaces every user id a span carries by its hash before anything keeps the
span (service/ingest/span_redaction.py), written `[REDACTED:user:<hash>]`: the 64 hex digits as the
letters a-p, so that no redaction kind ever matches inside it. `user_hash` reads such a value as the
hash it carries, so a trace built from redacted spans keeps the user hash of the raw spans.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["hashed_user_id", "user_hash"]

_HASHED = re.compile(r"\[REDACTED:user:([a-p]{64})\]")
_TO_LETTERS = str.maketrans("0123456789abcdef", "abcdefghijklmnop")
_TO_HEX = str.maketrans("abcdefghijklmnop", "0123456789abcdef")


def user_hash(user: str) -> str:
    """The SHA-256 (hex) of a user id; the hash itself for a user id that `hashed_user_id` wrote."""
    hashed = _HASHED.fullmatch(user)
    if hashed is not None:
        return hashed.group(1).translate(_TO_HEX)
    return hashlib.sha256(user.encode()).hexdigest()


def hashed_user_id(user: str) -> str:
    """A user id in its place in a span with redaction on: its hash, which `user_hash` reads back.
    One written already is returned as it is."""
    if _HASHED.fullmatch(user) is not None:
        return user
    return f"[REDACTED:user:{user_hash(user).translate(_TO_LETTERS)}]"
